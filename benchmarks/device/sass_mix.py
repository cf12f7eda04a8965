"""The instruction mix of one kernel's main loop in `cuobjdump -sass` output, by opcode and by pipe.

    cuobjdump -sass BINARY | python3 benchmarks/device/sass_mix.py REGEX [--anchor OPCODE] [--list FILE]

REGEX picks the function (the first whose mangled name it matches). The loop is taken as the instructions from the
last block barrier or async-copy wait (BAR, DEPBAR) before the first ANCHOR instruction (default HMMA) to the first
branch after the last one: for lbq's gemm, one unit's wait, refill and arithmetic. Static counts (a branch inside
the range is counted whole). Why: lbq's one-column product runs faster as its unit loop gets shorter (sessions 42-43:
a warp's chain of dependent instructions paces it); these counts say what a change removes, and from which pipe,
before any timing.

The pipe of an opcode follows NVIDIA's public descriptions of sm_80 / sm_90 and is approximate (IMAD runs on the FMA
pipe; MOV, VIADD may issue to either).
"""
import argparse
import re
import sys
from collections import Counter

PIPES = {
    "alu": {"LOP3", "SHF", "PRMT", "IADD3", "LEA", "ISETP", "SEL", "MOV", "VIMNMX", "VIADD", "PLOP3", "FSEL", "P2R",
            "R2P", "IABS", "BMSK", "SGXT", "FMNMX", "ISCADD", "CS2R"},
    "fma": {"IMAD", "FFMA", "FADD", "FMUL", "HFMA2", "HADD2", "HMUL2", "HMNMX2", "F2FP", "FSETP", "HSETP2"},
    "tensor": {"HMMA", "IMMA", "HGMMA", "IGMMA", "DMMA"},
    "memory": {"LDS", "STS", "LDG", "STG", "LDGSTS", "LDSM", "LDC", "ATOM", "ATOMS", "ATOMG", "RED", "LD", "ST",
               "UBLKCP", "UTMALDG", "SYNCS"},
    "xu": {"MUFU", "I2F", "F2I", "F2F", "I2FP", "F2IP", "POPC", "FLO", "BREV"},
    "control": {"BRA", "BAR", "BSSY", "BSYNC", "DEPBAR", "LDGDEPBAR", "EXIT", "NOP", "WARPSYNC", "MEMBAR", "ERRBAR",
                "CGAERRBAR", "CCTL", "YIELD", "RET", "CALL", "ACQBULK", "ELECT", "VOTE", "BPT"},
}
PIPE_OF = {op: pipe for pipe, ops in PIPES.items() for op in ops}

FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*)")


def pipe(op: str) -> str:
    if op in PIPE_OF:
        return PIPE_OF[op]
    return "uniform" if op.startswith("U") else "other"


def functions(lines):
    """(mangled name, [(opcode, line), ...]) for each function of the listing, instructions in address order."""
    name, instructions = None, []
    for line in lines:
        m = FUNCTION.match(line)
        if m:
            if name is not None:
                yield name, instructions
            name, instructions = m.group(1), []
            continue
        m = INSTRUCTION.match(line)
        if m and name is not None:
            instructions.append((m.group(1), line.strip()))
    if name is not None:
        yield name, instructions


def loop_range(ops, anchor: str):
    """[start, end) of the loop around the anchor instructions, or None where the function has none."""
    hits = [i for i, op in enumerate(ops) if op == anchor]
    if not hits:
        return None
    start = next((i for i in range(hits[0], -1, -1) if ops[i] in ("BAR", "DEPBAR")), 0)
    end = next((i + 1 for i in range(hits[-1], len(ops)) if ops[i] == "BRA"), len(ops))
    return start, end


def mix(ops) -> str:
    by_op = Counter(ops)
    by_pipe = Counter(pipe(op) for op in ops)
    pipes = "  ".join(f"{p} {n}" for p, n in by_pipe.most_common())
    top = "  ".join(f"{op} {n}" for op, n in by_op.most_common(24))
    return f"{len(ops)} instructions; by pipe: {pipes}\n    by opcode: {top}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("regex", help="a pattern of the function's mangled name")
    ap.add_argument("--anchor", default="HMMA", help="the opcode the loop is found around (default HMMA)")
    ap.add_argument("--list", metavar="FILE", help="also write the loop's instructions there (to read what they do)")
    args = ap.parse_args()
    pattern = re.compile(args.regex)
    for name, instructions in functions(sys.stdin):
        if not pattern.search(name):
            continue
        ops = [op for op, _ in instructions]
        print(name)
        print(f"  whole function: {mix(ops)}")
        r = loop_range(ops, args.anchor)
        if r is None:
            print(f"  no {args.anchor} in it: no loop")
        else:
            print(f"  loop ({r[1] - r[0]} instructions from the barrier before the first {args.anchor} to the branch "
                  f"after the last): {mix(ops[r[0]:r[1]])}")
            if args.list:
                with open(args.list, "w") as f:
                    f.write("\n".join(line for _, line in instructions[r[0]:r[1]]) + "\n")
        return
    sys.exit(f"sass_mix: no function matches {args.regex!r}")


if __name__ == "__main__":
    main()
