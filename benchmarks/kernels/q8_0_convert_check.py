#!/usr/bin/env python3
"""The Hopper path's Q8_0 row conversion (patch 0046, fattn-invariant-wg.cu: q8_0_row_to_f16), its byte and word mapping
mirrored in Python: 200 random rows of 8 blocks, every value == float16(float32(d) * q).
    python3 benchmarks/kernels/q8_0_convert_check.py"""
import random, struct
import numpy as np
def byte_perm(x, y, s):
    b = list(struct.pack('<I', x & 0xffffffff)) + list(struct.pack('<I', y & 0xffffffff))
    out = 0
    for i in range(4):
        sel = (s >> (4 * i)) & 0x7
        out |= b[sel] << (8 * i)
    return out
rng = random.Random(3)
for trial in range(200):
    blocks = []
    raw = b''
    for qb in range(8):
        d = np.float16(rng.uniform(-0.1, 0.1))
        q = [rng.randrange(-128, 128) for _ in range(32)]
        blocks.append((d, q))
        raw += d.tobytes() + bytes((x & 0xff) for x in q)
    assert len(raw) == 272
    row = list(struct.unpack('<68I', raw))
    for qb in range(8):
        w0 = 34 * qb // 4
        odd = qb & 1
        d_bits = byte_perm(row[w0], 0, 0x3232 if odd else 0x1010)
        d = np.frombuffer(struct.pack('<I', d_bits), dtype=np.float16)
        assert d[0] == d[1] == blocks[qb][0], (qb, d, blocks[qb][0])
        vals = []
        for k in range(8):
            rawq = row[w0 + 1 + k] if odd else byte_perm(row[w0 + k], row[w0 + k + 1], 0x5432)
            qw = rawq ^ 0x80808080
            for h in range(2):
                bits = byte_perm(qw, 0x64646464, 0x4140 if h == 0 else 0x4342)
                hv = np.frombuffer(struct.pack('<I', bits), dtype=np.float16)
                r = (hv - np.float16(1152.0)).astype(np.float16) * d
                vals += [np.float16(r[0]), np.float16(r[1])]
        want = [np.float16(np.float32(blocks[qb][0]) * q) for q in blocks[qb][1]]
        assert all(a == b or (a == 0 and b == 0) for a, b in zip(vals, want)), (qb, vals[:4], want[:4])
print("q8_0 conversion mapping ok")
