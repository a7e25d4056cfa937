"""A reader for GGUF model files (versions 2 and 3), in pure Python and numpy.

Opening a file parses the header, the metadata and the tensor table, and memory-maps the
file; no tensor data is read until asked for::

    g = GGUFFile("model.gguf")
    g.metadata["general.architecture"]          # 'llama'
    t = g.tensors["blk.0.attn_q.weight"]
    t.shape, t.type_name                         # (576, 576), 'Q4_1'  (numpy order)
    t.raw()                                      # zero-copy uint8 view of its bytes
    g.dequantize("blk.0.attn_q.weight")          # float32 ndarray of t.shape
    g.quant_blocks("blk.0.attn_q.weight")        # {'d':..., 'm':..., 'qs':...} views

Layout of a GGUF file (all little-endian)::

    magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
    kv_count x   (key: string, value_type: u32, value)
    tensor_count x (name: string, n_dims: u32, dims: u64 x n_dims (fastest first),
                    ggml_type: u32, offset: u64 relative to the data section)
    padding to `general.alignment` (default 32) | tensor data

where a string is a u64 byte length followed by UTF-8 bytes, and an array value is
(element_type u32, count u64, elements).

Every problem with a file raises :class:`GGUFError` (a ``ValueError``) whose message starts
with the file's path.  All lengths read from the file are checked against its size, so a
corrupt file can neither crash the reader nor make it allocate or loop without bound.
"""

from __future__ import annotations

import errno
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
DEFAULT_ALIGNMENT = 32
MAX_ARRAY_NESTING = 64
MAX_DIMS = 8


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

DEQUANTIZABLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")

# Block layouts as numpy structured dtypes (packed, little-endian).
_BLOCK_DTYPES = {
    GGMLType.Q8_0: np.dtype([("d", "<f2"), ("qs", "i1", (32,))]),
    GGMLType.Q4_0: np.dtype([("d", "<f2"), ("qs", "u1", (16,))]),
    GGMLType.Q4_1: np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))]),
}

# --------------------------------------------------------------------------------------
# metadata value types
# --------------------------------------------------------------------------------------

class GGUFValueType:
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# value type -> (struct format, numpy dtype)
_SCALARS: dict[int, tuple[str, str]] = {
    GGUFValueType.UINT8: ("<B", "<u1"),
    GGUFValueType.INT8: ("<b", "<i1"),
    GGUFValueType.UINT16: ("<H", "<u2"),
    GGUFValueType.INT16: ("<h", "<i2"),
    GGUFValueType.UINT32: ("<I", "<u4"),
    GGUFValueType.INT32: ("<i", "<i4"),
    GGUFValueType.FLOAT32: ("<f", "<f4"),
    GGUFValueType.BOOL: ("<?", "<u1"),
    GGUFValueType.UINT64: ("<Q", "<u8"),
    GGUFValueType.INT64: ("<q", "<i8"),
    GGUFValueType.FLOAT64: ("<d", "<f8"),
}
_SCALAR_STRUCTS = {k: struct.Struct(f) for k, (f, _) in _SCALARS.items()}
_U32 = struct.Struct("<I")
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
        n = 1
        for d in self.dims:
            n *= d
        return n

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


class _Cursor:
    """Bounds-checked little-endian reader over a buffer."""

    __slots__ = ("buf", "pos", "size", "path")

    def __init__(self, buf, size: int, path: str, pos: int = 0):
        self.buf = buf
        self.size = size
        self.pos = pos
        self.path = path

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(
                f"{self.path}: file is truncated or corrupt: {what} needs {n} bytes at offset "
                f"{self.pos}, but the file is {self.size} bytes long"
            )

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def raw_string(self, what: str) -> bytes:
        n = self.u64(f"length of {what}")
        if n > self.size - self.pos:
            raise GGUFError(
                f"{self.path}: corrupt file: {what} at offset {self.pos - 8} claims a length of "
                f"{n} bytes, more than the {self.size - self.pos} bytes left in the file"
            )
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s


