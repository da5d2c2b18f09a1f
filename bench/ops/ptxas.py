"""Compile a Triton kernel for sm_90a on a machine without a GPU: PTX, SASS, registers and spills.

Triton ships ptxas and cuobjdump; this shows what a code change does to registers, spills and instruction counts
before GPU time is spent on timing it (``python -m bench.ops.run --ptxas``). Triton must compile for real here: run
it in a process without ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

SASS_LINE = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")


@dataclass(frozen=True)
class Sm90Build:
    """One launch of a kernel as a GPU run would specialize it.

    Args:
        kernel: the ``@triton.jit`` function.
        types: runtime argument types by name (``"*bf16"``, ``"i32"``, ...).
        consts: constexpr arguments by name.
        num_warps, num_stages, maxnreg: the launch options.
        divisible_by_16: arguments a real launch specializes as multiples of 16 (aligned pointers, sizes, strides);
            without them the loads compile unvectorized, unlike the kernel that runs.
    """

    kernel: object
    types: dict
    consts: dict
    num_warps: int
    num_stages: int = 3
    divisible_by_16: tuple[str, ...] = ()
    maxnreg: int | None = None


def _bin_dir() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def ptxas() -> str:
    """The newest ptxas bundled with Triton that accepts its own PTX."""
    for name in ("ptxas-blackwell", "ptxas"):
        path = os.path.join(_bin_dir(), name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"no ptxas under {_bin_dir()}")


def compile_sm90(kernel, types: dict, consts: dict, num_warps: int, num_stages: int = 3,
                 divisible_by_16: tuple[str, ...] = (), maxnreg: int | None = None) -> dict:
    """``kernel`` compiled for sm_90a (see ``Sm90Build`` for the arguments).

    Returns:
        ptx, sass (text), registers (per thread), spill_store_bytes, spill_load_bytes, shared_bytes, instructions
        (SASS) and opcodes (SASS opcode -> count).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kernel.arg_names
    sig = {n: "constexpr" if n in consts else types[n] for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible_by_16}
    src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs=attrs)
    options = dict(num_warps=num_warps, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        ptx_path, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(ptx_path, "w") as f:
            f.write(ptx)
        log = subprocess.run([ptxas(), "-arch=sm_90a", "-v", ptx_path, "-o", cubin],
                             capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([os.path.join(_bin_dir(), "cuobjdump"), "-sass", cubin],
                              capture_output=True, text=True, check=True).stdout
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    opcodes: dict[str, int] = {}
    for line in sass.splitlines():
        m = SASS_LINE.match(line)
        if m:
            opcodes[m.group(1)] = opcodes.get(m.group(1), 0) + 1
    return dict(ptx=ptx, sass=sass, registers=int(regs.group(1)), spill_store_bytes=int(spill.group(1)) if spill else 0,
                spill_load_bytes=int(spill.group(2)) if spill else 0, shared_bytes=compiled.metadata.shared,
                instructions=sum(opcodes.values()), opcodes=opcodes)


def compile_build(build: Sm90Build) -> dict:
    """``compile_sm90`` of one ``Sm90Build``."""
    return compile_sm90(build.kernel, build.types, build.consts, build.num_warps, build.num_stages,
                        build.divisible_by_16, build.maxnreg)


def build_summary(out: dict) -> dict:
    """The numbers of a ``compile_sm90`` result worth a table row: registers, spills, shared memory, instructions."""
    return {k: out[k] for k in ("registers", "spill_store_bytes", "spill_load_bytes", "shared_bytes", "instructions")}


def tile_loop_loads(sass: str, opcode: str | None = None) -> dict:
    """Where a tile loop issues its global loads (the next tile's, asked for at the top of the loop in the source).

    Args:
        sass: cuobjdump's SASS.
        opcode: take the widest backward branch holding this opcode as the loop (a kernel with a loop per path).
    Returns:
        loop_instructions (the loop's length), loads_in_loop, first_load_after / last_load_after (SASS instructions
        from the loop's top), mufu_before_first_load and mufu_in_loop (quarter-rate ex2, rcp).
    """
    addr = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
    code = [(int(m.group(1), 16), m.group(2)) for m in map(addr.search, sass.splitlines()) if m]
    back = [(int(t, 16), a) for a, ins in code for t in re.findall(r"\bBRA (?:`\()?0x([0-9a-f]+)", ins)
            if int(t, 16) < a]
    if opcode:
        back = [(t, a) for t, a in back if any(t <= at <= a and ins.startswith(opcode) for at, ins in code)]
    top, end = min(back, key=lambda ta: ta[0] - ta[1])
    loads = [a for a, ins in code if top <= a <= end and "LDG" in ins]
    first = loads[0] if loads else end
    return {"loop_instructions": (end - top) // 16 + 1, "loads_in_loop": len(loads),
            "first_load_after": (loads[0] - top) // 16 if loads else None,
            "last_load_after": (loads[-1] - top) // 16 if loads else None,
            "mufu_before_first_load": sum(top <= a < first and ins.startswith("MUFU") for a, ins in code),
            "mufu_in_loop": sum(top <= a <= end and ins.startswith("MUFU") for a, ins in code)}
