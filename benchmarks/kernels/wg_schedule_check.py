#!/usr/bin/env python3
"""The pass schedule of the invariant attention's Hopper path (vendor/patches/0045, fattn-invariant-wg.cu: Walk,
set_reps, the tails gating, Walk::count), mirrored in Python and checked on random blocks of queries (trees at
several depths, prefill runs, arbitrary dense runs with scattered slots, deep chains past the rep search's cap):
in every segment each row sees each of its ranks exactly once, in ascending tiles, through its own slot, and the
count matches the walk. It checks the schedule's logic, not the CUDA (attn_check does that on a GPU); keep it in step
with the kernel.   python3 benchmarks/kernels/wg_schedule_check.py [TRIALS]   (3,000 blocks by default)"""
import random
import sys

TILE, MAXSEG, MINSEG, MAXSPARSE = 64, 32, 4, 1024


def seg_tiles(nv):
    tiles = (nv + TILE - 1) // TILE
    st = MINSEG
    while st * MAXSEG < tiles:
        st *= 2
    return st


def slot(q, r):
    f, nv, sp = q
    return r if r < f else sp[r - f]


def extends(qs, seg, j, b, last_j):
    fj, nvj, _ = qs[j]
    fb, nvb, _ = qs[b]
    if nvb < nvj or seg[b] != seg[j]:
        return False
    r0 = min(fj, fb)
    if nvj <= r0:
        return True
    if nvj - r0 > TILE or slot(qs[b], nvj - 1) != last_j:
        return False
    for r in range(r0, nvj - 1):
        if slot(qs[j], r) != slot(qs[b], r):
            return False
    return True


def reps_of(qs, seg, tails):
    n = len(qs)
    rep = []
    for j in range(n):
        best = j
        if tails and qs[j][1] > 0:
            last_j = slot(qs[j], qs[j][1] - 1)
            for b in range(n):
                better = qs[b][1] > qs[best][1] or (qs[b][1] == qs[best][1] and b < best)
                if b != j and better and extends(qs, seg, j, b, last_j):
                    best = b
        rep.append(best)
    own = [rep[rep[j]] == rep[j] for j in range(n)]
    return [rep[j] if own[j] else j for j in range(n)]


def walk(qs, seg, rep, s):
    n = len(qs)
    cls = 0
    while True:
        nc = min((seg[j] for j in range(n) if seg[j] > cls), default=None)
        if nc is None:
            return
        cls = nc
        f_min = min(qs[j][0] for j in range(n) if seg[j] == cls)
        t0 = s * cls
        ts = min(t0 + cls, f_min // TILE)
        for t in range(t0, ts):
            yield t, -1, cls
        for qi in range(n):
            if seg[qi] != cls or rep[qi] != qi:
                continue
            end = min(t0 + cls, (qs[qi][1] + TILE - 1) // TILE)
            for t in range(max(t0, ts), end):
                yield t, qi, cls


def count(qs, seg, rep, s):
    n = len(qs)
    cls, total = 0, 0
    while True:
        nc = min((seg[j] for j in range(n) if seg[j] > cls), default=None)
        if nc is None:
            return total
        cls = nc
        f_min = min(qs[j][0] for j in range(n) if seg[j] == cls)
        t0 = s * cls
        ts = min(t0 + cls, f_min // TILE)
        total += max(ts - t0, 0)
        for j in range(n):
            if seg[j] == cls and rep[j] == j:
                total += max(min(t0 + cls, (qs[j][1] + TILE - 1) // TILE) - max(t0, ts), 0)


def check_block(qs):
    n = len(qs)
    seg = [seg_tiles(q[1]) for q in qs]
    for s in range(MAXSEG):
        f_min = min(q[0] for q in qs)
        tails = False
        for j in range(n):
            t0 = s * seg[j]
            end = min(t0 + seg[j], (qs[j][1] + TILE - 1) // TILE)
            tails |= end > max(t0, f_min // TILE)
        rep = reps_of(qs, seg, tails)
        passes = list(walk(qs, seg, rep, s))
        assert len(passes) == count(qs, seg, rep, s)
        if not tails:
            assert all(qi < 0 for _, qi, _ in passes), "gathered passes where tails said none"
        for j in range(n):
            f, nv, _ = qs[j]
            L = seg[j]
            want = {r: slot(qs[j], r) for r in range(s * L * TILE, min((s + 1) * L * TILE, nv))}
            got, last_t = {}, -1
            for t, qi, cls in passes:
                live = seg[j] == cls and (qi < 0 or rep[j] == qi)
                if not live:
                    continue
                assert t > last_t, "a row's tiles out of order or twice"
                last_t = t
                for r in range(t * TILE, (t + 1) * TILE):
                    if r >= nv:
                        continue  # masked
                    src = r if qi < 0 else slot(qs[qi], r) if r < qs[qi][1] else None
                    assert src is not None, "a live rank past the rep's end (a zero row)"
                    if qi < 0:
                        assert r < f, "a shared tile past the row's dense run"
                    assert r not in got, "rank twice"
                    got[r] = src
            assert got == want, (s, j, sorted(set(want) ^ set(got))[:5])


def tree_block(rng, n_past, n_nodes, sparse_cap=MAXSPARSE):
    paths = []
    for i in range(n_nodes):
        parent = -1 if i == 0 else rng.randrange(-1, i)
        p = (paths[parent] if parent >= 0 else []) + [n_past + i]
        paths.append(p)
    return [(n_past, n_past + len(p), p) for p in paths]


def prefill_block(start, n):
    return [(start + i + 1, start + i + 1, []) for i in range(n)]


def main(trials=3000):
    rng = random.Random(1)
    n_blocks = 0
    for trial in range(trials):
        kind = rng.randrange(4)
        if kind == 0:
            qs = tree_block(rng, rng.choice([0, 5, 700, 2040, 4090, 4096, 8190, 70000, 131049]), rng.randrange(1, 12))
        elif kind == 1:
            qs = prefill_block(rng.choice([0, 100, 4000, 4090, 8180, 32700]), rng.randrange(1, 65))
        elif kind == 2:  # mixed dense runs and odd sparse sets (not a tree)
            qs = []
            for _ in range(rng.randrange(1, 12)):
                f = rng.randrange(0, 9000)
                k = rng.randrange(0, 80)
                sp = sorted(rng.sample(range(f + 1, f + 400), k))
                qs.append((f, f + k, sp))
        else:  # a deep chain (ranks past the dense run over a tile: the extends cap)
            n_past = rng.choice([100, 5000])
            path = list(range(n_past, n_past + rng.randrange(60, 140)))
            depths = sorted(rng.sample(range(1, len(path) + 1), min(8, len(path))))
            qs = [(n_past, n_past + d, path[:d]) for d in depths]
        check_block(qs)
        n_blocks += 1
    print(f"ok: {n_blocks} blocks, every segment: each row's ranks once, ascending tiles, the right slots")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000)
