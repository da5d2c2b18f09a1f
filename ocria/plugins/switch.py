"""The plugins' switches: which implementation of a custom kernel runs, and whether the kernels compute each row
of a decode step independently of the others (batch invariance)."""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache

import torch

from ocria.errors import OcriaError

# nvfp4_ptx: a code path, not a kernel: the NVFP4 GEMM's PTX dequantization (CUDA, sm_89+), on by default because
# it is 2.5-5x faster at M = 1 on the H200 than integer unpacking, which OCRIA_DISABLE_KERNELS=nvfp4_ptx selects.
# decode_gemm_fp8: FP8 layers' decode steps of up to 16 rows in the decode GEMM instead of cuBLAS's _scaled_mm,
# whose 128-row tiles take 10 us per GEMM at M = 1 on the H200; on by default because it made the mixed recipe's
# batch-1 ar step 2.71 ms against 2.99 there. nvfp4_gemv: the NVFP4 GEMM's one-row calls on the CUDA cores
# (ocria/plugins/fp4_gemm/gemv.py) instead of the tensor-core kernel; on by default because it made the mixed
# recipe's batch-1 ar step 2.16 ms against 2.48 on the H200. replay_ssm_ws: ReplaySSM's T > 1 verify in the
# warp-specialized Hopper kernel (ocria/plugins/replay_ssm/hopper.py) instead of the prep and block kernels; on by
# default because it takes 8-12% less time at T = 16 on the H200 (batch 8 to 64, same call).
KERNELS = ("replay_ssm", "silu_quant", "nvfp4_gemm", "rms_norm", "decode_attention", "decode_gemm",
           "decode_gemm_norm", "kv_write", "sigmoid_gate", "nvfp4_ptx", "decode_gemm_fp8", "nvfp4_gemv",
           "replay_ssm_ws", "gemm_prologue")
DISABLE_ENV = "OCRIA_DISABLE_KERNELS"
# Off unless named in OCRIA_ENABLE_KERNELS. decode_gemm_norm: the norm folded into the GEMM made the H200's
# bf16 batch-1 decode step slower (2.41 against 2.30 ms). gemm_prologue: the SiLU-multiply, the attention's sigmoid
# gate and the GDN's gated norm computed in the K loop of the GEMM after them (ocria/plugins/gemm_prologue), one
# launch per op fewer; opt-in until a GPU timing shows the fewer launches pay for the longer K loop.
OPT_IN = ("decode_gemm_norm", "gemm_prologue")
ENABLE_ENV = "OCRIA_ENABLE_KERNELS"


def disabled_kernels() -> frozenset[str]:
    """Kernels named in ``OCRIA_DISABLE_KERNELS`` (comma-separated): their default becomes the reference
    (``nvfp4_ptx``: integer unpacking), so one misbehaving kernel on a new GPU or Triton can be set aside without
    losing the others."""
    return _parse_names(DISABLE_ENV, os.environ.get(DISABLE_ENV, ""), KERNELS)


def enabled_kernels() -> frozenset[str]:
    """Opt-in kernels (``OPT_IN``) named in ``OCRIA_ENABLE_KERNELS`` (comma-separated): on by default for them."""
    return _parse_names(ENABLE_ENV, os.environ.get(ENABLE_ENV, ""), OPT_IN)


@lru_cache(maxsize=16)
def _parse_names(env: str, value: str, known: tuple[str, ...]) -> frozenset[str]:
    """Parsed once per value: kernel_enabled runs on every plugin call."""
    names = frozenset(n.strip() for n in value.split(",") if n.strip())
    unknown = names - set(known)
    if unknown:
        raise OcriaError(f"{env}: unknown kernel {sorted(unknown)[0]!r}; known: {', '.join(known)}")
    return names


def kernel_enabled(device: torch.device, use_kernel: bool | None = None, name: str | None = None) -> bool:
    """None: the Triton kernel on CUDA tensors (unless ``name`` is in ``OCRIA_DISABLE_KERNELS``, or is
    opt-in and not in ``OCRIA_ENABLE_KERNELS``), the PyTorch reference elsewhere. True runs every kernel,
    opt-in ones too; on CPU in Triton's interpreter (``TRITON_INTERPRET=1`` set before triton is imported)."""
    if use_kernel is None:
        return (device.type == "cuda" and name not in disabled_kernels()
                and (name not in OPT_IN or name in enabled_kernels()))
    if use_kernel and device.type != "cuda":
        if device.type != "cpu" or os.environ.get("TRITON_INTERPRET") != "1":
            raise OcriaError(f"plugin kernel on {device.type} needs CUDA, or CPU with TRITON_INTERPRET=1")
    return use_kernel


# Batch invariance: inside ``batch_invariant_rows()`` (the runtime enters it for a decode or verify step's target
# forward) the kernels compute every row the same way whatever else shares the launch: the decode GEMMs take any
# row count in 16-row tiles (no cuBLAS, no NVFP4 GEMV), attention splits every context into fixed 32-key chunks
# and ReplaySSM runs the tokens of a verify block one after another with the code of a one-token step. A token
# verified inside a block then gets the logits it gets decoded alone, so ``spec`` returns ``ar``'s tokens bit for
# bit, not only up to near-ties. OCRIA_BATCH_INVARIANT=0 turns it off (the faster per-shape kernel choices).
INVARIANT_ENV = "OCRIA_BATCH_INVARIANT"
_INVARIANT_ROWS: ContextVar[bool] = ContextVar("ocria_batch_invariant_rows", default=False)


def invariance_enabled() -> bool:
    """Whether ``OCRIA_BATCH_INVARIANT`` leaves batch invariance on (the default; ``0`` turns it off)."""
    value = os.environ.get(INVARIANT_ENV, "1").strip()
    if value not in ("0", "1"):
        raise OcriaError(f"{INVARIANT_ENV}={value!r}: use 1 (batch-invariant decode steps, the default) or 0")
    return value == "1"


@contextmanager
def batch_invariant_rows() -> Iterator[None]:
    """Within: ``batch_invariant()`` is true (unless ``OCRIA_BATCH_INVARIANT=0``)."""
    token = _INVARIANT_ROWS.set(invariance_enabled())
    try:
        yield
    finally:
        _INVARIANT_ROWS.reset(token)


def batch_invariant() -> bool:
    """Whether the current call is inside ``batch_invariant_rows()`` with invariance on."""
    return _INVARIANT_ROWS.get()
