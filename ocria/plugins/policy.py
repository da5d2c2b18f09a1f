"""The execution policy: which implementation of each custom kernel runs, whether a decode step's kernels compute
every row independently of the others (batch invariance), and how the kernels launch (PDL).

One ``ExecutionPolicy`` is built once (``ExecutionPolicy.from_env``: the ``--plugins`` choice and the ``OCRIA_*``
environment variables) and passed explicitly: the runtime hands it to every forward call of the models, the models
to every plugin op, and each op turns it into its choice of implementation (``uses``) and into the ``Launch`` flags
its kernel's launcher reads. Nothing below reads the environment or a global switch.

Batch invariance: a decode or verify step's target forward runs under ``policy.for_steps()``. Its kernels then
compute every row the same way whatever else shares the launch: the decode GEMMs take any row count in 16-row tiles
(no cuBLAS, no NVFP4 GEMV), attention splits every context into fixed 32-key chunks, and ReplaySSM runs the tokens
of a verify block one after another with the code of a one-token step. A token verified inside a block then gets
the logits it gets decoded alone, so ``spec`` returns ``ar``'s tokens bit for bit, not only up to near-ties.
"""

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

import torch

from ocria.errors import OcriaError

# nvfp4_ptx: a code path, not a kernel: the NVFP4 GEMM's PTX dequantization (CUDA, sm_89+), on by default because
# it is 2.5-5x faster at M = 1 on the H200 than integer unpacking, which disabling it selects. decode_gemm_fp8: FP8
# layers' decode steps of up to 16 rows in the decode GEMM instead of cuBLAS's _scaled_mm, whose 128-row tiles take
# 10 us per GEMM at M = 1 on the H200; on by default because it made the mixed recipe's batch-1 ar step 2.71 ms
# against 2.99 there. nvfp4_gemv: the NVFP4 GEMM's one-row calls on the CUDA cores (ocria/plugins/fp4_gemm/gemv.py)
# instead of the tensor-core kernel; on by default because it made the mixed recipe's batch-1 ar step 2.16 ms
# against 2.48 on the H200. replay_ssm_ws: ReplaySSM's T > 1 verify in the warp-specialized Hopper kernel
# (ocria/plugins/replay_ssm/hopper.py) instead of the prep and block kernels; on by default because it takes 8-12%
# less time at T = 16 on the H200 (batch 8 to 64, same call).
KERNEL_NAMES = ("replay_ssm", "silu_quant", "nvfp4_gemm", "rms_norm", "decode_attention", "decode_gemm",
                "decode_gemm_norm", "kv_write", "sigmoid_gate", "nvfp4_ptx", "decode_gemm_fp8", "nvfp4_gemv",
                "replay_ssm_ws", "gemm_prologue")
# Off unless enabled. decode_gemm_norm: the norm folded into the GEMM made the H200's bf16 batch-1 decode step slower
# (2.41 against 2.30 ms). gemm_prologue: the SiLU-multiply, the attention's sigmoid gate and the GDN's gated norm
# computed in the K loop of the GEMM after them (ocria/plugins/gemm_prologue), one launch per op fewer; opt-in until
# a GPU timing shows the fewer launches pay for the longer K loop.
OPT_IN = ("decode_gemm_norm", "gemm_prologue")

DISABLE_ENV = "OCRIA_DISABLE_KERNELS"
ENABLE_ENV = "OCRIA_ENABLE_KERNELS"
INVARIANT_ENV = "OCRIA_BATCH_INVARIANT"
PDL_ENV = "OCRIA_PDL"


