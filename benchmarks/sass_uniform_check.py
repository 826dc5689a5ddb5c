"""Uniform registers read before any write, in the SASS of a cubin (a ptxas defect check, no GPU).

    python benchmarks/sass_uniform_check.py KERNEL.sass   (``cuobjdump -sass`` output)

A forward must-be-written analysis over the kernel's control-flow graph: a uniform register (URn)
that an instruction reads on some path from the entry with no write to it on that path holds
whatever the last warp on that SM left there. ptxas 12.8.93 (Triton 3.6's; 12.9.86 assembles the
same PTX cleanly) emits such reads for the wgmma descriptors of the P @ V dot of the attention
kernels when the K and V tiles have different padded widths (D 40 -> 64, Dv 24 -> 32): the
descriptors of k-steps 1..3 are built from uniform registers that no instruction sets, so those
k-steps read the wrong shared memory (results/gpu-tests-2026-11-23-d/d40-cause.md).
``check(sass)`` returns the offending instructions; predicated writes do not count as writes.

Operand model: a uniform ``.64`` or ``.WIDE`` instruction writes a register pair and a ``.64`` one
reads pairs; ``gdesc[URn]`` of an HGMMA reads URn..URn+3 (A and B descriptors), or URn+2..URn+3
when A comes from registers. Other instructions read and write the uniform registers they name.
"""

from __future__ import annotations

import re
import sys

_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", re.M)


def _parse(sass: str) -> list[tuple[int, str, str, list[str]]]:
    """(address, predicate, opcode, operands) of each instruction."""
    out = []
    for addr, text in _LINE.findall(sass):
        m = re.match(r"(@!?U?P[T0-9]+\s+)?([A-Z0-9_.]+)\s*(.*)$", text)
        if m:
            operands = [a.strip() for a in m.group(3).split(",") if a.strip()]
            out.append((int(addr, 16), (m.group(1) or "").strip(), m.group(2), operands))
    return out


def _regs(operand: str, pair: bool) -> set[int]:
    regs = set()
    for n in re.findall(r"\bUR(\d+)\b", operand):
        regs |= {int(n), int(n) + 1} if pair else {int(n)}
    return regs


def _effects(op: str, args: list[str]) -> tuple[set[int], set[int]]:
    """(uniform registers read, uniform registers written) by one instruction."""
    uniform = op.startswith("U")
    pair_src = uniform and ".64" in op  # UIADD3.64 / UMOV.64 read pairs (not LDS/STS.64, not USHF .U64)
    pair_dst = uniform and (".64" in op or ".WIDE" in op)  # ULDC.64, UIADD3.64, UIMAD.WIDE write pairs
    reads, writes = set(), set()
    for i, a in enumerate(args):
        if m := re.search(r"gdesc\[UR(\d+)\]", a):
            n = int(m.group(1))
            reg_a = op.startswith("HGMMA") and i > 0 and re.match(r"R\d+$", args[i - 1] or "") is not None
            reads |= {n + 2, n + 3} if reg_a else {n, n + 1, n + 2, n + 3}
            continue
        dst = i == 0 and op.startswith(("U", "R2UR", "S2UR", "ULDC", "VOTEU", "REDUX", "ULEA", "ULOP", "USHF"))
        dst = dst or (i == 0 and a.startswith("UR") and not op.startswith(("ST", "HGMMA", "BRA")))
        if dst:
            writes |= _regs(a, pair_dst)
        else:
            reads |= _regs(a, pair_src)
    return reads, writes


def check(sass: str) -> list[str]:
    code = _parse(sass)
    if not code:
        return []
    index = {addr: i for i, (addr, *_) in enumerate(code)}
    succ: list[list[int]] = []
    for i, (addr, pred, op, args) in enumerate(code):
        nxt = [i + 1] if i + 1 < len(code) else []
        if op.startswith("BRA") or op.startswith("BRX"):
            target = [index[int(m, 16)] for m in re.findall(r"0x([0-9a-f]+)", " ".join(args)) if int(m, 16) in index]
            nxt = target + (nxt if pred else [])
        elif op.startswith(("EXIT", "RET")) and not pred:
            nxt = []
        succ.append(nxt)
    defined: list[set[int] | None] = [None] * len(code)  # must-be-written before instruction i
    defined[0] = set()
    work = [0]
    while work:
        i = work.pop()
        _, pred, op, args = code[i]
        after = defined[i] if pred else defined[i] | _effects(op, args)[1]  # a predicated write may not happen
        for j in succ[i]:
            new = after if defined[j] is None else defined[j] & after
            if new != defined[j]:
                defined[j] = new
                work.append(j)
    bad = []
    for i, (addr, pred, op, args) in enumerate(code):
        if defined[i] is None:
            continue  # unreachable
        undefined = _effects(op, args)[0] - defined[i] - {255}
        if undefined:
            bad.append(f"/*{addr:04x}*/ {pred} {op} {', '.join(args)}  "
                       f"<- UR{sorted(undefined)} never written on some path")
    return bad


if __name__ == "__main__":
    found = 0
    for path in sys.argv[1:]:
        bad = check(open(path).read())
        found += len(bad)
        print(f"{path}: {len(bad)} reads of unwritten uniform registers")
        for line in bad:
            print("   ", line)
    sys.exit(1 if found else 0)