def _decode_str(b: bytes) -> str | bytes:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b  # keep undecodable values as bytes rather than altering them


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


class GGUFFile:
    """A memory-mapped GGUF file.  See the module docstring."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        p = self.path
        try:
            fh = open(p, "rb")
        except FileNotFoundError:
            raise GGUFFileNotFoundError(errno.ENOENT, "GGUF file not found", p) from None
        except IsADirectoryError:
            raise GGUFError(f"{p}: is a directory, not a GGUF file") from None
        with fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 4 + 4 + 8 + 8:
                head = fh.read(4)
                if len(head) == 4 and head != GGUF_MAGIC:
                    raise GGUFError(f"{p}: not a GGUF file (bad magic {head!r}, expected b'GGUF')")
                raise GGUFError(f"{p}: file is truncated: {size} bytes is too short for a GGUF header")
            self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        self.file_size = size
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------------------- parsing
    def _parse(self) -> None:
        p, size = self.path, self.file_size
        cur = _Cursor(self._mm, size, p)
        magic = bytes(self._mm[:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{p}: not a GGUF file (bad magic {magic!r}, expected b'GGUF')")
        cur.pos = 4
        version = cur.u32("version")
        if version not in SUPPORTED_VERSIONS:
            hint = ""
            if version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
                hint = " (this looks like a big-endian GGUF file, which is not supported)"
            elif version == 1:
                hint = " (GGUF v1 is obsolete; re-convert the model)"
            raise GGUFError(
                f"{p}: unsupported GGUF version {version}{hint}; supported versions are "
                f"{', '.join(map(str, SUPPORTED_VERSIONS))}"
            )
        self.version = version
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        # smallest possible kv entry: empty key (8) + type (4) + u8 value (1)
        if n_kv > (size - cur.pos) // 13:
            raise GGUFError(f"{p}: file is truncated or corrupt: metadata count {n_kv} is impossible for a "
                            f"file of {size} bytes")
        # smallest possible tensor info: empty name (8) + n_dims (4) + type (4) + offset (8)
        if n_tensors > (size - cur.pos) // 24:
            raise GGUFError(f"{p}: file is truncated or corrupt: tensor count {n_tensors} is impossible for a "
                            f"file of {size} bytes")

        metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, int] = {}
        for i in range(n_kv):
            kraw = cur.raw_string(f"key of metadata entry {i}")
            try:
                key = kraw.decode("utf-8")
            except UnicodeDecodeError:
                raise GGUFError(f"{p}: corrupt metadata: key of entry {i} is not valid UTF-8") from None
            vtype = cur.u32(f"value type of metadata {key!r}")
            metadata[key] = self._read_value(cur, vtype, key, 0)
            self.metadata_types[key] = vtype
        self.metadata = metadata

        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if (not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0
                or alignment & (alignment - 1)):
            raise GGUFError(f"{p}: general.alignment must be a positive power of two, got {alignment!r}")
        self.alignment = alignment

        infos = []
        for i in range(n_tensors):
            nraw = cur.raw_string(f"name of tensor {i}")
            name = _decode_str(nraw)
            if isinstance(name, bytes):
                raise GGUFError(f"{p}: corrupt tensor table: name of tensor {i} is not valid UTF-8")
            n_dims = cur.u32(f"dimension count of tensor {name!r}")
            if n_dims > MAX_DIMS:
                raise GGUFError(f"{p}: corrupt tensor table: tensor {name!r} has {n_dims} dimensions")
            cur.need(8 * n_dims, f"dimensions of tensor {name!r}")
            dims = struct.unpack_from(f"<{n_dims}Q", self._mm, cur.pos)
            cur.pos += 8 * n_dims
            gtype = cur.u32(f"type of tensor {name!r}")
            offset = cur.u64(f"data offset of tensor {name!r}")
            infos.append((name, tuple(int(d) for d in dims), gtype, offset))

        data_start = cur.pos
        pad = (-data_start) % alignment
        data_start += pad
        self.data_offset = data_start

        tensors: dict[str, GGUFTensor] = {}
        for name, dims, gtype, offset in infos:
            if name in tensors:
                raise GGUFError(f"{p}: corrupt tensor table: duplicate tensor name {name!r}")
            nbytes = None
            if gtype in _TYPE_TABLE:
                tname, bs, ts = _TYPE_TABLE[gtype]
                ne0 = dims[0] if dims else 1
                if ne0 % bs:
                    raise GGUFError(
                        f"{p}: tensor {name!r} of type {tname} has a row length {ne0} that is not "
                        f"a multiple of its block size {bs}")
                n = 1
                for d in dims:
                    n *= d
                nbytes = n // bs * ts
            end = data_start + offset + (nbytes or 0)
            if end > size:
                raise GGUFError(
                    f"{p}: tensor data out of bounds (file truncated or corrupt): tensor {name!r} "
                    f"occupies bytes {data_start + offset}..{end} but the file is {size} bytes long")
            tensors[name] = GGUFTensor(name, dims, gtype, offset, data_start + offset, nbytes, self)
        self.tensors = tensors

    def _read_value(self, cur: _Cursor, vtype: int, key: str, depth: int):
        if vtype in _SCALAR_STRUCTS:
            st = _SCALAR_STRUCTS[vtype]
            cur.need(st.size, f"value of metadata {key!r}")
            v = st.unpack_from(self._mm, cur.pos)[0]
            cur.pos += st.size
            return v
        if vtype == GGUFValueType.STRING:
            return _decode_str(cur.raw_string(f"string value of metadata {key!r}"))
        if vtype == GGUFValueType.ARRAY:
            if depth >= MAX_ARRAY_NESTING:
                raise GGUFError(f"{self.path}: corrupt metadata: arrays nested more than "
                                f"{MAX_ARRAY_NESTING} deep in {key!r}")
            etype = cur.u32(f"element type of array {key!r}")
            count = cur.u64(f"length of array {key!r}")
            left = cur.size - cur.pos
            if etype in _SCALARS:
                esize = _SCALAR_STRUCTS[etype].size
                if count > left // esize:
                    raise GGUFError(f"{self.path}: corrupt metadata: array {key!r} claims {count} "
                                    f"elements, more than the {left} bytes left in the file")
                start = cur.pos
                cur.pos += count * esize

                def read(start=start):
                    arr = np.frombuffer(self._live_map(key), dtype=_SCALARS[etype][1], count=count, offset=start)
                    return [bool(x) for x in arr] if etype == GGUFValueType.BOOL else arr.tolist()
                return _LazyArray(count, read) if count >= LAZY_ARRAY_MIN else read()
            if etype == GGUFValueType.STRING:
                if count > left // 8:
                    raise GGUFError(f"{self.path}: corrupt metadata: array {key!r} claims {count} "
                                    f"strings, more than fit in the {left} bytes left in the file")
                if count < LAZY_ARRAY_MIN:
                    return self._read_string_array(cur, count, key)
                start = cur.pos
                self._read_string_array(cur, count, key, decode=False)  # checks the lengths, finds the end
                return _LazyArray(count, lambda: self._read_string_array(
                    _Cursor(self._live_map(key), cur.size, self.path, start), count, key))
            if etype == GGUFValueType.ARRAY:
                if count > left // 12:
                    raise GGUFError(f"{self.path}: corrupt metadata: array {key!r} claims {count} "
                                    f"arrays, more than fit in the {left} bytes left in the file")
                return [self._read_value(cur, etype, key, depth + 1) for _ in range(count)]
            raise GGUFError(f"{self.path}: corrupt metadata: unknown element type {etype} in array {key!r}")
        raise GGUFError(f"{self.path}: corrupt metadata: unknown value type {vtype} for key {key!r}")

    def _live_map(self, key: str):
        if self._mm.closed:
            raise GGUFError(f"{self.path}: metadata {key!r} is read on first use, but the file is closed")
        return self._mm

    def _read_string_array(self, cur: _Cursor, count: int, key: str, decode: bool = True) -> list:
        mm, pos, size = self._mm, cur.pos, cur.size
        unpack = _U64.unpack_from
        out = []
        append = out.append
        for i in range(count):
            if pos + 8 > size:
                cur.pos = pos
                cur.need(8, f"length of string {i} of array {key!r}")
            n = unpack(mm, pos)[0]
            pos += 8
            if n > size - pos:
                raise GGUFError(f"{self.path}: corrupt metadata: string {i} of array {key!r} at offset "
                                f"{pos - 8} claims a length of {n} bytes, more than the "
                                f"{size - pos} bytes left in the file")
            if decode:
                b = mm[pos:pos + n]
                try:
                    append(b.decode("utf-8"))
                except UnicodeDecodeError:
                    append(b)
            pos += n
        cur.pos = pos
        return out

    # --------------------------------------------------------------------------- access
    def close(self) -> None:
        """Unmap the file. Arrays still viewing it keep the mapping alive until freed."""
        mm = getattr(self, "_mm", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # zero-copy views still exist; the mapping goes when they do

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
        return np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.data_offset)

    def release(self, name: str) -> None:
        """Drops the tensor's pages from this process's resident memory (the OS keeps them cached): for a tensor
        that was copied out (reordered, dequantised), so that the file's pages and the copy are not both counted."""
        t = self._tensor(name)
        page = mmap.PAGESIZE
        start = -(-t.data_offset // page) * page  # whole pages inside the tensor only: neighbours stay
        end = (t.data_offset + (t.nbytes or 0)) // page * page
        if end > start and not self._mm.closed:
            self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)

    def raw(self, name: str) -> np.ndarray:
        return self._raw(self._tensor(name))

    def _unsupported(self, t: GGUFTensor, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: cannot {what} tensor {t.name!r}: unsupported ggml type "
                         f"{t.type_name} (id {t.ggml_type}); supported: {', '.join(DEQUANTIZABLE)}")

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
            raise self._unsupported(t, "take quantisation blocks of")
        shape = t.shape or (1,)
        rows = 1
        for s in shape[:-1]:
            rows *= s
        nblocks = shape[-1] // 32
        blocks = self._raw(t).view(dt).reshape(rows, nblocks)
        return {f: blocks[f] for f in dt.names}

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as a new float32 array of shape ``tensors[name].shape``."""
        t = self._tensor(name)
        shape = t.shape
        gt = t.ggml_type
        if gt == GGMLType.F32:
            return self._raw(t).view("<f4").astype(np.float32).reshape(shape)
        if gt == GGMLType.F16:
            return self._raw(t).view("<f2").astype(np.float32).reshape(shape)
        if gt == GGMLType.BF16:
            return (self._raw(t).view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
        if gt not in _BLOCK_DTYPES:
            raise self._unsupported(t, "dequantize")
        b = self.quant_blocks(name)
        d = b["d"].astype(np.float32)[..., None]
        with np.errstate(invalid="ignore", over="ignore"):  # inf/nan scales stay inf/nan
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
        if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()) or v <= 0:
            raise GGUFError(f"{g.path}: metadata {arch}.{key} should be a positive integer, got {v!r}")
        return int(v)

    n_heads = count("attention.head_count")
    hidden = count("embedding_length")
    n_kv = count("attention.head_count_kv", n_heads)
    head_dim = count("attention.key_length", max(hidden // n_heads, 1))
    if "token_embd.weight" in g.tensors:
        vocab = g.tensors["token_embd.weight"].shape[0]
    elif f"{arch}.vocab_size" in md:
        vocab = count("vocab_size")
    else:
        vocab = len(md.get("tokenizer.ggml.tokens", ()))
    n_layers = count("block_count")
    # Mixture of experts (qwen3moe; llama for Mixtral): the experts' sizes, and which layers route (the others
    # keep a dense MLP, e.g. Qwen3-MoE's mlp_only_layers).
    n_experts = int(get("expert_count", 0))
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
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "rope_dim": count("rope.dimension_count", head_dim),
        "rms_eps": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
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
