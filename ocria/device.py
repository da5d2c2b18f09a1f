"""Which device a command runs on: ``cpu``, ``cuda`` or ``cuda:N``, checked against this machine."""

import torch

from ocria.errors import OcriaError


def resolve_device(name: str) -> torch.device:
    """``name`` as a torch device; one-line OcriaError when it is not cpu/cuda/cuda:N or names a GPU that this
    machine does not have."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise OcriaError(f"device {name!r}: use cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise OcriaError(f"device {name!r} requested but this machine has no CUDA GPU (torch {torch.__version__})")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise OcriaError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return device
