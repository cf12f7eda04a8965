"""benchmarks/device/sass_mix.py: the loop around a kernel's MMAs in cuobjdump's listing, counted by opcode and pipe."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "device" / "sass_mix.py"


def listing(name: str, ops: list[str]) -> str:
    """A cuobjdump -sass listing of one function: each instruction line, then its encoding's second word."""
    lines = [f"\t\tFunction : {name}", '\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"']
    for i, op in enumerate(ops):
        lines.append(f"        /*{16 * i:04x}*/                   {op} R0, R1, R2 ;      /* 0x0000000000000000 */")
        lines.append("                                                                 /* 0x000fe20000000000 */")
    return "\n".join(lines) + "\n"


def run(text: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], input=text, capture_output=True, text=True, timeout=30)


def test_the_loop_runs_from_the_barrier_before_the_first_mma_to_the_branch_after_the_last():
    ops = ["LDC", "IMAD", "BAR.SYNC", "LOP3.LUT", "@!P1 LDS.128", "HMMA.16816.F32", "PRMT", "IMAD", "HMMA.16816.F32",
           "HFMA2", "BRA", "STG.E", "EXIT"]
    text = listing("_ZN3lbq4gemmILNS_4KindE0EEEv", ["BAR.SYNC.DEFER_BLOCKING"]) + listing("_ZN3foo6kernelEv", ops)
    out = run(text, "foo6kernel").stdout
    assert "_ZN3foo6kernelEv" in out and "lbq4gemm" not in out
    loop = out.split("loop (")[1]
    # BAR, LOP3, LDS, HMMA, PRMT, IMAD, HMMA, HFMA2, BRA: 9 instructions; the opcode is the word before the dot
    assert loop.startswith("9 instructions")
    assert "alu 2" in loop and "fma 2" in loop and "tensor 2" in loop and "memory 1" in loop and "control 2" in loop
    assert "LOP3 1" in loop and "PRMT 1" in loop and "HMMA 2" in loop
    whole = out.split("whole function: ")[1]
    assert whole.startswith("13 instructions")


def test_list_writes_the_loops_instruction_lines(tmp_path):
    ops = ["LDC", "BAR.SYNC", "LOP3.LUT", "HMMA.16816.F32", "BRA", "EXIT"]
    dest = tmp_path / "loop.sass"
    run(listing("_ZN3foo6kernelEv", ops), "kernel", "--list", str(dest))
    lines = dest.read_text().splitlines()
    assert [line.split()[1] for line in lines] == ["BAR.SYNC", "LOP3.LUT", "HMMA.16816.F32", "BRA"]


def test_a_function_without_the_anchor_has_no_loop_and_an_unknown_name_fails():
    text = listing("_ZN3foo6kernelEv", ["LDC", "STG.E", "EXIT"])
    assert "no HMMA in it" in run(text, "kernel").stdout
    missing = run(text, "nothing_like_it")
    assert missing.returncode != 0 and "no function matches" in missing.stderr
