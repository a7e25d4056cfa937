"""ViT and ResNet written with luminal's modules against transformers' ViTModel and ResNetModel (torchvision's
architecture: torchvision itself is not installed) on the same random weights, on every backend."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import luminal as lm
from helpers import Backend
from luminal.nn.resnet import BasicBlock, Bottleneck, ResNet, resnet18, resnet50, resnet_state_dict_from_hf
from luminal.nn.vit import ViTConfig, ViTModel

transformers = pytest.importorskip("transformers")


def randomize(model: torch.nn.Module, gen: np.random.Generator, scale: float = 0.3) -> dict:
    """Gives every float tensor of a torch model seeded random values (norm weights near 1, variances positive)
    and returns its state dict as numpy arrays."""
    sd = model.state_dict()
    for k, v in sd.items():
        if not v.is_floating_point():
            continue
        shape = tuple(v.shape)
        if k.endswith("running_var"):
            new = gen.uniform(0.5, 2.0, shape)
        elif re.search(r"(norm|bn\d?|normalization|layernorm\w*)\.weight$", k):
            new = 1 + 0.2 * gen.standard_normal(shape)
        else:
            new = scale * gen.standard_normal(shape)
        v.copy_(torch.from_numpy(new.astype(np.float32)))
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def assert_close(got, want, what, rel=1e-4):
    """float32 parity, relative to the output's scale (many summed terms: elementwise relative error is noise)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, torch gives {want.shape}"
    err, scale = np.abs(got - want).max(), np.abs(want).max()
    assert err <= rel * scale, f"{what}: max abs difference {err:.3g} against an output scale {scale:.3g}"


def run_model(model, build, backend, x):
    """Records `build(model, input tensor)` -> outputs, compiles for the backend, runs on x; numpy results."""
    g = model.graph
    inp = g.tensor(x.shape, name="x").set(x)
    outs = [o.output() for o in build(model, inp)]
    g.compile(lm.GenericCompiler(), *backend.compilers("float32"))
    g.execute()
    return [o.numpy() for o in outs]


CPU = Backend("cpu", lambda dtype: [lm.CPUCompiler()])


# ---- ViT ------------------------------------------------------------------------------------------------------------
TINY_VIT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
                patch_size=8)


@pytest.fixture(scope="module")
def tiny_vit():
    torch.manual_seed(0)
    ref = transformers.ViTModel(transformers.ViTConfig(**TINY_VIT)).eval()
    sd = randomize(ref, np.random.default_rng(1))
    return ref, sd


def test_vit_matches_transformers(tiny_vit, backend, rng):
    ref, sd = tiny_vit
    x = rng.data((2, 3, 32, 32)).astype(np.float32)
    model = ViTModel(ViTConfig.from_hf(ref.config)).load_state_dict(sd)
    hidden, pooled = run_model(model, lambda m, t: m(t), backend, x)
    with torch.no_grad():
        want = ref(torch.from_numpy(x))
    assert_close(hidden, want.last_hidden_state.numpy(), "last_hidden_state")
    assert_close(pooled, want.pooler_output.numpy(), "pooler_output")


def test_vit_loads_the_hub_layout(tiny_vit, rng):
    """Checkpoints on the Hub name layers `encoder.layer.N.attention.attention.query`; they load renamed."""
    ref, sd = tiny_vit
    old = {}
    for k, v in sd.items():
        k = re.sub(r"^layers\.(\d+)\.", r"encoder.layer.\1.", k)
        k = k.replace("attention.q_proj", "attention.attention.query").replace(
            "attention.k_proj", "attention.attention.key").replace("attention.v_proj", "attention.attention.value")
        k = k.replace("attention.o_proj", "attention.output.dense").replace("mlp.fc1", "intermediate.dense")
        k = k.replace("mlp.fc2", "output.dense")
        old["vit." + k] = v
    assert "vit.encoder.layer.1.attention.attention.query.weight" in old
    x = rng.data((1, 3, 32, 32)).astype(np.float32)
    model = ViTModel(ViTConfig.from_hf(ref.config), add_pooling_layer=False)
    model.load_state_dict({k: v for k, v in old.items() if "pooler" not in k})
    hidden, = run_model(model, lambda m, t: m(t)[:1], CPU, x)
    with torch.no_grad():
        want = ref(torch.from_numpy(x)).last_hidden_state.numpy()
    assert_close(hidden, want, "last_hidden_state")


