"""Mutated model files for the fuzz tests, and the subprocess that loads them.

A mutation is a small JSON-able tuple (so a failing case can be printed and replayed):
  target GGUF ("t", ...): set / delete a key (any value type), change a tensor's dims or ggml type,
    drop or rename a tensor, fill a tensor with a float (NaN, inf), then byte flips, truncation or
    inserted bytes on the serialized file;
  draft ("d", ...): set / delete a config.json key (top level or dflash_config, any JSON value,
    NaN and Infinity included), rewrite a safetensors header entry, shift the header length, flip,
    cut or extend either file.

`run_cases` writes each case's files, loads them all in one child process (tests/fuzz_load.py) and
returns one outcome per case: "ok" (loaded and ran), "error" (a clean one-line NativeError),
"bad" (an error that is not one line, or not a NativeError), "crash" (a signal) or "hang".
The child prints START before each case, so a crash or hang names its case.
"""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

LOADER = Path(__file__).resolve().parent / "fuzz_load.py"
ALIGN = 32

# GGUF value types (gguf.GGUFValueType)
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
           U64: "<Q", I64: "<q", F64: "<d"}
_INT_RANGE = {U8: (0, 2**8 - 1), I8: (-2**7, 2**7 - 1), U16: (0, 2**16 - 1), I16: (-2**15, 2**15 - 1),
              U32: (0, 2**32 - 1), I32: (-2**31, 2**31 - 1), U64: (0, 2**64 - 1), I64: (-2**63, 2**63 - 1)}


# --- GGUF -----------------------------------------------------------------------------------
@dataclass
class Tensor:
    name: str
    ne: list[int]
    ggml_type: int
    data: bytes


