"""Misuse of one Engine: threads, a stream resumed after another call, and exceptions (Ctrl+C)
landing anywhere in a call. None may crash, hang, or leave Python's record of the cache apart from
the native cache; every next call must give what a fresh engine gives.

Interrupts are injected two ways: a KeyboardInterrupt raised just before or just after each native
call (wrapping the ctypes functions), and one raised at the N-th line run in lucebox/engine.py or
lucebox/_native.py (a trace function), sampled over a whole request.
"""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from lucebox import _native
from lucebox.engine import Engine
from test_engine import ENGINE_OPTS, make_prompt

# the calls an Engine makes during a request (lb_free / lb_last_error / lb_abi_version excluded)
NATIVE_CALLS = ("lb_model_info_get", "lb_reset", "lb_prefill", "lb_draft", "lb_verify", "lb_commit", "lb_step")
TRACED_FILES = {str(Path(_native.__file__).resolve()), str(Path(_native.__file__).resolve().parent / "engine.py")}


@pytest.fixture(scope="module")
def engine(tiny_pair):
    target, draft = tiny_pair
    with Engine(target, draft=draft, **ENGINE_OPTS) as e:
        yield e


@pytest.fixture(scope="module")
def fresh(tiny_pair):
    """fresh(prompt, n, mode) -> tokens a newly loaded engine generates (memoised)."""
    target, draft = tiny_pair
    memo: dict = {}

    def run(prompt, n, mode="ddtree"):
        key = (tuple(prompt), n, mode)
        if key not in memo:
            with Engine(target, draft=draft, **ENGINE_OPTS) as e:
                memo[key] = e.generate(prompt, n, mode=mode, ignore_eos=True).tokens
        return memo[key]
    return run


def assert_in_sync(e: Engine) -> None:
    h = e._handle
    assert e._cache_tokens == h.committed_tokens()
    assert len(e._cache_tokens) == h.info()["n_past"]


# --- threads ---------------------------------------------------------------------------------
def test_threads_calling_generate_are_serialised(engine, fresh):
    jobs = [(make_prompt(6 + i, seed=40 + i), 12, "ddtree" if i % 2 else "ar") for i in range(6)]
    want = [fresh(p, n, mode) for p, n, mode in jobs]
    got: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for _ in range(3):
                for j in range(k, len(jobs), 3):
                    p, n, mode = jobs[j]
                    tokens = engine.generate(p, n, mode=mode, ignore_eos=True).tokens
                    assert got.setdefault(j, tokens) == tokens
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a generate() call hung"
    assert not errors, errors
    assert [got[j] for j in range(len(jobs))] == want
    assert_in_sync(engine)


def test_a_paused_stream_raises_after_another_call(engine, fresh):
    p1, p2 = make_prompt(7, seed=50), make_prompt(9, seed=51)
    for interloper in ("generate", "reset", "stream", "next_logits", "thread"):
        stream = engine.stream(p1, 20, mode="ddtree", ignore_eos=True)
        shown = [next(stream), next(stream)]
        if interloper == "generate":
            assert engine.generate(p2, 6, mode="ddtree", ignore_eos=True).tokens == fresh(p2, 6)
        elif interloper == "reset":
            engine.reset()
        elif interloper == "stream":
            assert len(list(engine.stream(p2, 6, mode="ar", ignore_eos=True))) > 0
        elif interloper == "next_logits":
            engine.next_logits(p2)
        else:
            t = threading.Thread(target=engine.generate, args=(p2, 6), kwargs={"ignore_eos": True})
            t.start()
            t.join(timeout=120)
        with pytest.raises(RuntimeError, match="lost the Engine") as err:
            next(stream)
        assert "\n" not in str(err.value) and shown
        assert_in_sync(engine)
        assert engine.generate(p1, 10, mode="ddtree", ignore_eos=True).tokens == fresh(p1, 10)


def test_a_stream_holding_the_lock_keeps_the_engine(engine, fresh):
    p1, p2 = make_prompt(7, seed=52), make_prompt(9, seed=53)
    result: list = []
    with engine.lock:
        stream = engine.stream(p1, 12, mode="ddtree", ignore_eos=True)
        next(stream)
        t = threading.Thread(target=lambda: result.append(engine.generate(p2, 6, ignore_eos=True).tokens))
        t.start()
        t.join(timeout=0.5)
        assert t.is_alive()  # waits for the lock instead of taking the engine
        for _ in stream:
            pass
        assert engine.last_generation.tokens == fresh(p1, 12)
    t.join(timeout=120)
    assert result == [fresh(p2, 6)]


