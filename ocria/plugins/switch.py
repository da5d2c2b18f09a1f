"""The plugins' one switch: which implementation of a custom kernel runs."""

import os
from functools import lru_cache

import torch

from ocria.errors import OcriaError

KERNELS = ("replay_ssm", "silu_quant", "nvfp4_gemm", "rms_norm", "decode_attention", "decode_gemm",
           "decode_gemm_norm")
DISABLE_ENV = "OCRIA_DISABLE_KERNELS"


def disabled_kernels() -> frozenset[str]:
    """Kernels named in ``OCRIA_DISABLE_KERNELS`` (comma-separated): their default becomes the reference,
    so one misbehaving kernel on a new GPU or Triton can be set aside without losing the others."""
    return _parse_disabled(os.environ.get(DISABLE_ENV, ""))


@lru_cache(maxsize=8)
def _parse_disabled(value: str) -> frozenset[str]:
    """Parsed once per value: kernel_enabled runs on every plugin call."""
    names = frozenset(n.strip() for n in value.split(",") if n.strip())
    unknown = names - set(KERNELS)
    if unknown:
        raise OcriaError(f"{DISABLE_ENV}: unknown kernel {sorted(unknown)[0]!r}; known: {', '.join(KERNELS)}")
    return names


def kernel_enabled(device: torch.device, use_kernel: bool | None = None, name: str | None = None) -> bool:
    """None: the Triton kernel on CUDA tensors (unless ``name`` is in ``OCRIA_DISABLE_KERNELS``), the
    PyTorch reference elsewhere. True on CPU runs the kernel in Triton's interpreter
    (``TRITON_INTERPRET=1`` set before triton is imported)."""
    if use_kernel is None:
        return device.type == "cuda" and name not in disabled_kernels()
    if use_kernel and device.type != "cuda":
        if device.type != "cpu" or os.environ.get("TRITON_INTERPRET") != "1":
            raise OcriaError(f"plugin kernel on {device.type} needs CUDA, or CPU with TRITON_INTERPRET=1")
    return use_kernel
