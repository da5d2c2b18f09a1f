"""Compile a Triton kernel for sm_90a on a machine without a GPU: PTX, SASS, registers and spills.

Triton ships ptxas and cuobjdump; the kernel benchmarks use this to look at what a code change does to
registers, spills and instruction counts before GPU time is spent on timing it.
"""

import datetime
import os
import re
import shlex
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BIN_DIR = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SASS_LINE = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")


def ptxas() -> str:
    """The newest ptxas bundled with Triton that accepts its own PTX."""
    for name in ("ptxas-blackwell", "ptxas"):
        path = os.path.join(BIN_DIR, name)
        if os.path.exists(path):
            return path
    raise SystemExit(f"no ptxas under {BIN_DIR}")


def compile_sm90(kernel, types: dict, consts: dict, num_warps: int, num_stages: int = 3,
                 divisible_by_16: tuple[str, ...] = (), maxnreg: int | None = None) -> dict:
    """``kernel`` with runtime argument types ``types`` (e.g. ``"*bf16"``, ``"i32"``) and constexprs ``consts``:
    its PTX, SASS, registers per thread, spill bytes, shared memory and SASS opcode counts. ``divisible_by_16``
    names the arguments a real launch would specialize as multiples of 16 (aligned pointers, sizes, strides):
    without that the loads compile unvectorized, unlike the kernel that runs."""
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
        sass = subprocess.run([os.path.join(BIN_DIR, "cuobjdump"), "-sass", cubin],
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


def compile_report(rows: list[dict]) -> dict:
    """A static report's result file: its rows with the date, compiler, command and commit that made them."""
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                gpu="none (compiled for sm_90a with Triton's ptxas)", triton=triton.__version__,
                command="python " + shlex.join(sys.argv), git=git, rows=rows)
