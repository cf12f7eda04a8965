"""The Python mirrors of the invariant attention's Hopper path (benchmarks/kernels): its pass schedule and its Q8_0
row conversion hold on random inputs, and each mirror's check fails when the logic it checks is broken. (They check
the logic the CUDA follows, not the CUDA: attn_check does that on a GPU.)"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parent.parent / "benchmarks" / "kernels"


def load(name):
    spec = importlib.util.spec_from_file_location(name, KERNELS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_schedule_sees_each_rank_once():
    load("wg_schedule_check").main(trials=120)


def test_schedule_check_catches_a_lost_pass():
    check = load("wg_schedule_check")
    walk = check.walk
    check.walk = lambda qs, seg, rep, s: list(walk(qs, seg, rep, s))[:-1]  # the last pass of a segment dropped
    with pytest.raises(AssertionError):
        check.main(trials=40)


def test_q8_0_conversion_mapping():
    load("q8_0_convert_check").main()


def test_q8_0_check_catches_a_wrong_byte():
    check = load("q8_0_convert_check")
    byte_perm = check.byte_perm
    check.byte_perm = lambda x, y, s: byte_perm(x, y, 0x5433 if s == 0x5432 else s)
    with pytest.raises(AssertionError):
        check.main()