@dataclass
class Gguf:
    """A GGUF file as editable parts: each key-value kept as its raw bytes until edited."""
    kv: dict[str, bytes]              # key -> encoded (type + value), in file order
    tensors: list[Tensor] = field(default_factory=list)

    @classmethod
    def read(cls, path: str | Path) -> "Gguf":
        from gguf import GGUFReader

        r = GGUFReader(path)
        kv = {}
        for name, f in r.fields.items():
            if name.startswith("GGUF."):
                continue
            raw = b"".join(np.asarray(p).tobytes() for p in f.parts)
            key_len = 8 + len(name.encode())
            kv[name] = raw[key_len:]  # drop the key string: set() re-encodes it
        tensors = [Tensor(t.name, [int(x) for x in t.shape], int(t.tensor_type),
                          bytes(r.data[t.data_offset:t.data_offset + t.n_bytes])) for t in r.tensors]
        return cls(kv, tensors)

    def copy(self) -> "Gguf":
        return Gguf(dict(self.kv), [Tensor(t.name, list(t.ne), t.ggml_type, t.data) for t in self.tensors])

    def set(self, key: str, vtype: int, value, sub_type: int | None = None) -> None:
        self.kv[key] = struct.pack("<I", vtype) + _encode(vtype, value, sub_type)

    def to_bytes(self) -> bytes:
        out = [b"GGUF", struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))]
        for key, raw in self.kv.items():
            out += [_str(key), raw]
        offset, blobs = 0, []
        for t in self.tensors:
            out += [_str(t.name), struct.pack("<I", len(t.ne)), struct.pack(f"<{len(t.ne)}Q", *[x % 2**64 for x in t.ne]),
                    struct.pack("<IQ", t.ggml_type % 2**32, offset)]
            size = _declared_size(t)
            blob = (t.data * (size // max(1, len(t.data)) + 1))[:size] if size <= (8 << 20) else t.data
            blobs.append(blob + b"\0" * (-len(blob) % ALIGN))
            offset += size + (-size % ALIGN)
        head = b"".join(out)
        return head + b"\0" * (-len(head) % ALIGN) + b"".join(blobs)


def _str(s: str | bytes) -> bytes:
    b = s.encode("utf-8", "surrogatepass") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _encode(vtype: int, value, sub_type: int | None = None) -> bytes:
    if vtype == STRING:
        return _str(value)
    if vtype == ARRAY:
        items = list(value)
        return struct.pack("<IQ", sub_type, len(items)) + b"".join(_encode(sub_type, v) for v in items)
    fmt = _SCALAR[vtype]
    if vtype in _INT_RANGE:
        lo, hi = _INT_RANGE[vtype]
        value = (int(value) - lo) % (hi - lo + 1) + lo  # wrap into the type, like a corrupt writer would
    elif vtype == BOOL:
        return struct.pack("<B", int(value) % 256)
    return struct.pack(fmt, value)


def _declared_size(t: Tensor) -> int:
    """Bytes ggml expects for the tensor's type and dims (the original size for unknown types)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(t.ggml_type)]
    except (ValueError, KeyError):
        return len(t.data)
    n = 1
    for x in t.ne:
        n *= max(0, x)
    if n > 2**40:
        return len(t.data)
    return n // block * type_size


def mutate_gguf(base: Gguf, mutations) -> bytes:
    g = base.copy()
    byte_ops = []
    for m in mutations:
        op = m[0]
        if op == "set":
            _, key, vtype, value, sub_type = m
            if F32 in (vtype, sub_type) or F64 in (vtype, sub_type):  # not a string that reads "nan"
                value = _json_float(value)
            g.set(key, vtype, value, sub_type)
        elif op == "del":
            g.kv.pop(m[1], None)
        elif op in ("ne", "type", "drop", "rename", "fill"):
            t = g.tensors[m[1] % len(g.tensors)]
            if op == "ne":
                dim, value = m[2] % (len(t.ne) + 1), m[3]
                if dim == len(t.ne):
                    t.ne.append(value)  # an extra dimension
                else:
                    t.ne[dim] = value
            elif op == "type":
                t.ggml_type = m[2]
            elif op == "drop":
                g.tensors.remove(t)
            elif op == "rename":
                t.name = m[2]
            else:
                n = len(t.data) // 4
                t.data = np.full(n, _json_float(m[2]), np.float32).tobytes() + t.data[4 * n:]
        else:
            byte_ops.append(m)
    return apply_byte_ops(g.to_bytes(), byte_ops)


def apply_byte_ops(data: bytes, ops) -> bytes:
    buf = bytearray(data)
    for op in ops:
        if op[0] == "flip" and buf:
            buf[op[1] % len(buf)] = op[2]
        elif op[0] == "truncate":
            del buf[int(op[1] * len(buf)):]
        elif op[0] == "insert":
            at = op[1] % (len(buf) + 1)
            buf[at:at] = bytes(op[2])
    return bytes(buf)


def _json_float(v):
    """Floats travel as strings in mutations ("nan", "inf") so they print and replay exactly."""
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    if isinstance(v, list):
        return [_json_float(x) for x in v]
    return v


# --- draft ----------------------------------------------------------------------------------
def mutate_draft(src: Path, dst: Path, mutations) -> None:
    """Copy of the draft folder src in dst with the mutations applied."""
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    st = (src / "model.safetensors").read_bytes()
    (header_len,) = struct.unpack_from("<Q", st, 0)
    header = json.loads(st[8:8 + header_len])
    data = st[8 + header_len:]
    len_delta, cfg_bytes, st_bytes = 0, [], []
    for m in mutations:
        op = m[0]
        if op == "cfg_set":
            obj = config
            for k in m[1][:-1]:
                obj = obj.setdefault(k, {}) if isinstance(obj.get(k), dict) or k not in obj else obj[k]
            if isinstance(obj, dict):
                obj[m[1][-1]] = _json_float(m[2])
        elif op == "cfg_del":
            obj = config.get(m[1][0]) if len(m[1]) > 1 else config
            if isinstance(obj, dict):
                obj.pop(m[1][-1], None)
        elif op == "st_set":
            names = sorted(k for k in header if k != "__metadata__")
            entry = header[names[m[1] % len(names)]]
            entry[m[2]] = _json_float(m[3])
        elif op == "st_rename":
            names = sorted(k for k in header if k != "__metadata__")
            header[m[2]] = header.pop(names[m[1] % len(names)])
        elif op == "st_len":
            len_delta += m[1]
        elif op.startswith("cfg_"):
            cfg_bytes.append((op[4:],) + tuple(m[1:]))
        else:
            st_bytes.append((op[3:],) + tuple(m[1:]))
    text = json.dumps(config, indent=2).encode()
    (dst / "config.json").write_bytes(apply_byte_ops(text, cfg_bytes))
    hdr = json.dumps(header, separators=(",", ":")).encode()
    hdr += b" " * (-len(hdr) % 8)  # safetensors pads the header with spaces
    out = struct.pack("<Q", max(0, len(hdr) + len_delta) % 2**64) + hdr + data
    (dst / "model.safetensors").write_bytes(apply_byte_ops(out, st_bytes))


# --- running --------------------------------------------------------------------------------
OUTCOMES = ("ok", "error", "bad", "crash", "hang")


@dataclass
class Outcome:
    kind: str        # one of OUTCOMES
    detail: str = ""


def run_cases(cases: list[dict], workdir: Path, timeout_per_case: float = 10.0,
              timeout_base: float = 10.0) -> list[Outcome]:
    """cases: {"target": path, "draft": path or None}. Loads them in child processes; a crash or
    hang ends the child: its case is marked and the rest run in a new child."""
    workdir.mkdir(parents=True, exist_ok=True)
    results: list[Outcome | None] = [None] * len(cases)
    start = 0
    while start < len(cases):
        manifest = workdir / f"manifest-{start}.json"
        manifest.write_text(json.dumps(cases[start:]))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(LOADER.parent.parent),
                                                                          os.environ.get("PYTHONPATH")])))
        try:
            done = subprocess.run([sys.executable, str(LOADER), str(manifest), str(timeout_per_case)],
                                  capture_output=True, text=True,
                                  env=env, timeout=timeout_base + timeout_per_case * (len(cases) - start))
            stdout, rc, hung = done.stdout, done.returncode, False
        except subprocess.TimeoutExpired as e:
            stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc, hung = None, True
        current = None
        for line in stdout.splitlines():
            word, _, rest = line.partition(" ")
            if word == "START":
                current = start + int(rest)
            elif word in ("ok", "error", "bad") and current is not None:
                idx, _, detail = rest.partition(" ")
                results[start + int(idx)] = Outcome(word, detail)
                current = None
        if current is None:  # the child finished every case it started
            if rc not in (0, None):
                raise RuntimeError(f"fuzz loader failed outside a case (rc {rc}): {done.stderr[-2000:]}")
            if hung:
                raise RuntimeError("fuzz loader hung outside a case")
            break
        hung = hung or rc == -signal.SIGALRM  # the child's per-case alarm
        results[current] = Outcome("hang" if hung else "crash", "timeout" if hung else f"exit status {rc}")
        start = current + 1
    return [r if r is not None else Outcome("bad", "no result") for r in results]
