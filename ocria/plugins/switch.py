"""The plugins' one switch: which implementation of a custom kernel runs."""

import os

import torch

from ocria.errors import OcriaError


def kernel_enabled(device: torch.device, use_kernel: bool | None = None) -> bool:
    """None: the Triton kernel on CUDA tensors, the PyTorch reference elsewhere. True on CPU runs the
    kernel in Triton's interpreter (``TRITON_INTERPRET=1`` set before triton is imported)."""
    if use_kernel is None:
        return device.type == "cuda"
    if use_kernel and device.type != "cuda":
        if device.type != "cpu" or os.environ.get("TRITON_INTERPRET") != "1":
            raise OcriaError(f"plugin kernel on {device.type} needs CUDA, or CPU with TRITON_INTERPRET=1")
    return use_kernel