def test_vit_bad_inputs():
    c = ViTConfig(**TINY_VIT)
    model = ViTModel(c)
    g = model.graph
    with pytest.raises(ValueError, match=r"32 x 32"):
        model(g.tensor((1, 3, 48, 48)))
    with pytest.raises(ValueError, match=r"\(batch, 3, height, width\).*\(1, 1, 32, 32\)"):
        model(g.tensor((1, 1, 32, 32)))
    with pytest.raises(ValueError, match="hidden_size 64 is not a multiple of num_attention_heads 5"):
        ViTModel(ViTConfig(**{**TINY_VIT, "num_attention_heads": 5}))
    sd = {k: np.zeros(s, np.float32) for k, s in model.state_dict_shapes().items()}
    sd["layers.0.mlp.fc1.weight"] = np.zeros((64, 64), np.float32)
    with pytest.raises(ValueError, match=r"layers\.0\.mlp\.fc1\.weight: expected \(128, 64\), got \(64, 64\)"):
        model.load_state_dict(sd)


# ---- ResNet ---------------------------------------------------------------------------------------------------------
def hf_resnet(layer_type: str, width: int, depths: list[int], num_labels: int, seed: int):
    """transformers' ResNetForImageClassification shaped like torchvision's ResNet of `width` (its stem's
    channels), with seeded random weights and batch-norm statistics; returns it and its weights renamed to
    torchvision's names."""
    expansion = 4 if layer_type == "bottleneck" else 1
    cfg = transformers.ResNetConfig(embedding_size=width, hidden_sizes=[width * 2 ** i * expansion for i in
                                                                         range(len(depths))],
                                    depths=depths, layer_type=layer_type, num_labels=num_labels)
    assert not cfg.downsample_in_bottleneck, "torchvision strides in the 3x3 conv (v1.5)"
    torch.manual_seed(seed)
    ref = transformers.ResNetForImageClassification(cfg).eval()
    sd = randomize(ref, np.random.default_rng(seed), scale=0.5)
    return ref, resnet_state_dict_from_hf(sd)


@pytest.mark.parametrize("block", ["bottleneck", "basic"])
def test_resnet_matches_transformers(block, backend, rng):
    depths = [1, 2, 1, 1]
    ref, sd = hf_resnet(block, 8, depths, 10, seed=2)
    assert "layer2.0.downsample.0.weight" in sd and "layer2.1.conv2.weight" in sd and "fc.weight" in sd
    model = ResNet(Bottleneck if block == "bottleneck" else BasicBlock, depths, num_classes=10, width=8)
    model.load_state_dict(sd)
    x = rng.data((2, 3, 48, 48)).astype(np.float32)  # odd sizes from layer3 on: 24, 12, 6, 3, 2
    logits, feats = run_model(model, lambda m, t: [m(t), m.features(t)], backend, x)
    with torch.no_grad():
        want = ref(torch.from_numpy(x))
        pooled = ref.resnet(torch.from_numpy(x)).pooler_output.flatten(1)
    assert_close(feats, pooled.numpy(), "pooled features")
    assert_close(logits, want.logits.numpy(), "logits")


def test_resnet50_names_and_shapes():
    """resnet50() has torchvision's state: names and shapes (as torchvision's resnet50().state_dict() lists them)."""
    shapes = resnet50().state_dict_shapes()
    # 53 conv weights, 53 batch norms x (weight, bias, running_mean, running_var), fc weight and bias: torchvision's
    # 320 less its 53 num_batches_tracked (accepted in a state dict and dropped).
    assert len(shapes) == 267
    assert shapes["conv1.weight"] == (64, 3, 7, 7) and shapes["bn1.running_var"] == (64,)
    assert shapes["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert shapes["layer2.0.conv2.weight"] == (128, 128, 3, 3)
    assert shapes["layer4.2.conv3.weight"] == (2048, 512, 1, 1)
    assert shapes["layer4.2.bn3.weight"] == (2048,)
    assert shapes["fc.weight"] == (1000, 2048)
    assert "layer1.1.downsample.0.weight" not in shapes


def test_resnet_bad_inputs():
    model = resnet18(num_classes=10)
    with pytest.raises(ValueError, match=r"\(batch, 3, height, width\).*\(1, 1, 64, 64\)"):
        model(model.graph.tensor((1, 1, 64, 64)))
    with pytest.raises(ValueError, match="unknown tensor name 'pooler.dense.weight'"):
        resnet_state_dict_from_hf({"pooler.dense.weight": np.zeros(1)})
