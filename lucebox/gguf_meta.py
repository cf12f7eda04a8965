"""Read a GGUF file's key/value metadata (not its tensors), fast.

gguf.GGUFReader parses every field into numpy views, ~10 s for a 248k-token vocab; this walks the
KV section once over an mmap and builds only the values asked for (numeric arrays as numpy views).
"""
from __future__ import annotations

import mmap
import struct
from pathlib import Path

import numpy as np

_MAGIC = b"GGUF"
# GGUF value types: id -> (struct code, numpy dtype)
_SCALARS = {0: ("B", "u1"), 1: ("b", "i1"), 2: ("H", "u2"), 3: ("h", "i2"), 4: ("I", "u4"), 5: ("i", "i4"),
            6: ("f", "f4"), 7: ("?", "?"), 10: ("Q", "u8"), 11: ("q", "i8"), 12: ("d", "f8")}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    pass


def read_metadata(path: str | Path, keys=None) -> dict:
    """-> {key: value} for every KV pair (or only `keys`). Strings -> str, string arrays ->
    list[str], numeric arrays -> numpy arrays, scalars -> Python numbers/bools."""
    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _Parser(mm, path).kv(None if keys is None else set(keys))
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file; pass the path of a .gguf model") from None
    except OverflowError:  # a corrupt count or length beyond what the checks above bound
        raise GGUFError(f"{path}: corrupt GGUF metadata (a length out of range); re-download or re-convert it") from None
    except ValueError as e:  # mmap of an empty file
        if isinstance(e, GGUFError):
            raise
        raise GGUFError(f"{path}: not a GGUF file ({e}); pass a .gguf model") from None


class _Parser:
    def __init__(self, mm: mmap.mmap, path: Path):
        self.mm, self.path, self.off = mm, path, 0
        if mm[:4] != _MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (bad magic); pass a .gguf model")
        version = int.from_bytes(mm[4:8], "little")
        # a big-endian file reads as a huge version number in little-endian order
        self.end = "<" if version < 65536 else ">"
        if self.end == ">":
            version = int.from_bytes(mm[4:8], "big")
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version} is not supported (2 or 3 are)")
        self.off = 8

    def _unpack(self, code: str):
        try:
            (v,) = struct.unpack_from(self.end + code, self.mm, self.off)
        except struct.error:
            raise GGUFError(f"{self.path}: truncated GGUF metadata at byte {self.off}") from None
        self.off += struct.calcsize(code)
        return v

    def _str(self) -> str:
        n = self._unpack("Q")
        if self.off + n > len(self.mm):
            raise GGUFError(f"{self.path}: truncated GGUF metadata at byte {self.off}")
        s = self.mm[self.off:self.off + n].decode("utf-8", errors="replace")
        self.off += n
        return s

    def _value(self, vtype: int, want: bool):
        if vtype in _SCALARS:
            return self._unpack(_SCALARS[vtype][0])
        if vtype == _STRING:
            return self._str()
        if vtype != _ARRAY:
            raise GGUFError(f"{self.path}: unknown GGUF value type {vtype} at byte {self.off}")
        itype, count = self._unpack("I"), self._unpack("Q")
        if itype in _SCALARS:
            dtype = np.dtype(_SCALARS[itype][1]).newbyteorder(self.end)
            nbytes = dtype.itemsize * count
            if self.off + nbytes > len(self.mm):
                raise GGUFError(f"{self.path}: truncated GGUF metadata at byte {self.off}")
            arr = np.frombuffer(self.mm, dtype, count, self.off).copy() if want else None
            self.off += nbytes
            return arr
        if itype == _STRING:
            return self._str_array(count, want)
        return [self._value(itype, want) for _ in range(count)]

    def _str_array(self, count: int, want: bool):
        mm, off, end = self.mm, self.off, self.end + "Q"
        unpack, size = struct.Struct(end).unpack_from, len(mm)
        out = [] if want else None
        try:
            for _ in range(count):
                (n,) = unpack(mm, off)
                off += 8
                if off + n > size:  # before slicing with a length no slice can take
                    raise GGUFError(f"{self.path}: truncated GGUF metadata at byte {off}")
                if want:
                    out.append(mm[off:off + n].decode("utf-8", errors="replace"))
                off += n
        except struct.error:
            raise GGUFError(f"{self.path}: truncated GGUF metadata at byte {off}") from None
        if off > size:
            raise GGUFError(f"{self.path}: truncated GGUF metadata at byte {off}")
        self.off = off
        return out

    def kv(self, keys: set | None) -> dict:
        self._unpack("Q")  # tensor count: not needed here
        n_kv = self._unpack("Q")
        out = {}
        for _ in range(n_kv):
            key = self._str()
            want = keys is None or key in keys
            value = self._value(self._unpack("I"), want)
            if want:
                out[key] = value
                if keys is not None and len(out) == len(keys):
                    break
        return out
