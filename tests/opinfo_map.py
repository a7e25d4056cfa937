"""Which of PyTorch's OpInfo ops count, and how to call luminal for each (used by test_opinfo.py).

M, the denominator: the entries of torch's op_db (name plus variant_test_name, each counted once) that
`excluded()` keeps. It drops what a dense inference compiler's op surface does not cover:
- families outside the core tensor API: fft, linalg, sparse, special, masked (prototype), signal windows, float8
  matmuls, CUDA jiterators, private ops (torch.ops.aten.*, underscore names);
- random ops (the result depends on an RNG stream) and ops reading uninitialised memory (empty*);
- in-place-only and storage ops (resize_, zero_, as_strided*), backward kernels;
- complex numbers (view_as_real, conj, angle, stft, ...) and conversions to dtypes luminal lacks (double, short,
  char), entries with no CPU dtype luminal can hold (complex, float8 or CUDA-only);
- factorisations and solvers spelled outside torch.linalg (qr, svd, lu, cholesky, ...);
- ops returning a Python value (item, equal, allclose: they need the data while the graph is built).
Everything else counts, including what luminal cannot express today (nonzero, unique: data-dependent shapes),
reported as missing.

How luminal is called: `resolve(op)` takes an explicit `ENTRIES` row where torch's name or argument order differs,
else luminal's own spelling of torch's name: for `nn.functional.X` the function `luminal.nn.functional.X`, else the
Tensor method `X`; for `X` the Tensor method `X` (a property such as `T` is read), else the function `luminal.X`;
then the same for the OpInfo's aliases, then the Python operator luminal spells it as (`add` is `+`). So coverage
rises by itself as ops land under torch's names.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import luminal as lm
import luminal.nn.functional  # noqa: F401 - lm.nn.functional for torch.nn.functional names

# ---- the denominator ------------------------------------------------------------------------------------------------
OUT_OF_SCOPE_PREFIXES = {
    "fft.": "fft family",
    "linalg.": "linalg family",
    "sparse.": "sparse tensors",
    "special.": "torch.special family",
    "masked.": "masked reductions (prototype)",
    "signal.": "window functions",
    "jiterator_": "CUDA jiterator",
    "torch.ops.aten.": "private aten kernel",
    "torch._scaled_mm": "float8 matmul",
}

_GROUPS = {
    "random (result depends on an RNG stream)": """
        cauchy exponential geometric log_normal normal uniform bernoulli multinomial randn randn_like rand_like
        randint randint_like nn.functional.dropout nn.functional.dropout2d nn.functional.dropout3d
        nn.functional.alpha_dropout nn.functional.feature_alpha_dropout nn.functional.rrelu
        nn.functional.fractional_max_pool2d nn.functional.fractional_max_pool3d svd_lowrank pca_lowrank""",
    "uninitialised memory": "empty empty_like new_empty new_empty_strided empty_strided empty_permuted",
    "in-place only or storage ops": "resize_ resize_as_ zero_ as_strided as_strided_copy as_strided_scatter to_sparse",
    "backward kernel": """_softmax_backward_data max_pool2d_with_indices_backward native_dropout_backward
        nn.functional.max_unpool1d.grad nn.functional.max_unpool2d.grad nn.functional.max_unpool3d.grad""",
    "complex numbers": """view_as_real view_as_complex complex polar conj conj_physical resolve_conj resolve_neg real
        imag angle H mH cdouble cfloat chalf isreal vdot nn.functional.silu.complex istft stft""",
    "dtype luminal lacks (float64, int16, int8)": "double short char",
    "factorisation or solver (linalg outside torch.linalg)": """cholesky cholesky_inverse cholesky_solve geqrf
        ormqr lu lu_solve lu_unpack qr svd triangular_solve pinverse matrix_exp logdet norm.nuc""",
    "returns a Python value (needs the data while building)": "item equal allclose",
}
EXCLUDED = {name: why for why, names in _GROUPS.items() for name in names.split()}

# The dtypes a sample may be made in for luminal, in order of preference (luminal has no 64-bit types: int64
# samples go in as int32, checked to fit).
PRIMARY_DTYPES = ("float32", "int32", "int64", "bool", "uint8")


def key(op) -> str:
    """An OpInfo entry's id: name, or name.variant."""
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def excluded(op) -> str | None:
    """Why an OpInfo entry is outside M, or None when it counts."""
    for prefix, why in OUT_OF_SCOPE_PREFIXES.items():
        if op.name.startswith(prefix):
            return why
    for name in (key(op), op.name):
        if name in EXCLUDED:
            return EXCLUDED[name]
    if op.name.startswith("_") and not op.name.startswith("__"):
        return "private torch op (underscore name)"
    if primary_dtype(op) is None:
        return "no CPU dtype luminal has (complex, float8 or CUDA-only)"
    return None


