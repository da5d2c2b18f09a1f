"""Tensor names and request validation shared by the Triton models and the client.

The client-facing names are the TensorRT-LLM backend's (``text_input``, ``image_bytes_input``,
``max_tokens``, ``stream`` ...), so clients written for that backend work unchanged. The ensemble has
``max_batch_size > 0``: every tensor carries a leading batch dimension, which must be 1 (one document
per request; concurrency comes from the engine's continuous batching, not from request batches).

Inputs arrive as torch tensors (numeric, read through DLPack: ``ocria.serving.tensors``) or as NumPy object
arrays of bytes (STRING). Every check here ends a bad request with a one-line ``RequestError``: whatever value,
dtype or shape a client sends, it never reaches the engine loop that serves everyone else.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import IntEnum

import numpy as np
import torch

from ocria.errors import RequestError
from ocria.runtime import SamplingParams

PERF_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "first_token_time_ns",
                "last_token_time_ns")
FINISH_REASONS = ("", "stop", "length", "cancelled")  # index = Meta.FINISH_REASON code


class Meta(IntEnum):
    """Fields of the engine's ``meta`` output (INT64 [8]) that postprocessing turns into client outputs."""

    KEY = 0  # the engine's request key (postprocessing cancels with it)
    FINAL = 1
    FINISH_REASON = 2  # index into FINISH_REASONS
    DRAFTED = 3
    ACCEPTED = 4
    FIRST_TOKEN_NS = 5
    LAST_TOKEN_NS = 6
    RETURN_PERF = 7


MAX_STOP_WORDS = 32
MAX_STOP_WORD_BYTES = 256
MAX_TEXT_INPUT_BYTES = 64 * 1024

Input = torch.Tensor | np.ndarray
Getter = Callable[[str], "Input | None"]


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _kind(dtype) -> str:
    """NumPy-style dtype kind ('b' bool, 'u' unsigned, 'i' signed, 'f' float, 'O' object) of a torch or NumPy
    dtype."""
    if isinstance(dtype, torch.dtype):
        if dtype == torch.bool:
            return "b"
        if dtype.is_floating_point:
            return "f"
        return "u" if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64) else "i"
    return np.dtype(dtype).kind


def batch_of_one(arr: Input, name: str) -> Input:
    """The single row of a [1, ...] input (shape [] / [n] without batch is accepted as that row)."""
    if arr.ndim < 2:
        return arr
    if arr.shape[0] != 1:
        raise RequestError(f"{name}: batch size {arr.shape[0]}, send one request per document")
    return arr[0]


def scalar(get: Getter, name: str, kinds: str, default=None):
    """One value of a [1, 1] input with dtype kind in ``kinds`` ('i' int, 'u' uint, 'f' float, 'b' bool)."""
    arr = get(name)
    if arr is None:
        return default
    row = batch_of_one(arr, name)
    if math.prod(row.shape) != 1:
        raise RequestError(f"{name}: expected one value, got shape {list(arr.shape)}")
    if _kind(row.dtype) not in kinds:
        raise RequestError(f"{name}: wrong dtype {_dtype_name(row.dtype)}")
    return row.reshape(-1)[0].item()


def strings(get: Getter, name: str, max_count: int, max_bytes: int) -> tuple[str, ...]:
    """UTF-8 strings of a BYTES input (empty tuple when absent): at most ``max_count`` of ``max_bytes`` each."""
    arr = get(name)
    if arr is None:
        return ()
    if _kind(arr.dtype) != "O":
        raise RequestError(f"{name}: wrong dtype {_dtype_name(arr.dtype)}, expected STRING")
    row = batch_of_one(arr, name).reshape(-1)
    if len(row) > max_count:
        raise RequestError(f"{name}: {len(row)} strings, at most {max_count} are accepted")
    out = []
    for item in row:
        if not isinstance(item, (bytes, str)):
            raise RequestError(f"{name}: expected BYTES, got {type(item).__name__}")
        data = item.encode("utf-8") if isinstance(item, str) else item
        if len(data) > max_bytes:
            raise RequestError(f"{name}: a string of {len(data)} bytes, at most {max_bytes} are accepted")
        try:
            out.append(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise RequestError(f"{name}: not valid UTF-8") from None
    return tuple(out)


def image_bytes(get: Getter) -> bytes:
    """The raw image file bytes of ``image_bytes_input`` (UINT8 [1, N])."""
    arr = get("image_bytes_input")
    if arr is None:
        raise RequestError("image_bytes_input is missing: send the image file's bytes as UINT8 [1, N]")
    if _dtype_name(arr.dtype) != "uint8":
        raise RequestError(f"image_bytes_input: wrong dtype {_dtype_name(arr.dtype)}, expected UINT8 raw file bytes")
    row = batch_of_one(arr, "image_bytes_input")
    if math.prod(row.shape) == 0:
        raise RequestError("image_bytes_input: image is empty (0 bytes)")
    return row.reshape(-1).numpy().tobytes() if isinstance(row, torch.Tensor) else row.reshape(-1).tobytes()


def prompt_text(get: Getter) -> str | None:
    """``text_input`` (the instruction), None when absent so the engine's default OCR prompt applies."""
    texts = strings(get, "text_input", 1, MAX_TEXT_INPUT_BYTES)
    return texts[0] if texts and texts[0] else None


def _finite(value: float, name: str) -> float:
    if not math.isfinite(value):
        raise RequestError(f"{name} must be a finite number, got {value}")
    return value


def sampling_params(get: Getter) -> tuple[SamplingParams, bool]:
    """SamplingParams from the TensorRT-LLM-style inputs, and whether max_tokens was given. A UINT64 seed of
    2^63 or more is folded into int64 by two's complement (``SamplingParams.seed`` takes any 64-bit value)."""
    d = SamplingParams()
    max_tokens = scalar(get, "max_tokens", "iu")
    end_id = scalar(get, "end_id", "iu")
    params = SamplingParams(
        max_tokens=d.max_tokens if max_tokens is None else int(max_tokens),
        temperature=_finite(float(scalar(get, "temperature", "f", d.temperature)), "temperature"),
        top_p=_finite(float(scalar(get, "top_p", "f", d.top_p)), "top_p"),
        top_k=int(scalar(get, "top_k", "iu", d.top_k)),
        seed=int(scalar(get, "seed", "iu", d.seed)),
        stop=strings(get, "stop_words", MAX_STOP_WORDS, MAX_STOP_WORD_BYTES),
        stop_token_ids=() if end_id is None or end_id < 0 else (int(end_id),),
    )
    params.check(max_new_tokens=1 << 31)  # any INT32: the engine checks the length against the prompt
    return params, max_tokens is not None


def flag(get: Getter, name: str) -> bool:
    return bool(scalar(get, name, "b", False))
