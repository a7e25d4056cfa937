"""GGUF model files (versions 2 and 3), parsed by the `gguf` package's ``GGUFReader`` (maintained with llama.cpp).

Opening a file reads its header, metadata and tensor table over a memory map; no tensor data is read until
asked for::

    g = GGUFFile("model.gguf")
    g.metadata["general.architecture"]          # 'llama'
    t = g.tensors["blk.0.attn_q.weight"]
    t.shape, t.type_name                         # (576, 576), 'Q4_1'  (numpy order)
    t.raw()                                      # zero-copy uint8 view of its bytes
    g.dequantize("blk.0.attn_q.weight")          # float32 ndarray of t.shape
    g.quant_blocks("blk.0.attn_q.weight")        # {'d':..., 'm':..., 'qs':...} views

What is ours on top of the reader: safety on files from strangers (every read is bounds-checked, counts are
checked against the file's size before anything loops over them, tensor data must lie inside the file without
overlapping), so every problem raises :class:`GGUFError` (a ``ValueError``) whose message starts with the file's
path and names the entry; metadata as plain Python values (large arrays such as a vocabulary decoded on first
use); the ggml types' dequantisation: zero-copy block views for Q8_0/Q4_0/Q4_1 (which have kernels), and
``gguf.quants`` for the k-quants and Q5_0/Q5_1 (dequantised to float32 at load); llama hyper-parameters.
"""

from __future__ import annotations

import errno
import functools
import math
import mmap
import os
import struct
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any, Iterator

import numpy as np

__all__ = [
    "GGUFError",
    "GGUFFileNotFoundError",
    "GGUFFile",
    "GGUFTensor",
    "GGMLType",
    "GGML_TYPE_NAMES",
    "GGML_BLOCK_SIZES",
    "llama_config",
    "permute_qk",
    "unpermute_qk",
    "load_all",
]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_ARRAY_NESTING = 64
MAX_DIMS = 8
MAX_COUNT = 1 << 24  # above any real model's size, layer or vocabulary count; keeps products of them in int64


class GGUFError(ValueError):
    """A GGUF file is malformed, truncated, or uses something this reader does not support."""


class GGUFFileNotFoundError(FileNotFoundError, GGUFError):
    """The GGUF file does not exist (both a ``FileNotFoundError`` and a :class:`GGUFError`)."""


# --------------------------------------------------------------------------------------
# ggml tensor types: id -> (name, elements per block, bytes per block)
# --------------------------------------------------------------------------------------

class GGMLType:
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41