class KernelMode(enum.Enum):
    """Which implementations run: ``auto`` the Triton kernels on CUDA tensors (less the disabled ones and the opt-in
    ones not enabled) and the PyTorch references elsewhere; ``on`` every kernel, opt-in ones too (on CPU in Triton's
    interpreter: ``TRITON_INTERPRET=1`` set before triton is imported), less the disabled ones; ``off`` the
    references."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class Launch(enum.IntFlag):
    """What a kernel launcher is told by the policy; the ``torch.library`` operators take it as one int."""

    NONE = 0
    INVARIANT = enum.auto()  # batch-invariant rows (a decode or verify step under ``for_steps``)
    PDL = enum.auto()  # programmatic dependent launch, where the GPU has it (launch.py)
    NVFP4_PTX = enum.auto()  # the NVFP4 GEMM dequantizes with PTX (sm_89+), else integer unpacking
    NVFP4_GEMV = enum.auto()  # one-row NVFP4 GEMMs on the CUDA cores
    REPLAY_SSM_WS = enum.auto()  # ReplaySSM's T > 1 verify in the warp-specialized Hopper kernel


DEFAULT_LAUNCH = Launch.NVFP4_PTX | Launch.NVFP4_GEMV | Launch.REPLAY_SSM_WS  # what a launcher does when not told
_CODE_PATHS = {"nvfp4_ptx": Launch.NVFP4_PTX, "nvfp4_gemv": Launch.NVFP4_GEMV, "replay_ssm_ws": Launch.REPLAY_SSM_WS}


@dataclass(frozen=True)
class ExecutionPolicy:
    """How the plugin ops run; built once, passed explicitly (see the module docstring)."""

    kernels: KernelMode = KernelMode.AUTO
    disabled: frozenset[str] = field(default_factory=frozenset)  # run their reference (code paths: the other path)
    enabled: frozenset[str] = field(default_factory=frozenset)  # opt-in kernels turned on
    batch_invariant: bool = True  # decode and verify steps run with batch-invariant rows (``for_steps``)
    pdl: bool = False  # kernels launch with programmatic dependent launch (Hopper and newer)
    invariant_rows: bool = False  # this forward is a decode or verify step with invariance on (set by ``for_steps``)

    def __post_init__(self) -> None:
        if not isinstance(self.kernels, KernelMode):
            raise OcriaError(f"execution policy: kernels={self.kernels!r}; use one of auto, on, off")
        _check_names("disabled kernel", self.disabled, KERNEL_NAMES)
        _check_names("opt-in kernel", self.enabled, OPT_IN)

    @classmethod
    def from_env(cls, kernels: KernelMode | str = KernelMode.AUTO,
                 environ: Mapping[str, str] = os.environ) -> "ExecutionPolicy":
        """The policy of ``kernels`` with what the environment adds: ``OCRIA_DISABLE_KERNELS`` and
        ``OCRIA_ENABLE_KERNELS`` (comma-separated kernel names), ``OCRIA_BATCH_INVARIANT`` (1, the default, or 0)
        and ``OCRIA_PDL`` (0, the default, or 1). A bad value is a one-line ``OcriaError`` naming the variable."""
        try:
            mode = KernelMode(kernels)
        except ValueError:
            raise OcriaError(f"plugins {kernels!r}: use one of auto, on, off") from None
        return cls(kernels=mode, disabled=_names(environ, DISABLE_ENV, KERNEL_NAMES),
                   enabled=_names(environ, ENABLE_ENV, OPT_IN), batch_invariant=_flag(environ, INVARIANT_ENV, True),
                   pdl=_flag(environ, PDL_ENV, False))

    def uses(self, name: str, device: torch.device) -> bool:
        """Whether the op ``name`` runs its Triton kernel on ``device`` (else its PyTorch reference)."""
        if name not in KERNEL_NAMES:
            raise ValueError(f"unknown kernel {name!r}")
        if self.kernels is KernelMode.OFF or name in self.disabled:
            return False
        if self.kernels is KernelMode.ON:
            if device.type != "cuda" and (device.type != "cpu" or os.environ.get("TRITON_INTERPRET") != "1"):
                raise OcriaError(f"plugin kernel on {device.type} needs CUDA, or CPU with TRITON_INTERPRET=1")
            return True
        return device.type == "cuda" and (name not in OPT_IN or name in self.enabled)

    def runs_kernels(self, device: torch.device) -> bool:
        """Whether the ops run Triton kernels on ``device`` at all (``on``, or ``auto`` on CUDA)."""
        return self.kernels is KernelMode.ON or (self.kernels is KernelMode.AUTO and device.type == "cuda")

    @cached_property
    def launch(self) -> Launch:
        """The ``Launch`` flags of this policy's kernel launches (worked out once: every op call passes them)."""
        flags = Launch.NONE
        if self.invariant_rows:
            flags |= Launch.INVARIANT
        if self.pdl:
            flags |= Launch.PDL
        for path, flag in _CODE_PATHS.items():
            if path not in self.disabled:
                flags |= flag
        return flags

    def for_steps(self) -> "ExecutionPolicy":
        """The policy of a decode or verify step's target forward: batch-invariant rows when invariance is on."""
        return replace(self, invariant_rows=self.batch_invariant)

    def describe(self, device: torch.device) -> dict:
        """The policy as JSON-ready values, with the implementation each op takes on ``device``."""
        return {"kernels": self.kernels.value, "disabled": sorted(self.disabled), "enabled": sorted(self.enabled),
                "batch_invariant": self.batch_invariant, "pdl": self.pdl,
                "kernel": {name: "triton" if self.uses(name, device) else "reference" for name in KERNEL_NAMES
                           if name not in _CODE_PATHS}}


def _check_names(what: str, names: frozenset[str], known: tuple[str, ...]) -> None:
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise OcriaError(f"unknown {what} {unknown[0]!r}; known: {', '.join(known)}")


def _names(environ: Mapping[str, str], env: str, known: tuple[str, ...]) -> frozenset[str]:
    names = frozenset(n.strip() for n in environ.get(env, "").split(",") if n.strip())
    unknown = sorted(names - set(known))
    if unknown:
        raise OcriaError(f"{env}: unknown kernel {unknown[0]!r}; known: {', '.join(known)}")
    return names


def _flag(environ: Mapping[str, str], env: str, default: bool) -> bool:
    value = environ.get(env, "1" if default else "0").strip()
    if value not in ("0", "1"):
        raise OcriaError(f"{env}={value!r}: use 1 or 0")
    return value == "1"


AUTO = ExecutionPolicy()  # the default of a call that names no policy: kernels on CUDA, references elsewhere
REFERENCE = ExecutionPolicy(kernels=KernelMode.OFF)  # every op as its PyTorch reference (training, parity checks)
ALL_KERNELS = ExecutionPolicy(kernels=KernelMode.ON)  # every kernel, opt-in ones too (tests, benchmarks)