def test_close_waits_for_a_running_call_and_later_calls_fail_cleanly(tiny_pair):
    target, draft = tiny_pair
    e = Engine(target, draft=draft, **ENGINE_OPTS)
    outcome: list = []

    def run():
        try:
            outcome.append(len(e.generate(make_prompt(8, seed=54), 40, ignore_eos=True).tokens))
        except RuntimeError as err:  # close() won the lock first
            outcome.append(str(err))

    t = threading.Thread(target=run)
    t.start()
    e.close()
    t.join(timeout=120)
    assert not t.is_alive() and outcome in ([40], ["Engine is closed"])
    with pytest.raises(RuntimeError, match="closed"):
        e.generate(make_prompt(8, seed=54), 4)


# --- interrupts ------------------------------------------------------------------------------
@contextmanager
def interrupt_native_call(n: int, when: str):
    """KeyboardInterrupt just before (`when="before"`) or after the n-th native call (0-based)."""
    lib = _native.lib()
    originals = {name: getattr(lib, name) for name in NATIVE_CALLS}
    count = [0]

    def wrap(fn):
        def call(*args):
            k = count[0]
            count[0] += 1
            if k == n and when == "before":
                raise KeyboardInterrupt
            status = fn(*args)
            if k == n:
                raise KeyboardInterrupt
            return status
        return call

    for name, fn in originals.items():
        setattr(lib, name, wrap(fn))
    try:
        yield count
    finally:
        for name, fn in originals.items():
            setattr(lib, name, fn)


@contextmanager
def interrupt_at_line(n: int):
    """KeyboardInterrupt at the n-th line run in engine.py / _native.py (n < 0: only count them)."""
    count = [0]

    def local(frame, event, arg):
        if event == "line":
            count[0] += 1
            if count[0] == n:
                raise KeyboardInterrupt  # the trace function is removed, the frame gets the exception
        return local

    def on_call(frame, event, arg):
        return local if frame.f_code.co_filename in TRACED_FILES else None

    sys.settrace(on_call)
    try:
        yield count
    finally:
        sys.settrace(None)


def request(e: Engine, mode: str, p1: list[int], p2_extra: list[int]) -> list[int]:
    """A chat-like pair of requests: the second prompt extends the first reply."""
    first = e.generate(p1, 4, mode=mode, ignore_eos=True).tokens
    p2 = p1 + first + p2_extra
    e.generate(p2, 8, mode=mode, ignore_eos=True)
    return p2


@pytest.mark.parametrize("mode", ["ar", "ddtree"])
def test_interrupt_before_or_after_any_native_call(engine, fresh, mode):
    p1, extra = make_prompt(6, seed=60), make_prompt(5, seed=61)
    engine.reset()
    with interrupt_native_call(-1, "never") as count:
        p2 = request(engine, mode, p1, extra)
    n_calls = count[0]
    assert n_calls > 10
    want = fresh(p2, 8, mode)
    hits = 0
    for when in ("before", "after"):
        for n in range(n_calls):
            hits += interrupted(lambda: interrupt_native_call(n, when), lambda: request(engine, mode, p1, extra))
            assert_in_sync(engine)
            # the interrupted request again: it must not feed twice what the cache already holds
            assert engine.generate(p2, 8, mode=mode, ignore_eos=True).tokens == want, (when, n)
            assert_in_sync(engine)
    assert hits >= 0.9 * 2 * n_calls  # a retry may make fewer calls than the counted run


@pytest.mark.parametrize("mode", ["ar", "ddtree"])
def test_interrupt_at_any_line(engine, fresh, mode):
    p1, extra = make_prompt(6, seed=62), make_prompt(5, seed=63)
    engine.reset()
    with interrupt_at_line(-1) as count:
        p2 = request(engine, mode, p1, extra)
    n_lines = count[0]
    want = fresh(p2, 8, mode)
    trials = range(1, n_lines + 1, max(1, n_lines // 150))
    hits = 0
    for n in trials:
        hits += interrupted(lambda: interrupt_at_line(n), lambda: request(engine, mode, p1, extra))
        assert_in_sync(engine)
        assert engine.generate(p2, 8, mode=mode, ignore_eos=True).tokens == want, n
    assert hits >= 0.9 * len(trials)


def interrupted(injector, body) -> bool:
    """Run body under the injector; True when the injected KeyboardInterrupt came out of it."""
    try:
        with injector():
            body()
    except KeyboardInterrupt:
        return True
    return False


# --- bad arguments -------------------------------------------------------------------------------
@pytest.mark.parametrize("prompt", [None, b"bytes", 5, [1.5], [1, "a"], [{"role": "user"}], [-1], [2 ** 40]])
def test_bad_prompts_are_value_errors(engine, prompt):
    with pytest.raises(ValueError) as err:
        engine.generate(prompt, 2)
    assert "\n" not in str(err.value)
    assert_in_sync(engine)
