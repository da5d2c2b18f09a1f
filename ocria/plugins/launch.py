"""Programmatic dependent launch (PDL) for the plugin kernels, opt-in with the execution policy's ``pdl``
(``OCRIA_PDL=1``).

Why: a decode step is a few hundred small kernels in one CUDA graph, and on the H200 the gaps between
them were 430 µs of a 2.33 ms batch-1 ``ar`` step (its profile, ``ocria bench engine --profile``). A kernel
launched with PDL (Hopper and newer) may become resident while the kernel before it still runs; it waits
(``griddepcontrol.wait``) for that kernel's completion and memory before it reads or writes anything,
then lets the kernel after it launch (``griddepcontrol.launch_dependents``). Completion is transitive:
every PDL kernel waits before it can finish, so after the wait all earlier work of the stream is done.
Kernels launched without PDL (PyTorch's, cuBLAS) keep plain stream order before and after ours.
"""

from functools import cache

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ocria.plugins.policy import Launch


def pdl_capable(device: torch.device) -> bool:
    """Whether ``device`` can launch with PDL: a CUDA GPU of compute capability >= 9."""
    return device.type == "cuda" and capability(device.index) >= (9, 0)


@cache
def capability(index: int | None) -> tuple[int, int]:
    """A CUDA device's compute capability, asked once (launchers check it on every call)."""
    return torch.cuda.get_device_capability(index)


@cache
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Programs of a one-per-SM launch the device runs at once: its SMs on a GPU (asked once); 1 in the
    interpreter, which runs programs one after another."""
    if device.type != "cuda":
        return 1
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())


def pdl_args(device: torch.device, launch: Launch, always: bool = False) -> dict:
    """Launch keywords: the kernel's ``PDL`` constexpr and Triton's ``launch_pdl`` option, set together: PDL on a
    ``pdl_capable`` device when ``launch`` has ``Launch.PDL`` (the policy's ``pdl``), or ``always`` (a launch that
    needs PDL to overlap the kernel before it)."""
    pdl = (always or Launch.PDL in launch) and pdl_capable(device)
    return {"PDL": pdl, "launch_pdl": pdl}


@triton.jit
def pdl_enter(PDL: tl.constexpr, RELEASE: tl.constexpr = False):
    """First statement of a kernel: wait for the kernels before it, then let the next one launch. ``RELEASE`` lets
    the next one launch even when this kernel was launched without PDL (stream order already waited for it)."""
    if PDL:
        gdc_wait()
    if PDL or RELEASE:
        gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs):
    """Start moving the 128-byte lines at ``ptrs`` into L2 (a hint: no registers held, nothing waits on it).
    Before ``pdl_enter`` it overlaps reads of data no earlier kernel writes (weights) with that kernel's tail."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)
