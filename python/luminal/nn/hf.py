"""Hugging Face conventions the models share: config.json as a dict, and the activations ACT2FN names."""
from __future__ import annotations

import json
import os

from ..tensor import Tensor


def config_dict(config) -> dict:
    """A Hugging Face config as a dict: from a config.json path (or a directory holding one), a dict, or a
    transformers config object."""
    if isinstance(config, (str, os.PathLike)):
        path = os.path.join(config, "config.json") if os.path.isdir(config) else config
        with open(path) as f:
            return json.load(f)
    return config if isinstance(config, dict) else config.to_dict()


def dataclass_from(cls, config: dict):
    """`cls` (a dataclass) from the keys of `config` it has fields for; the others are ignored."""
    names = cls.__dataclass_fields__
    return cls(**{k: v for k, v in config.items() if k in names})


ACTIVATIONS = {
    "gelu": lambda x: x.gelu(),
    "gelu_new": lambda x: x.gelu("tanh"),
    "gelu_pytorch_tanh": lambda x: x.gelu("tanh"),
    "gelu_fast": lambda x: x.gelu("tanh"),
    "relu": lambda x: x.relu(),
    "tanh": lambda x: x.tanh(),
    "silu": lambda x: x.silu(),
    "swish": lambda x: x.silu(),
}


def activation(x: Tensor, name: str) -> Tensor:
    """The activation transformers' ACT2FN calls `name`."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r} (supported: {', '.join(sorted(ACTIVATIONS))})")
    return ACTIVATIONS[name](x)
