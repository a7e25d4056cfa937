"""ResNet (He et al.), torchvision's architecture and state-dict names: `conv1`, `bn1`, `layer1.0.conv1`, ...,
`layer1.0.downsample.0` / `.1`, `fc`. Bottleneck blocks stride in their 3x3 convolution (ResNet v1.5, as
torchvision and transformers' ResNetModel do). `resnet_state_dict_from_hf` renames a transformers checkpoint
(microsoft/resnet-50) to these names.
"""
from __future__ import annotations

import re

from ..graph import Graph
from ..tensor import Tensor
from .layers import AdaptiveAvgPool2d, BatchNorm2d, Conv2d, MaxPool2d
from .module import Linear, Module, Sequential


class BasicBlock(Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, graph=None):
        super().__init__(graph)
        g = self.graph
        self.conv1 = Conv2d(inplanes, planes, 3, stride, 1, bias=False, graph=g)
        self.bn1 = BatchNorm2d(planes, graph=g)
        self.conv2 = Conv2d(planes, planes, 3, 1, 1, bias=False, graph=g)
        self.bn2 = BatchNorm2d(planes, graph=g)
        self.downsample = _downsample(inplanes, planes * self.expansion, stride, g)

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn1(self.conv1(x)).relu()
        out = self.bn2(self.conv2(out))
        return (out + (x if self.downsample is None else self.downsample(x))).relu()


class Bottleneck(Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, graph=None):
        super().__init__(graph)
        g = self.graph
        self.conv1 = Conv2d(inplanes, planes, 1, bias=False, graph=g)
        self.bn1 = BatchNorm2d(planes, graph=g)
        self.conv2 = Conv2d(planes, planes, 3, stride, 1, bias=False, graph=g)  # v1.5: the stride is here
        self.bn2 = BatchNorm2d(planes, graph=g)
        self.conv3 = Conv2d(planes, planes * self.expansion, 1, bias=False, graph=g)
        self.bn3 = BatchNorm2d(planes * self.expansion, graph=g)
        self.downsample = _downsample(inplanes, planes * self.expansion, stride, g)

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn1(self.conv1(x)).relu()
        out = self.bn2(self.conv2(out)).relu()
        out = self.bn3(self.conv3(out))
        return (out + (x if self.downsample is None else self.downsample(x))).relu()


def _downsample(inplanes: int, outplanes: int, stride: int, graph) -> Sequential | None:
    """The shortcut's projection where the block changes the shape (a strided 1x1 conv and a batch norm)."""
    if stride == 1 and inplanes == outplanes:
        return None
    return Sequential(Conv2d(inplanes, outplanes, 1, stride, bias=False, graph=graph),
                      BatchNorm2d(outplanes, graph=graph), graph=graph)


class ResNet(Module):
    """torchvision.models.ResNet: `forward(x)` maps (batch, 3, H, W) images to (batch, num_classes) logits;
    `features(x)` stops before the classifier, at the pooled (batch, 512 * expansion) features."""

    def __init__(self, block: type, layers: list[int], num_classes: int = 1000, width: int = 64,
                 graph: Graph | None = None):
        super().__init__(graph if graph is not None else Graph())
        g = self.graph
        self.inplanes = width
        self.conv1 = Conv2d(3, width, 7, 2, 3, bias=False, graph=g)
        self.bn1 = BatchNorm2d(width, graph=g)
        self.maxpool = MaxPool2d(3, 2, 1)
        for i, n in enumerate(layers):
            setattr(self, f"layer{i + 1}", self._make_layer(block, width * 2 ** i, n, 1 if i == 0 else 2))
        self.avgpool = AdaptiveAvgPool2d((1, 1))
        self.fc = Linear(width * 2 ** (len(layers) - 1) * block.expansion, num_classes, bias=True, graph=g)
        self.depth = len(layers)

    def _make_layer(self, block, planes: int, blocks: int, stride: int) -> Sequential:
        mods = [block(self.inplanes, planes, stride, self.graph)]
        self.inplanes = planes * block.expansion
        mods += [block(self.inplanes, planes, 1, self.graph) for _ in range(1, blocks)]
        return Sequential(*mods, graph=self.graph)

    def features(self, x: Tensor) -> Tensor:
        if x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(f"ResNet: expected images of shape (batch, 3, height, width), got {tuple(x.shape)}")
        x = self.maxpool(self.bn1(self.conv1(x)).relu())
        for i in range(self.depth):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.avgpool(x).flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


def resnet18(num_classes: int = 1000, graph=None) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes, graph=graph)


def resnet34(num_classes: int = 1000, graph=None) -> ResNet:
    return ResNet(BasicBlock, [3, 4, 6, 3], num_classes, graph=graph)


def resnet50(num_classes: int = 1000, graph=None) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes, graph=graph)


def resnet101(num_classes: int = 1000, graph=None) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 23, 3], num_classes, graph=graph)


def resnet152(num_classes: int = 1000, graph=None) -> ResNet:
    return ResNet(Bottleneck, [3, 8, 36, 3], num_classes, graph=graph)


# transformers' ResNetForImageClassification / ResNetModel names -> torchvision's.
_HF_NAMES = [
    (r"^embedder\.embedder\.convolution\.", "conv1."),
    (r"^embedder\.embedder\.normalization\.", "bn1."),
    (r"^encoder\.stages\.(\d+)\.layers\.(\d+)\.shortcut\.convolution\.",
     lambda m: f"layer{int(m[1]) + 1}.{m[2]}.downsample.0."),
    (r"^encoder\.stages\.(\d+)\.layers\.(\d+)\.shortcut\.normalization\.",
     lambda m: f"layer{int(m[1]) + 1}.{m[2]}.downsample.1."),
    (r"^encoder\.stages\.(\d+)\.layers\.(\d+)\.layer\.(\d+)\.convolution\.",
     lambda m: f"layer{int(m[1]) + 1}.{m[2]}.conv{int(m[3]) + 1}."),
    (r"^encoder\.stages\.(\d+)\.layers\.(\d+)\.layer\.(\d+)\.normalization\.",
     lambda m: f"layer{int(m[1]) + 1}.{m[2]}.bn{int(m[3]) + 1}."),
    (r"^classifier\.1\.", "fc."),
]


def resnet_state_dict_from_hf(weights: dict) -> dict:
    """Renames a transformers ResNet state dict (with or without the `resnet.` prefix) to torchvision's names."""
    out = {}
    for k, v in weights.items():
        k = re.sub(r"^resnet\.", "", k)
        for pat, rep in _HF_NAMES:
            k, n = re.subn(pat, rep, k)
            if n:
                break
        else:
            raise ValueError(f"resnet_state_dict_from_hf: unknown tensor name {k!r}")
        out[k] = v
    return out