def primary_dtype(op) -> str | None:
    """The dtype the op's samples are made in for the float32/exact comparison: float32 where the op takes it."""
    have = {str(d).replace("torch.", "") for d in op.supported_dtypes("cpu")}
    return next((d for d in PRIMARY_DTYPES if d in have), None)


# ---- calling luminal ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Entry:
    """An explicit row: call luminal's `target` (a torch-style name, found as for an unlisted op, or only as a
    Tensor method or only as a function per `kind`) after `adapt(input, args, kwargs) -> (input, args, kwargs)`."""

    target: str
    adapt: Callable | None = None
    kind: str = "auto"  # "auto", "method", "function"


def _swap_first(input, args, kwargs):
    return args[0], (input, *args[1:]), kwargs


ENTRIES: dict[str, Entry] = {
    # torch.max(a, b) / torch.min(a, b) are the binary forms.
    "max.binary": Entry("maximum"),
    "min.binary": Entry("minimum"),
    "__rdiv__": Entry("__rtruediv__", kind="method"),
    # OpInfo wraps these with the tensor first; torch's own argument order differs.
    "where": Entry("where", lambda x, a, k: (a[0], (x, *a[1:]), k), kind="function"),
    "nn.functional.embedding": Entry("nn.functional.embedding", _swap_first, kind="function"),
    "nn.functional.embedding_bag": Entry("nn.functional.embedding_bag", _swap_first, kind="function"),
    "polygamma": Entry("polygamma", lambda x, a, k: (a[0], (x, *a[1:]), k), kind="function"),
    "einsum": Entry("einsum", lambda x, a, k: (a[0], (*x,), k), kind="function"),
}


# luminal spells these torch names as Python operators; tried only while luminal has no method of torch's name.
OPERATOR_SPELLINGS = {
    "add": "__add__", "sub": "__sub__", "mul": "__mul__", "div": "__truediv__", "true_divide": "__truediv__",
    "floor_divide": "__floordiv__", "neg": "__neg__", "positive": "__pos__", "bitwise_not": "__invert__",
    "bitwise_and": "__and__", "bitwise_or": "__or__", "bitwise_xor": "__xor__",
}


def _lookup(name: str, kind: str, input_is_tensor: bool):
    """luminal's callable for a torch name, as (callable taking (input, *args, **kwargs), description) or None."""
    short = name[len("nn.functional."):] if name.startswith("nn.functional.") else name
    if "." in short:
        return None
    fn_home = lm.nn.functional if name.startswith("nn.functional.") else lm
    fn = getattr(fn_home, short, None)
    if fn is not None and (isinstance(fn, type) or not callable(fn)):
        fn = None  # luminal.float32, luminal.Tensor, ...: not ops
    attr = getattr(lm.Tensor, short, None) if input_is_tensor else None
    method = None
    if isinstance(attr, property):
        method = (lambda x, *a, **k: getattr(x, short)), f"Tensor.{short} (property)"
    elif callable(attr):
        method = (lambda x, *a, **k: getattr(x, short)(*a, **k)), f"Tensor.{short}"
    func = (fn, f"{fn_home.__name__}.{short}") if fn is not None else None
    if kind == "method":
        return method
    if kind == "function":
        return func
    # torch.nn.functional's names are functions first; torch.X is Tensor.X for a tensor input (the method is the
    # torch-compatible spelling in luminal), else luminal's function (cat, stack: lists of tensors).
    order = (func, method) if name.startswith("nn.functional.") else (method, func)
    return next((c for c in order if c is not None), None)