_TYPE_TABLE: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 2 + 16),
    3: ("Q4_1", 32, 2 + 2 + 16),
    6: ("Q5_0", 32, 2 + 4 + 16),
    7: ("Q5_1", 32, 2 + 2 + 4 + 16),
    8: ("Q8_0", 32, 2 + 32),
    9: ("Q8_1", 32, 2 + 2 + 32),
    10: ("Q2_K", 256, 2 + 2 + 256 // 16 + 256 // 4),
    11: ("Q3_K", 256, 2 + 256 // 4 + 256 // 8 + 12),
    12: ("Q4_K", 256, 2 + 2 + 256 // 2 + 12),
    13: ("Q5_K", 256, 2 + 2 + 256 // 2 + 256 // 8 + 12),
    14: ("Q6_K", 256, 2 + 256 // 2 + 256 // 4 + 256 // 16),
    15: ("Q8_K", 256, 4 + 256 + 256 // 8),
    16: ("IQ2_XXS", 256, 2 + 256 // 4),
    17: ("IQ2_XS", 256, 2 + 256 // 4 + 256 // 32),
    18: ("IQ3_XXS", 256, 2 + 256 // 4 + 256 // 8),
    19: ("IQ1_S", 256, 2 + 256 // 8 + 256 // 16),
    20: ("IQ4_NL", 32, 2 + 16),
    21: ("IQ3_S", 256, 2 + 256 // 4 + 256 // 8 + 256 // 32 + 4),
    22: ("IQ2_S", 256, 2 + 256 // 4 + 256 // 16),
    23: ("IQ4_XS", 256, 2 + 2 + 256 // 2 + 256 // 64),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 256 // 8 + 256 // 16 + 256 // 32),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 2 + 4 * 13),
    35: ("TQ2_0", 256, 2 + 64),
    39: ("MXFP4", 32, 1 + 16),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}

GGML_TYPE_NAMES: dict[int, str] = {k: v[0] for k, v in _TYPE_TABLE.items()}
#: ggml type id -> (elements per block, bytes per block)
GGML_BLOCK_SIZES: dict[int, tuple[int, int]] = {k: (v[1], v[2]) for k, v in _TYPE_TABLE.items()}

# Types gguf.quants dequantises (no kernel of ours: they become float32 at load).
_VIA_GGUF_QUANTS = ("Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
DEQUANTIZABLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q8_K") + _VIA_GGUF_QUANTS
_DEQUANT_CHUNK_BYTES = 1 << 22  # gguf.quants' temporaries are several times its output: a chunk of rows at a time

# Block layouts as numpy structured dtypes (packed, little-endian).
_BLOCK_DTYPES = {
    GGMLType.Q8_0: np.dtype([("d", "<f2"), ("qs", "i1", (32,))]),
    GGMLType.Q4_0: np.dtype([("d", "<f2"), ("qs", "u1", (16,))]),
    GGMLType.Q4_1: np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))]),
}
_Q8_K_BLOCK = np.dtype([("d", "<f4"), ("qs", "i1", (256,)), ("bsums", "<i2", (16,))])

# metadata value types (GGUFValueType)
_STRING, _ARRAY, _N_VALUE_TYPES = 8, 9, 13
_U64 = struct.Struct("<Q")


@dataclass(frozen=True, eq=False)
class GGUFTensor:
    """One entry of a GGUF file's tensor table. Reading its data is lazy."""

    name: str
    dims: tuple[int, ...]      # as stored in the file: fastest-varying first
    ggml_type: int
    offset: int                # relative to the start of the data section
    data_offset: int           # absolute offset in the file
    nbytes: int | None         # None for an unknown ggml type
    file: "GGUFFile"

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape in numpy / PyTorch order (row-major, the file's dims reversed)."""
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        return math.prod(self.dims)

    @property
    def type_name(self) -> str:
        return GGML_TYPE_NAMES.get(self.ggml_type, f"unknown({self.ggml_type})")

    def raw(self) -> np.ndarray:
        """The tensor's bytes as a read-only, zero-copy uint8 view of the mapped file."""
        return self.file._raw(self)

    def dequantize(self) -> np.ndarray:
        return self.file.dequantize(self.name)

    def quant_blocks(self) -> dict[str, np.ndarray]:
        return self.file.quant_blocks(self.name)

    def __repr__(self) -> str:
        return f"GGUFTensor({self.name!r}, shape={self.shape}, type={self.type_name})"


def _decode_str(b: bytes) -> str | bytes:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b  # keep undecodable values as bytes rather than altering them


def _strings(blob: bytes, count: int) -> list:
    """The `count` length-prefixed strings of `blob` (bounds-checked when the file was opened)."""
    out, pos = [], 0
    for _ in range(count):
        n = _U64.unpack_from(blob, pos)[0]
        pos += 8
        out.append(_decode_str(blob[pos:pos + n]))
        pos += n
    return out


class _LazyArray(Sequence):
    """A large metadata array (a vocabulary, its merges and scores) read from the file on first use: a model that
    never builds its tokenizer never holds 100k Python strings. Compares equal to the list it stands for."""

    def __init__(self, count: int, read):
        self._count, self._read, self._items = count, read, None

    def _list(self) -> list:
        if self._items is None:
            self._items = self._read()
        return self._items

    def __len__(self):
        return self._count

    def __getitem__(self, i):
        return self._list()[i]

    def __iter__(self):
        return iter(self._list())

    def __eq__(self, other):
        return isinstance(other, (list, tuple, Sequence)) and list(self) == list(other)

    def __repr__(self):
        return f"<{self._count} metadata values, read on first use>"


LAZY_ARRAY_MIN = 1024  # arrays at least this long are read on first use


class _Corrupt(Exception):
    """Raised inside the reader; GGUFFile makes it a GGUFError naming the file."""


@functools.lru_cache(maxsize=None)
def _reader_class():
    """gguf's GGUFReader, made safe on files from strangers (defined on first use: `gguf` is a heavy import).

    Upstream, a read past the end of the file gives a short array, so a corrupt file fails with an IndexError far
    from its cause or, for an array of scalars whose count runs past the end, loops `count` times over nothing; and
    it makes a numpy view per array element (slow on a vocabulary). Here every read is checked, an array of
    scalars is one view, a string array one view of its bytes (decoded on first use), and `_where` says which entry
    is being read, for the error messages."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

    known_types = {int(q) for q in GGMLQuantizationType} & set(_TYPE_TABLE)

    class Reader(GGUFReader):
        def __init__(self, path):
            self._where, self._depth, self._last_str, self._n_info = "the header", 0, b"", 0
            self.tensor_order: list[str] = []
            self.unknown_type_tensors: list[tuple] = []  # (name, dims, type id, offset): size unknown
            super().__init__(path, "r")

        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, mm):  # upstream's np.memmap: parsed through a plain view (memmap's views are slow to make)
            self.memmap, self._plain = mm, mm.view(np.ndarray)

        def _fail(self, what: str):
            raise _Corrupt(f"file is truncated or corrupt: {self._where}: {what}")

        def _get(self, offset, dtype, count=1, override_order=None):
            n = int(count) * np.dtype(dtype).itemsize
            if n < 0 or offset + n > self.data.size:
                self._fail(f"needs {n} bytes at offset {offset}, but the file is {self.data.size} bytes long")
            return super()._get(offset, dtype, count, override_order)

        def _get_str(self, offset):
            n, left = int(self._get(offset, np.uint64)[0]), self.data.size - offset - 8
            if n > left:
                self._fail(f"a string at offset {offset} claims a length of {n} bytes, more than the {left} bytes "
                           "left in the file")
            slen, s = super()._get_str(offset)
            self._last_str = s
            return slen, s

        def _build_fields(self, offs, count):
            try:
                return super()._build_fields(offs, count)
            except UnicodeDecodeError:
                self._fail("a key is not valid UTF-8")

        def _push_field(self, field, skip_sum=False):
            if field.name in self.fields:
                self._fail(f"duplicate metadata key {field.name!r}")
            size = super()._push_field(field, skip_sum)
            n = len(self.fields) - 3  # after the version and the two counts
            if n >= 0:
                self._where = f"metadata entry {n}" + (f" (after {field.name!r})" if n else "")
            return size

        def _get_field_parts(self, orig_offs, raw_type):
            if self._depth == 0:
                self._where = f"metadata {bytes(self._last_str).decode('utf-8', 'replace')!r}"
            if not 0 <= int(raw_type) < _N_VALUE_TYPES:
                self._fail(f"unknown value type {int(raw_type)}")
            if raw_type != _ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            itype_a, count_a = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
            itype, count, offs = int(itype_a[0]), int(count_a[0]), orig_offs + 12
            left = self.data.size - offs
            if itype == _ARRAY:
                if self._depth >= MAX_ARRAY_NESTING:
                    self._fail(f"arrays nested more than {MAX_ARRAY_NESTING} deep")
                if count > left // 12:
                    self._fail(f"an array claims {count} arrays, more than fit in the {left} bytes left")
                self._depth += 1
                try:
                    return super()._get_field_parts(orig_offs, raw_type)
                finally:
                    self._depth -= 1
            if not 0 <= itype < _N_VALUE_TYPES:
                self._fail(f"unknown element type {itype} in an array")
            types = [GGUFValueType.ARRAY, GGUFValueType(itype)]
            if itype == _STRING:
                if count > left // 8:
                    self._fail(f"an array claims {count} strings, more than fit in the {left} bytes left")
                end = self._skip_strings(offs, count)
                return end - orig_offs, [itype_a, count_a, self.data[offs:end]], [2], types
            np_type = self.gguf_scalar_to_np[GGUFValueType(itype)]
            if count > left // np.dtype(np_type).itemsize:
                self._fail(f"an array claims {count} elements, more than the {left} bytes left in the file")
            vals = self._get(offs, np_type, count)
            return 12 + vals.nbytes, [itype_a, count_a, vals], [2], types

        def _skip_strings(self, offs: int, count: int) -> int:
            buf, size = self.data, self.data.size
            for i in range(count):
                if offs + 8 > size:
                    self._fail(f"the length of string {i} of an array runs past the end of the file")
                n = _U64.unpack_from(buf, offs)[0]
                offs += 8
                if n > size - offs:
                    self._fail(f"string {i} of an array, at offset {offs - 8}, claims a length of {n} bytes, more "
                               f"than the {size - offs} bytes left in the file")
                offs += n
            return offs

        def _get_tensor_info_field(self, orig_offs):
            prev = bytes(self._last_str).decode("utf-8", "replace")
            self._where = f"tensor info {self._n_info}" + (f" (after {prev!r})" if self._n_info else "")
            self._n_info += 1
            try:
                field = super()._get_tensor_info_field(orig_offs)
            except UnicodeDecodeError:
                self._fail("the tensor's name is not valid UTF-8")
            if int(field.parts[2][0]) > MAX_DIMS:
                self._fail(f"tensor {field.name!r} has {int(field.parts[2][0])} dimensions")
            return field

        def _build_tensors(self, start_offs, fields):
            """Checks every tensor (type, shape, bytes inside the file, no overlap) before upstream builds them."""
            self._where, size, known, spans, seen = "the tensor table", self.data.size, [], [], set()
            for f in fields:
                name, dims, gtype, offset = f.name, [int(d) for d in f.parts[3]], int(f.parts[4][0]), int(f.parts[5][0])
                if name in seen:
                    self._fail(f"duplicate tensor name {name!r}")
                seen.add(name)
                self.tensor_order.append(name)
                if gtype not in known_types:
                    self.unknown_type_tensors.append((name, tuple(dims), gtype, offset))
                    continue
                tname, bs, ts = _TYPE_TABLE[gtype]
                if dims and dims[0] % bs:
                    self._fail(f"tensor {name!r} of type {tname} has a row length {dims[0]} that is not a multiple "
                               f"of its block size {bs}")
                nbytes, begin = math.prod(dims) // bs * ts, start_offs + offset
                if begin + nbytes > size or max(dims, default=0) >= 2**62:
                    self._fail(f"tensor data out of bounds: tensor {name!r} {tuple(reversed(dims))} occupies bytes "
                               f"{begin}..{begin + nbytes} but the file is {size} bytes long")
                if nbytes:
                    spans.append((begin, begin + nbytes, name))
                known.append(f)
            spans.sort()
            for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
                if begin < end:
                    self._fail(f"the data of tensors {a!r} and {b!r} overlap")
            super()._build_tensors(start_offs, known)

    return Reader


class GGUFFile:
    """A memory-mapped GGUF file.  See the module docstring."""

    def __init__(self, path: str | os.PathLike):
        self.path = p = os.fspath(path)
        try:
            with open(p, "rb") as fh:
                head, size = fh.read(24), os.fstat(fh.fileno()).st_size
        except FileNotFoundError:
            raise GGUFFileNotFoundError(errno.ENOENT, "GGUF file not found", p) from None
        except IsADirectoryError:
            raise GGUFError(f"{p}: is a directory, not a GGUF file") from None
        self.file_size = size
        self._check_header(head, size)
        try:
            r = _reader_class()(p)
        except _Corrupt as e:
            raise GGUFError(f"{p}: {e}") from None
        except (ValueError, KeyError, IndexError, OverflowError, TypeError) as e:
            raise GGUFError(f"{p}: corrupt GGUF file: {e}") from None  # the reader's own checks (alignment, ...)
        self._reader, self._data, self._mmap, self._closed = r, r.data, getattr(r.memmap, "_mmap", None), False
        self.version = int(r.fields["GGUF.version"].parts[0][0])
        self.alignment, self.data_offset = int(r.alignment), int(r.data_offset)
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, int] = {}
        for key, field in list(r.fields.items())[3:]:  # after the version and the counts
            self.metadata_types[key] = int(field.types[0])
            self.metadata[key] = self._value(field.parts, 3, self.metadata_types[key], key)[0]
        infos = {t.name: (tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.field.parts[5][0]), int(t.n_bytes))
                 for t in r.tensors}
        infos.update({name: (dims, gtype, off, None) for name, dims, gtype, off in r.unknown_type_tensors})
        self.tensors: dict[str, GGUFTensor] = {
            name: GGUFTensor(name, infos[name][0], infos[name][1], infos[name][2], self.data_offset + infos[name][2],
                             infos[name][3], self) for name in r.tensor_order}

    def _check_header(self, head: bytes, size: int) -> None:
        """What the reader does not say clearly: a short file, another format, an unsupported version (big-endian
        files included: the rest of luminal reads little-endian data), counts that cannot fit in the file."""
        p = self.path
        if len(head) >= 4 and head[:4] != GGUF_MAGIC:
            raise GGUFError(f"{p}: not a GGUF file (bad magic {head[:4]!r}, expected b'GGUF')")
        if len(head) < 24:
            raise GGUFError(f"{p}: file is truncated: {size} bytes is too short for a GGUF header")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", head, 4)
        if version not in SUPPORTED_VERSIONS:
            hint = ""
            if version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
                hint = " (this looks like a big-endian GGUF file, which is not supported)"
            elif version == 1:
                hint = " (GGUF v1 is obsolete; re-convert the model)"
            raise GGUFError(f"{p}: unsupported GGUF version {version}{hint}; supported versions are "
                            f"{', '.join(map(str, SUPPORTED_VERSIONS))}")
        # the smallest kv entry: empty key (8) + type (4) + u8 value (1); tensor info: 8 + 4 + 4 + 8
        for count, what, least in ((n_kv, "metadata count", 13), (n_tensors, "tensor count", 24)):
            if count > (size - 24) // least:
                raise GGUFError(f"{p}: file is truncated or corrupt: {what} {count} is impossible for a file of "
                                f"{size} bytes")

    def _value(self, parts: list, i: int, vtype: int, key: str):
        """The metadata value laid out in parts[i:] by the reader (see `_reader_class`), and the index after it."""
        if vtype == _STRING:
            return _decode_str(bytes(parts[i + 1])), i + 2
        if vtype != _ARRAY:
            return parts[i][0].item(), i + 1
        etype, count = int(parts[i][0]), int(parts[i + 1][0])
        i += 2
        if etype == _ARRAY:
            out = []
            for _ in range(count):
                v, i = self._value(parts, i, _ARRAY, key)
                out.append(v)
            return out, i
        data = parts[i]

        def read():
            if self._closed:
                raise GGUFError(f"{self.path}: metadata {key!r} is read on first use, but the file is closed")
            return _strings(bytes(data), count) if etype == _STRING else data.tolist()
        return (_LazyArray(count, read) if count >= LAZY_ARRAY_MIN else read()), i + 1

    # --------------------------------------------------------------------------- access
    def close(self) -> None:
        """Let go of the mapping: it is unmapped once no array returned by this file views it any more."""
        self._closed, self._reader, self._data, self._mmap = True, None, None, None

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path!r}, version={self.version}, tensors={len(self.tensors)}, "
                f"metadata={len(self.metadata)})")

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def _tensor(self, name: str) -> GGUFTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    def _raw(self, t: GGUFTensor) -> np.ndarray:
        if t.nbytes is None:
            raise GGUFError(f"{self.path}: tensor {t.name!r} has unknown ggml type {t.ggml_type}; "
                            "its size cannot be computed")
        if self._closed:
            raise GGUFError(f"{self.path}: cannot read tensor {t.name!r}: the file is closed")
        return self._data[t.data_offset:t.data_offset + t.nbytes]

    def release(self, name: str) -> None:
        """Drops the tensor's pages from this process's resident memory (the OS keeps them cached): for a tensor
        that was copied out (reordered, dequantised), so that the file's pages and the copy are not both counted."""
        t = self._tensor(name)
        mm = self._mmap  # the mmap under numpy's memmap (mapped from offset 0)
        page = mmap.PAGESIZE
        start = -(-t.data_offset // page) * page  # whole pages inside the tensor only: neighbours stay
        end = (t.data_offset + (t.nbytes or 0)) // page * page
        if end > start and mm is not None and not mm.closed and hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_DONTNEED, start, end - start)

    def raw(self, name: str) -> np.ndarray:
        return self._raw(self._tensor(name))

    def _unsupported(self, t: GGUFTensor, what: str, supported=DEQUANTIZABLE) -> GGUFError:
        return GGUFError(f"{self.path}: cannot {what} tensor {t.name!r}: unsupported ggml type "
                         f"{t.type_name} (id {t.ggml_type}); supported: {', '.join(supported)}")

    def quant_blocks(self, name: str) -> dict[str, np.ndarray]:
        """The quantisation blocks of a Q8_0 / Q4_0 / Q4_1 tensor, as zero-copy views.

        Returns a dict of arrays over ``rows = prod(shape[:-1])`` and
        ``nblocks = shape[-1] // 32``: ``d`` (float16 [rows, nblocks]); for Q4_1 also
        ``m`` (float16 [rows, nblocks]); ``qs``: int8 [rows, nblocks, 32] for Q8_0, or
        uint8 [rows, nblocks, 16] packed nibbles for Q4_0/Q4_1 (element j < 16 of a block
        is the low nibble of byte j, element j + 16 its high nibble).
        """
        t = self._tensor(name)
        dt = _BLOCK_DTYPES.get(t.ggml_type)
        if dt is None:
            raise self._unsupported(t, "take quantisation blocks of", ("Q8_0", "Q4_0", "Q4_1"))
        shape = t.shape or (1,)
        blocks = self._raw(t).view(dt).reshape(math.prod(shape[:-1]), shape[-1] // 32)
        return {f: blocks[f] for f in dt.names}

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as a new float32 array of shape ``tensors[name].shape``."""
        t = self._tensor(name)
        shape, gt = t.shape, t.ggml_type
        if gt == GGMLType.F32:
            return self._raw(t).view("<f4").astype(np.float32).reshape(shape)
        if gt == GGMLType.F16:
            return self._raw(t).view("<f2").astype(np.float32).reshape(shape)
        if gt == GGMLType.BF16:
            return (self._raw(t).view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
        with np.errstate(invalid="ignore", over="ignore"):  # inf/nan scales stay inf/nan
            if gt == GGMLType.Q8_K:
                b = self._raw(t).view(_Q8_K_BLOCK)
                return (b["qs"].astype(np.float32) * b["d"][:, None]).reshape(shape)
            if t.type_name in _VIA_GGUF_QUANTS:
                return self._dequantize_via_gguf(t)
            if gt not in _BLOCK_DTYPES:
                raise self._unsupported(t, "dequantize")
            b = self.quant_blocks(name)
            d = b["d"].astype(np.float32)[..., None]
            if gt == GGMLType.Q8_0:
                out = b["qs"].astype(np.float32) * d
            else:
                qs = b["qs"]
                q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
                if gt == GGMLType.Q4_0:
                    out = (q.astype(np.int8) - np.int8(8)).astype(np.float32) * d
                else:
                    out = q.astype(np.float32) * d + b["m"].astype(np.float32)[..., None]
        return out.reshape(shape)

    def _dequantize_via_gguf(self, t: GGUFTensor) -> np.ndarray:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        shape = t.shape or (1,)
        cols, rows = shape[-1], math.prod(shape[:-1])
        _, bs, ts = _TYPE_TABLE[t.ggml_type]
        raw = self._raw(t).reshape(rows, cols // bs * ts)
        out = np.empty((rows, cols), np.float32)
        step = max(1, _DEQUANT_CHUNK_BYTES // max(cols * 4, 1))
        for r in range(0, rows, step):
            out[r:r + step] = dequantize(raw[r:r + step], GGMLQuantizationType(t.ggml_type))
        return out.reshape(t.shape)


# --------------------------------------------------------------------------------------
# llama helpers
# --------------------------------------------------------------------------------------

def _as_gguf(gguf) -> GGUFFile:
    return gguf if isinstance(gguf, GGUFFile) else GGUFFile(gguf)


def llama_config(gguf) -> dict:
    """Llama hyper-parameters from a GGUF file's metadata (a GGUFFile or a path)."""
    g = _as_gguf(gguf)
    md = g.metadata
    arch = md.get("general.architecture", "llama")
    if isinstance(arch, bytes):
        arch = arch.decode("utf-8", "replace")

    def get(key, default=None):
        full = f"{arch}.{key}"
        v = md.get(full, default)
        if v is None:
            raise GGUFError(f"{g.path}: metadata {full!r} is missing")
        if isinstance(v, list) and v and all(x == v[0] for x in v):
            v = v[0]  # some files give one (identical) value per layer
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise GGUFError(f"{g.path}: metadata {full!r} should be a number, got {v!r}")
        return v

    def count(key, default=None):
        v = get(key, default)
        if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()) or not 0 < v <= MAX_COUNT:
            raise GGUFError(f"{g.path}: metadata {arch}.{key} should be an integer in 1..{MAX_COUNT}, got {v!r}")
        return int(v)

    def number(key, default):
        v = float(get(key, default))
        if not (math.isfinite(v) and v > 0):
            raise GGUFError(f"{g.path}: metadata {arch}.{key} should be a finite positive number, got {v!r}")
        return v

    n_heads = count("attention.head_count")
    hidden = count("embedding_length")
    n_kv = count("attention.head_count_kv", n_heads)
    head_dim = count("attention.key_length", max(hidden // n_heads, 1))
    if "token_embd.weight" in g.tensors:
        vocab = (g.tensors["token_embd.weight"].shape or (0,))[0]
    elif f"{arch}.vocab_size" in md:
        vocab = count("vocab_size")
    else:
        vocab = len(md.get("tokenizer.ggml.tokens", ()))
    n_layers = count("block_count")
    # Mixture of experts (qwen3moe; llama for Mixtral): the experts' sizes, and which layers route (the others
    # keep a dense MLP, e.g. Qwen3-MoE's mlp_only_layers).
    n_experts = count("expert_count") if get("expert_count", 0) else 0
    expert_ffn = count("expert_feed_forward_length", count("feed_forward_length", 1)) if n_experts else 0
    dense = [i for i in range(n_layers) if f"blk.{i}.ffn_gate_inp.weight" not in g.tensors] if n_experts else []
    return {
        "architecture": arch,
        "n_layers": n_layers,
        "hidden": hidden,
        "ffn": count("feed_forward_length", expert_ffn or None),
        "n_heads": n_heads,
        "n_kv_heads": n_kv,
        "head_dim": head_dim,
        "rope_theta": number("rope.freq_base", 10000.0),
        "rope_dim": count("rope.dimension_count", head_dim),
        "rms_eps": number("attention.layer_norm_rms_epsilon", 1e-5),
        "vocab_size": int(vocab),
        "context_length": count("context_length", 2048),
        "tie_word_embeddings": "output.weight" not in g.tensors,
        # Found by the tensors present: Qwen2's q/k/v biases, Qwen3's per-head q/k RMSNorm.
        "attention_bias": "blk.0.attn_q.bias" in g.tensors,
        "attention_out_bias": "blk.0.attn_output.bias" in g.tensors,
        "qk_norm": "blk.0.attn_q_norm.weight" in g.tensors,
        "expert_count": n_experts,
        "expert_used_count": count("expert_used_count") if n_experts else 0,
        "expert_feed_forward_length": expert_ffn,
        # llama.cpp renormalises the top-k routing weights for both (the key is written for some archs only).
        "expert_weights_norm": bool(md.get(f"{arch}.expert_weights_norm", True)),
        "dense_layers": dense,
    }


def permute_qk(w, n_heads: int):
    """llama.cpp's conversion permutation of a Hugging Face attn_q / attn_k weight (or bias).

    ``w`` has ``n_heads * head_dim`` rows; within each head the rows are reordered from the
    half-split rotary layout (HF) to the interleaved-pairs layout (GGUF/Meta).
    """
    rows = w.shape[0]
    if rows % n_heads or (rows // n_heads) % 2:
        raise ValueError(f"cannot permute {rows} rows into {n_heads} heads of even size")
    rest = tuple(w.shape[1:])
    return w.reshape(n_heads, 2, rows // n_heads // 2, *rest).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w, n_heads: int):
    """Undo :func:`permute_qk`: GGUF attn_q / attn_k rows back to the Hugging Face layout.

    Use ``n_heads = head_count`` for attn_q and ``head_count_kv`` for attn_k.
    """
    rows = w.shape[0]
    if rows % n_heads or (rows // n_heads) % 2:
        raise ValueError(f"cannot unpermute {rows} rows into {n_heads} heads of even size")
    rest = tuple(w.shape[1:])
    return w.reshape(n_heads, rows // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def load_all(gguf, dequantize: bool = True, progress: bool = True) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file, by name, with a tqdm progress bar.

    ``dequantize=True`` gives float32 arrays (for the types :meth:`GGUFFile.dequantize`
    supports); ``dequantize=False`` gives each tensor's raw bytes as zero-copy uint8 views.
    """
    g = _as_gguf(gguf)
    names = list(g.tensors)
    it = names
    if progress:
        try:
            from tqdm.auto import tqdm
        except ImportError:  # pragma: no cover
            pass
        else:
            it = tqdm(names, desc=f"loading {os.path.basename(g.path)}", unit="tensor")
    out = {}
    for name in it:
        out[name] = g.dequantize(name) if dequantize else g.raw(name)
    return out
