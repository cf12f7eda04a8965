"""The two tree ops of the ggml fork (vendor/patches/0001-0002) against plain float64 numpy references.

Each case is written to a folder and run by native/tools/tree_ops_check (found in $LUCEBOX_TOOLS_DIR,
else build/cpu). Environment:
  LUCEBOX_TEST_BACKEND=cuda      run the ops on the GPU (default cpu)
  LUCEBOX_TOOL_WRAPPER="compute-sanitizer --tool racecheck --error-exitcode 1"   wrap every run
  LUCEBOX_TREE_OPS_VERBOSE=1     print every measured relative error (run pytest with -s)
Layouts: numpy shapes are ggml's ne reversed (ggml [S, H, n, n_seqs] is numpy (n_seqs, n, H, S)).
A state block is stored transposed, as in ggml: state[..., j, i] = S[i][j] (i: key row, j: value column).
"""
from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BACKEND = os.environ.get("LUCEBOX_TEST_BACKEND", "cpu")
TOL = 1e-5          # f32 result vs float64 reference: max |diff| / max |ref|
CHAIN_TOL = 0.0   # tree op on a chain vs the stock op: the same arithmetic, bit for bit


def tool_path() -> Path:
    tools = Path(os.environ.get("LUCEBOX_TOOLS_DIR", ROOT / "build" / "cpu"))
    exe = tools / "tree_ops_check"
    if not exe.is_file():
        pytest.fail(f"{exe} not found: build it (bash tests/run.sh, or cmake --build build/cpu) "
                    f"or point LUCEBOX_TOOLS_DIR at the build folder")
    return exe