def resolve(op, input_is_tensor: bool = True):
    """(call, description) for an OpInfo entry, or None when luminal has nothing by its names.

    `call(input, args, kwargs)` takes luminal values."""
    entry = ENTRIES.get(key(op)) or ENTRIES.get(op.name)
    if entry is not None:
        found = _lookup(entry.target, entry.kind, input_is_tensor)
        if found is None:
            return None
        fn, desc = found
        adapt = entry.adapt or (lambda x, a, k: (x, a, k))

        def call(x, a, k):
            x, a, k = adapt(x, a, k)
            return fn(x, *a, **k)

        return call, desc
    names = [op.name] + [a.name for a in op.aliases if "." not in a.name or a.name.startswith("nn.functional.")]
    names += [OPERATOR_SPELLINGS[n] for n in names if n in OPERATOR_SPELLINGS]
    for name in names:
        found = _lookup(name, "auto", input_is_tensor)
        if found is not None:
            fn, desc = found
            return (lambda x, a, k: fn(x, *a, **k)), desc
    return None


def has_luminal(op) -> bool:
    return resolve(op, True) is not None or resolve(op, False) is not None


# ---- tolerances and known failures ----------------------------------------------------------------------------------
# Entries whose result is a sum of products of their inputs: in float16/bfloat16 their tolerance grows with the sums
# of |products| (where terms cancel, rounding the products or partial sums to the dtype leaves that much error).
SUM_OF_PRODUCTS = set("""
    matmul __rmatmul__ mm bmm mv dot inner outer addmm addmm.decomposed addmv addr addbmm baddbmm tensordot einsum
    kron nn.functional.linear nn.functional.bilinear nn.functional.conv1d nn.functional.conv2d nn.functional.conv3d
    nn.functional.conv_transpose1d nn.functional.conv_transpose2d nn.functional.conv_transpose3d""".split())

# Known failures: entry key -> [(selector, match, reason)]. selector: "*", a dtype, a backend name or "backend:dtype";
# match: "*" (every sample), a sample index (OpInfo's order, seeded; per torch version) or a piece of the failure's
# message. test_opinfo passes when every failing sample is listed; test_known_failures_current fails for a row that no
# sample fails any more. An entry with failing samples of its first dtype counts as supported only if at least 90%
# of them pass and each failure is listed. `python tests/test_opinfo.py` prints the unlisted failures as rows.
LOW_POW = "pow is exp2(y * log2(x)) with log2(x) rounded to bfloat16: results past 1e5 are off by up to ~8%"
DATA_SHAPE = "the result's shape would depend on the data (a static graph can't)"
KNOWN_FAILURES: dict[str, list[tuple[str, Any, str]]] = {
    "repeat_interleave": [("*", "a tensor of counts makes", DATA_SHAPE)],
    "nn.functional.one_hot": [("*", "give num_classes", DATA_SHAPE)],
    "nn.functional.soft_margin_loss": [("float16", "inf location mismatch", "torch's float16 kernel overflows "
                                        "exp(-y * x) to inf; luminal's stable softplus stays finite")],
    **{f"polygamma.polygamma_n_{n}": [("float16", "inf location mismatch", "the result overflows float16 (torch's "
                                                                             "reference is its float32 result)")]
       for n in (1, 2, 3, 4)},
    "pow": [("bfloat16", 3, LOW_POW), ("bfloat16", 5, LOW_POW)],
    "__rpow__": [("bfloat16", 5, LOW_POW)],
}
