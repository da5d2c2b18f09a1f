"""Request and response tensors of the Python-backend models, read and written through DLPack.

Why: the Python backend's stub builds NumPy arrays with pybind11, and a stub built with a pybind11 older than 2.12
(tritonserver 2.51, the one bundled in nvidia-pytriton; python_backend fixed it for Triton 24.11) reads NumPy 2's
dtype descriptors at NumPy 1's offsets. Under NumPy 2 every array it builds from a tensor's memory then has zero
strides (an input reads as its first element repeated: an image arrives as one byte 26,345 times) and every array it
is handed reports zero bytes (outputs arrive empty). DLPack hands torch the pointer, shape and dtype without NumPy,
so numeric tensors are right whatever NumPy is installed.

STRING (BYTES) tensors have no DLPack form: the stub (de)serializes them through NumPy, so they are right only
with a sound stub. ``check_stub`` proves the stub sound at start-up, and a model refuses to load if it is not
(the server then never reports ready).
"""

from __future__ import annotations

import numpy as np
import torch

from ocria.errors import OcriaError

STRING = "TYPE_STRING"


class StubNumpyError(OcriaError):
    """The Python backend's stub builds wrong NumPy arrays with the NumPy it imported."""


def check_stub(pb_utils) -> None:
    """A round trip of known bytes through the stub's own array construction (the path STRING tensors and NumPy
    outputs take). Raises StubNumpyError with what to do if the bytes come back wrong."""
    probe = torch.arange(1, 17, dtype=torch.uint8).reshape(2, 8)
    seen = pb_utils.Tensor.from_dlpack("stub_check", probe).as_numpy()
    if seen.shape == (2, 8) and bytes(seen.tobytes()) == bytes(range(1, 17)):
        return
    raise StubNumpyError(
        f"this tritonserver's Python backend stub builds wrong NumPy arrays under NumPy {np.__version__} "
        f"(16 known bytes came back as {bytes(seen.tobytes())[:16].hex()}; its pybind11 predates NumPy 2, fixed in "
        "Triton 24.11): run the server's Python with NumPy < 2 (`ocria serve` does for the nvidia-pytriton server) "
        "or use a Triton Inference Server 24.11 or newer")


def string_inputs(model_config: dict) -> frozenset[str]:
    """Names of a model's STRING inputs, from its parsed config (``json.loads(args["model_config"])``)."""
    return frozenset(i["name"] for i in model_config.get("input", []) if i["data_type"] == STRING)


def reader(pb_utils, request, strings: frozenset[str]):
    """``get(name)`` for one request: numeric inputs as torch tensors viewing the request's memory (DLPack; valid
    while the request is), the ``strings`` inputs as NumPy object arrays of bytes; None when absent."""

    def get(name: str):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            return None
        if name in strings:
            return tensor.as_numpy()
        return torch.from_dlpack(tensor.to_dlpack())

    return get


def output(pb_utils, name: str, value: torch.Tensor):
    """A numeric output tensor from a torch tensor (DLPack: no NumPy involved)."""
    return pb_utils.Tensor.from_dlpack(name, value.contiguous())


def string_output(pb_utils, name: str, values: list[bytes]):
    """A STRING output [1, len(values)] (through the stub's NumPy: sound once ``check_stub`` passed)."""
    return pb_utils.Tensor(name, np.array([values], dtype=np.object_))
