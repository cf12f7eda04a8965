#!/usr/bin/env python3
"""The Hopper path's Q8_0 row conversion (fattn-invariant-wg.cu: row_to_f16 of Q8_0, a block at a time through
fattn-invariant.cu's block_words_to_half since patch 0048), its byte and word mapping mirrored in Python: 200 random
rows of 8 quant blocks, every value == float16(float32(d) * q). It checks the mapping, not the CUDA (attn_check does
that on a GPU); keep it in step with the kernel.
    python3 benchmarks/kernels/q8_0_convert_check.py"""
import random
import struct

import numpy as np

BLOCKS, BLOCK_BYTES = 8, 34  # a row of head size 256: 8 blocks of (f16 d, 32 int8)


def byte_perm(x, y, s):
    """CUDA's __byte_perm: byte i of the result is byte (s >> 4 i) & 7 of y:x."""
    b = struct.pack('<I', x & 0xffffffff) + struct.pack('<I', y & 0xffffffff)
    return sum(b[(s >> (4 * i)) & 0x7] << (8 * i) for i in range(4))


def halves(word):
    return np.frombuffer(struct.pack('<I', word), dtype=np.float16)


def convert_block(row, qb):
    """The kernel's values of block qb of a row given as 68 little-endian words."""
    w0, odd = BLOCK_BYTES * qb // 4, qb & 1  # an odd block starts 2 bytes into word w0
    d = halves(byte_perm(row[w0], 0, 0x3232 if odd else 0x1010))
    assert d[0] == d[1]
    vals = []
    for k in range(8):  # values 4 k .. 4 k + 3
        raw = row[w0 + 1 + k] if odd else byte_perm(row[w0 + k], row[w0 + k + 1], 0x5432)
        q = raw ^ 0x80808080  # each int8 flipped to unsigned (q + 128)
        for h in range(2):  # put under 0x64: the f16 1024 + q + 128, minus 1152, times d
            r = (halves(byte_perm(q, 0x64646464, 0x4140 if h == 0 else 0x4342)) - np.float16(1152.0)) * d
            vals += [np.float16(r[0]), np.float16(r[1])]
    return d[0], vals


def main():
    rng = random.Random(3)
    for _ in range(200):
        blocks, raw = [], b''
        for _ in range(BLOCKS):
            d = np.float16(rng.uniform(-0.1, 0.1))
            q = [rng.randrange(-128, 128) for _ in range(32)]
            blocks.append((d, q))
            raw += d.tobytes() + bytes(x & 0xff for x in q)
        row = struct.unpack(f'<{len(raw) // 4}I', raw)
        for qb, (d, q) in enumerate(blocks):
            got_d, vals = convert_block(row, qb)
            want = [np.float16(np.float32(d) * x) for x in q]
            assert got_d == d and vals == want, (qb, vals[:4], want[:4])
    print("q8_0 conversion mapping ok")


if __name__ == "__main__":
    main()