def run_case(case: Path, spec: dict, arrays: dict, threads: int = 3, env: dict | None = None) -> dict:
    """Write spec + inputs into `case`, run the op (with `env` added to the environment), return the raw f32
    outputs."""
    case.mkdir(parents=True, exist_ok=True)
    (case / "spec.txt").write_text("".join(f"{k} {v}\n" for k, v in spec.items()))
    for name, a in arrays.items():
        dtype = np.int32 if name == "parents" else np.float32
        np.ascontiguousarray(a, dtype=dtype).tofile(case / f"{name}.bin")
    (case / "out.bin").unlink(missing_ok=True)
    wrapper = shlex.split(os.environ.get("LUCEBOX_TOOL_WRAPPER", ""))
    cmd = wrapper + [str(tool_path()), "run", str(case), "--backend", BACKEND, "--threads", str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
    assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return {"out": np.fromfile(case / "out.bin", dtype=np.float32)}


def assert_close(got: np.ndarray, ref: np.ndarray, tol: float, what: str) -> None:
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    err = np.max(np.abs(got.astype(np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-30)
    if os.environ.get("LUCEBOX_TREE_OPS_VERBOSE"):
        print(f"{what}: {err:.3g}")
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:g}"


# --- trees ------------------------------------------------------------------------------------

def chain_tree(n: int) -> np.ndarray:
    return np.arange(-1, n - 1, dtype=np.int32)


def random_tree(rng: np.random.Generator, n: int, max_depth: int) -> np.ndarray:
    """Parents before children, depth <= max_depth; mostly continues the previous node (DDTree-like)."""
    parents, depth = np.empty(n, np.int32), np.empty(n, np.int64)
    for t in range(n):
        ok = [u for u in range(t) if depth[u] < max_depth]
        if ok and t - 1 in ok and rng.random() < 0.5:
            p = t - 1
        else:
            p = int(rng.choice([-1] + ok))
        parents[t], depth[t] = p, (1 if p < 0 else depth[p] + 1)
    return parents


def deep_tree(rng: np.random.Generator, n: int) -> np.ndarray:
    """A 16-long chain, then branches anywhere."""
    par = random_tree(rng, n, 16)
    par[:min(n, 16)] = chain_tree(min(n, 16))
    return par


def garbage_tree(rng: np.random.Generator, n: int) -> np.ndarray:
    """Ids out of range, self-references and forward references: each must read as the root."""
    return rng.integers(-(1 << 30), 1 << 30, size=n).astype(np.int32) % (3 * n + 7) - n


def effective_parent(parents: np.ndarray, t: int) -> int:
    p = int(parents[t])
    return p if 0 <= p < t else -1


# --- references (float64, plain loops) --------------------------------------------------------

def conv_ref(sx: np.ndarray, c: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """sx (n_seqs, ch, d_conv-1+n), c (ch, d_conv), parents (n_par_seqs, n) -> (n_seqs, n, ch)."""
    n_seqs, ch, width = sx.shape
    d_conv = c.shape[1]
    n = width - d_conv + 1
    out = np.zeros((n_seqs, n, ch))
    for s in range(n_seqs):
        par = parents[s % parents.shape[0]]
        for t in range(n):
            cols, u = [], t                   # newest tap first: the token, its ancestors, the prefix
            while len(cols) < d_conv and u >= 0:
                cols.append(d_conv - 1 + u)
                u = effective_parent(par, u)
            prefix = d_conv - 2
            while len(cols) < d_conv:
                cols.append(prefix)
                prefix -= 1
            window = sx[s][:, cols[::-1]].astype(np.float64)
            out[s, t] = np.sum(window * c, axis=1)
    return out


def gdn_step(S: np.ndarray, q, k, v, g, beta, scale):
    """One Gated DeltaNet step on S[i][j] (i: key, j: value); g is log-decay (scalar or per key row)."""
    S = S * np.exp(g)[:, None] if np.ndim(g) else S * np.exp(g)
    delta = (v - S.T @ k) * beta
    S = S + np.outer(k, delta)
    return S, (S.T @ q) * scale


def gdn_ref(q, k, v, g, beta, state, parents):
    """q, k (qk_seqs, n, H_k, S); v (n_seqs, n, H_v, S); g (n_seqs, n, H_v, 1|S); beta (n_seqs, n, H_v, 1);
    state (n_seqs, H_v, S, S) transposed. Returns y (n_seqs, n, H_v, S), states (n_seqs, n, H_v, S, S)."""
    n_seqs, n, H_v, S_v = v.shape
    qk_seqs, _, H_k, _ = q.shape
    scale = 1.0 / np.sqrt(S_v)
    y = np.zeros((n_seqs, n, H_v, S_v))
    states = np.zeros((n_seqs, n, H_v, S_v, S_v))
    for s in range(n_seqs):
        par = parents[s % parents.shape[0]]
        sq = s // (n_seqs // qk_seqs)
        for h in range(H_v):
            hk = h % H_k                      # K/Q heads tiled over the value heads
            for t in range(n):
                p = effective_parent(par, t)
                S = (state[s, h] if p < 0 else states[s, p, h]).T.astype(np.float64)
                gt = g[s, t, h] if g.shape[-1] > 1 else g[s, t, h, 0]
                S, y[s, t, h] = gdn_step(S, q[sq, t, hk].astype(np.float64), k[sq, t, hk].astype(np.float64),
                                         v[s, t, h].astype(np.float64), gt, beta[s, t, h, 0], scale)
                states[s, t, h] = S.T
    return y, states


# --- inputs -----------------------------------------------------------------------------------

def l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def nonzero(rng, shape, lo, hi):
    """Uniform in [lo, hi] with |x| >= 1e-3: never zeros."""
    x = rng.uniform(lo, hi, size=shape)
    return np.where(np.abs(x) < 1e-3, 1e-3, x).astype(np.float32)


def gdn_case(rng, S, H_k, H_v, n, n_seqs=1, qk_seqs=None, kda=False, parents=None):
    qk_seqs = qk_seqs or n_seqs
    arrays = {
        # q/k are L2-normalized outside the op (in the model graph), as here
        "q": l2norm(nonzero(rng, (qk_seqs, n, H_k, S), -1, 1)).astype(np.float32),
        "k": l2norm(nonzero(rng, (qk_seqs, n, H_k, S), -1, 1)).astype(np.float32),
        "v": nonzero(rng, (n_seqs, n, H_v, S), -1, 1),
        "g": nonzero(rng, (n_seqs, n, H_v, S if kda else 1), -1.0, -0.01),
        "beta": nonzero(rng, (n_seqs, n, H_v, 1), 0.05, 0.95),
        "state": nonzero(rng, (n_seqs, H_v, S, S), -0.5, 0.5),
        "parents": np.atleast_2d(parents),
    }
    spec = {"S": S, "H_k": H_k, "H_v": H_v, "n": n, "n_seqs": n_seqs, "qk_seqs": qk_seqs,
            "kda": int(kda), "par_seqs": arrays["parents"].shape[0]}
    return spec, arrays


def split_tree_out(out: np.ndarray, S, H, n, n_seqs):
    ny = n_seqs * n * H * S
    return out[:ny].reshape(n_seqs, n, H, S), out[ny:].reshape(n_seqs, n, H, S, S)


def gdn_reference(arrays):
    a = arrays
    return gdn_ref(a["q"], a["k"], a["v"], a["g"], a["beta"], a["state"], a["parents"])


# --- gated_delta_net_tree ---------------------------------------------------------------------

GDN_RANDOM = [  # S, H_k, H_v, n, n_seqs, qk_seqs, kda, max_depth, per-seq trees, pad
    (16, 2, 2, 20, 1, 1, False, 4, False, 0),
    (32, 1, 3, 33, 1, 1, False, 16, False, 3),
    (128, 2, 4, 64, 1, 1, False, 8, False, 0),
    (64, 2, 6, 40, 2, 2, False, 16, True, 0),
    (16, 4, 4, 24, 2, 1, True, 6, False, 5),
    (128, 1, 2, 12, 2, 1, False, 1, True, 0),
    (16, 2, 4, 10, 4, 2, False, 5, True, 0),      # q/k sequences broadcast over value sequences
]


@pytest.mark.parametrize("S,H_k,H_v,n,n_seqs,qk_seqs,kda,max_depth,per_seq,pad", GDN_RANDOM)
def test_gdn_tree_random(tmp_path, S, H_k, H_v, n, n_seqs, qk_seqs, kda, max_depth, per_seq, pad):
    rng = np.random.default_rng(1000 + S + n)
    parents = np.stack([random_tree(rng, n, max_depth) for _ in range(n_seqs if per_seq else 1)])
    spec, arrays = gdn_case(rng, S, H_k, H_v, n, n_seqs, qk_seqs, kda, parents)
    spec.update(op="gdn_tree", pad=pad)
    out = run_case(tmp_path, spec, arrays)["out"]
    y, states = split_tree_out(out, S, H_v, n, n_seqs)
    y_ref, states_ref = gdn_reference(arrays)
    assert_close(y, y_ref, TOL, "y")
    assert_close(states, states_ref, TOL, "states")


@pytest.mark.parametrize("shape", ["single", "wide", "deep", "chain", "garbage"])
def test_gdn_tree_shapes(tmp_path, shape):
    rng = np.random.default_rng(7)
    n = {"single": 1, "wide": 17, "deep": 40, "chain": 23, "garbage": 30}[shape]
    parents = {"single": lambda: np.array([-1], np.int32), "wide": lambda: np.full(n, -1, np.int32),
               "deep": lambda: deep_tree(rng, n), "chain": lambda: chain_tree(n),
               "garbage": lambda: garbage_tree(rng, n)}[shape]()
    spec, arrays = gdn_case(rng, 32, 2, 4, n, parents=parents)
    spec["op"] = "gdn_tree"
    y, states = split_tree_out(run_case(tmp_path, spec, arrays)["out"], 32, 4, n, 1)
    y_ref, states_ref = gdn_reference(arrays)
    assert_close(y, y_ref, TOL, "y")
    assert_close(states, states_ref, TOL, "states")


@pytest.mark.parametrize("S,H_k,H_v,n,n_seqs,K,kda", [
    (128, 16, 48, 5, 1, 1, False),   # 27B head layout, final state only
    (128, 16, 48, 1, 1, 1, False),   # an AR step (CUDA: one state column a thread, the tree op four)
    (64, 2, 4, 3, 1, 2, False),      # a short commit, snapshot slots (one column a thread)
    (64, 2, 4, 12, 1, 4, False),     # snapshot slots
    (16, 1, 3, 9, 2, 12, False),     # K > n: only n slots written
    (32, 2, 2, 7, 1, 3, True),
])
def test_gdn_tree_chain_equals_stock(tmp_path, S, H_k, H_v, n, n_seqs, K, kda):
    rng = np.random.default_rng(11 + K)
    spec, arrays = gdn_case(rng, S, H_k, H_v, n, n_seqs, kda=kda, parents=chain_tree(n))
    tree = run_case(tmp_path / "tree", {**spec, "op": "gdn_tree"}, arrays)["out"]
    stock = run_case(tmp_path / "stock", {**spec, "op": "gdn_chain", "K": K}, arrays)["out"]
    y, states = split_tree_out(tree, S, H_v, n, n_seqs)
    ny = n_seqs * n * H_v * S
    y_stock = stock[:ny].reshape(n_seqs, n, H_v, S)
    slots = stock[ny:].reshape(K, n_seqs, H_v, S, S)
    assert_close(y, y_stock.astype(np.float64), CHAIN_TOL, "y vs stock")
    for slot in range(min(K, n)):    # slot s = the state s tokens back
        assert_close(states[:, n - 1 - slot], slots[slot].astype(np.float64), CHAIN_TOL, f"slot {slot}")
    assert_close(y, gdn_reference(arrays)[0], TOL, "y vs reference")


def read_back_tokens(parents: np.ndarray) -> list[int]:
    """Tokens whose state a later token other than the next one starts from (a branch switch reads it back)."""
    n = parents.shape[-1]
    return [t for t in range(n) if any(np.any(parents[..., u] == t) for u in range(t + 2, n))]


@pytest.mark.parametrize("S,H_v,n,shape", [(128, 6, 23, "random"), (32, 4, 40, "deep"), (16, 2, 17, "wide"),
                                           (64, 2, 12, "chain")])
def test_gdn_tree_branch_states_only(tmp_path, S, H_v, n, shape):
    """branch_states_only (as the engine runs the op): the same y bit for bit, and the states it reads back."""
    rng = np.random.default_rng(31 + n)
    parents = {"random": lambda: random_tree(rng, n, 8), "deep": lambda: deep_tree(rng, n),
               "wide": lambda: np.full(n, -1, np.int32), "chain": lambda: chain_tree(n)}[shape]()
    spec, arrays = gdn_case(rng, S, 2, H_v, n, parents=parents)
    full = run_case(tmp_path / "all", {**spec, "op": "gdn_tree"}, arrays)["out"]
    some = run_case(tmp_path / "some", {**spec, "op": "gdn_tree", "branch_states_only": 1}, arrays)["out"]
    y, states = split_tree_out(full, S, H_v, n, 1)
    y_some, states_some = split_tree_out(some, S, H_v, n, 1)
    assert_close(y_some, y.astype(np.float64), 0.0, "y, branch states only vs all states")
    kept = read_back_tokens(parents)
    assert (shape in ("random", "deep")) == bool(kept), f"{shape} tree: read-back tokens {kept}"
    for t in kept:
        assert_close(states_some[:, t], states[:, t].astype(np.float64), 0.0, f"state of token {t}")


def bfs_order(parents: np.ndarray) -> np.ndarray:
    """The same tree with its tokens renumbered breadth first: a token's next id is rarely its child."""
    n = parents.shape[0]
    children = [[] for _ in range(n)]
    roots = []
    for t in range(n):
        p = effective_parent(parents, t)
        (roots if p < 0 else children[p]).append(t)
    order, level = [], roots
    while level:
        order += level
        level = [c for t in level for c in children[t]]
    new_id = {old: i for i, old in enumerate(order)}
    return np.array([-1 if effective_parent(parents, old) < 0 else new_id[int(parents[old])] for old in order],
                    np.int32)


GDN_CHAINS = [  # S, H_v, n, n_seqs, kda, tree, warps, branch_states_only
    (128, 6, 23, 1, False, "random", 2, 1),   # the engine's case: budget 22, 27B head size
    (128, 4, 23, 1, False, "random", 1, 0),   # one warp takes every chain in turn
    (128, 4, 40, 2, False, "per_seq", 3, 1),
    (64, 4, 64, 1, False, "bfs", 4, 0),       # chains that skip ids; two ballot rounds of chain starts
    (32, 4, 100, 1, False, "deep", 2, 1),
    (128, 2, 33, 1, True, "random", 2, 0),    # the gate per key row: a column a thread
    (32, 2, 17, 1, False, "wide", 3, 0),      # every token a root
    (64, 2, 30, 1, False, "garbage", 2, 1),
    (128, 2, 1, 1, False, "single", 2, 0),
]


@pytest.mark.skipif(BACKEND != "cuda", reason="GGML_CUDA_GDN_TREE_CHAINS picks between two CUDA kernels")
@pytest.mark.parametrize("S,H_v,n,n_seqs,kda,tree,warps,branch_only", GDN_CHAINS)
def test_gdn_tree_by_chains_equals_token_order(tmp_path, S, H_v, n, n_seqs, kda, tree, warps, branch_only):
    """The tree by chains (W warps on a column slice, patch 0061) against the token-order kernel: the same bits in
    y and in every state either keeps, and y near the float64 reference."""
    rng = np.random.default_rng(500 + n + S)
    make = {"random": lambda: random_tree(rng, n, 8), "deep": lambda: deep_tree(rng, n),
            "bfs": lambda: bfs_order(random_tree(rng, n, 10)), "wide": lambda: np.full(n, -1, np.int32),
            "garbage": lambda: garbage_tree(rng, n), "single": lambda: np.array([-1], np.int32),
            "per_seq": lambda: np.stack([random_tree(rng, n, 12) for _ in range(n_seqs)])}
    parents = make[tree]()
    spec, arrays = gdn_case(rng, S, 2, H_v, n, n_seqs, kda=kda, parents=parents)
    spec.update(op="gdn_tree", branch_states_only=branch_only)
    one = run_case(tmp_path / "tokens", spec, arrays, env={"GGML_CUDA_GDN_TREE_CHAINS": "0"})["out"]
    by_chains = run_case(tmp_path / "chains", spec, arrays, env={"GGML_CUDA_GDN_TREE_CHAINS": str(warps)})["out"]
    y, states = split_tree_out(one, S, H_v, n, n_seqs)
    y_c, states_c = split_tree_out(by_chains, S, H_v, n, n_seqs)
    assert y_c.tobytes() == y.tobytes(), "y: the tree by chains differs from the token-order kernel"
    for s in range(n_seqs):
        par = np.atleast_2d(parents)[s % np.atleast_2d(parents).shape[0]]
        kept = read_back_tokens(par) if branch_only else range(n)
        for t in kept:
            assert states_c[s, t].tobytes() == states[s, t].tobytes(), f"sequence {s}: state of token {t} differs"
    assert_close(y_c, gdn_reference(arrays)[0], TOL, "y vs reference")


# --- ssm_conv_tree ----------------------------------------------------------------------------

def conv_case(rng, d_conv, ch, n, n_seqs, parents):
    arrays = {"sx": nonzero(rng, (n_seqs, ch, d_conv - 1 + n), -1, 1),
              "c": nonzero(rng, (ch, d_conv), -1, 1), "parents": np.atleast_2d(parents)}
    spec = {"d_conv": d_conv, "ch": ch, "n": n, "n_seqs": n_seqs, "par_seqs": arrays["parents"].shape[0]}
    return spec, arrays


@pytest.mark.parametrize("d_conv,ch,n,n_seqs,shape", [
    (4, 256, 23, 1, "random"), (4, 128, 64, 2, "random"), (5, 96, 30, 2, "per_seq"), (2, 64, 10, 1, "random"),
    (1, 32, 5, 1, "random"), (4, 128, 1, 1, "single"), (4, 128, 16, 1, "wide"), (4, 384, 40, 1, "deep"),
    (3, 128, 33, 1, "garbage"), (4, 128, 0, 1, "empty"),
])
def test_conv_tree(tmp_path, d_conv, ch, n, n_seqs, shape):
    rng = np.random.default_rng(d_conv * 100 + n)
    make = {"random": lambda: random_tree(rng, n, 1 + n % 16), "single": lambda: np.array([-1], np.int32),
            "wide": lambda: np.full(n, -1, np.int32), "deep": lambda: deep_tree(rng, n),
            "garbage": lambda: garbage_tree(rng, n), "empty": lambda: np.zeros(0, np.int32),
            "per_seq": lambda: np.stack([random_tree(rng, n, 16) for _ in range(n_seqs)])}
    spec, arrays = conv_case(rng, d_conv, ch, n, n_seqs, make[shape]())
    out = run_case(tmp_path, {**spec, "op": "conv_tree"}, arrays)["out"].reshape(n_seqs, n, ch)
    ref = conv_ref(arrays["sx"], arrays["c"], arrays["parents"]) if n else np.zeros((n_seqs, 0, ch))
    if n:
        assert_close(out, ref, TOL, "conv")
    else:
        assert out.size == 0


@pytest.mark.parametrize("d_conv,ch,n,n_seqs", [(4, 256, 23, 1), (4, 10240, 8, 1), (3, 128, 40, 2), (5, 128, 1, 1)])
def test_conv_tree_chain_equals_stock(tmp_path, d_conv, ch, n, n_seqs):
    rng = np.random.default_rng(5 + n)
    spec, arrays = conv_case(rng, d_conv, ch, n, n_seqs, chain_tree(n))
    tree = run_case(tmp_path / "tree", {**spec, "op": "conv_tree"}, arrays)["out"]
    stock = run_case(tmp_path / "stock", {**spec, "op": "conv_chain"}, arrays)["out"]
    assert_close(tree, stock.astype(np.float64), CHAIN_TOL, "conv tree vs stock")


# --- determinism ------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["gdn_tree", "conv_tree"])
def test_two_runs_bitwise_identical(tmp_path, op):
    rng = np.random.default_rng(99)
    n = 31
    parents = random_tree(rng, n, 16)
    if op == "conv_tree":
        spec, arrays = conv_case(rng, 4, 256, n, 1, parents)
    else:
        spec, arrays = gdn_case(rng, 128, 2, 6, n, parents=parents)
    first = run_case(tmp_path / "a", {**spec, "op": op}, arrays)
    second = run_case(tmp_path / "b", {**spec, "op": op}, arrays)
    for key in first:
        assert first[key].tobytes() == second[key].tobytes(), f"{op} {key} differs between runs"
