"""Tensor names and request validation shared by the Triton models and the client.

The client-facing names are the TensorRT-LLM backend's (``text_input``, ``image_bytes_input``,
``max_tokens``, ``stream`` ...), so clients written for that backend work unchanged. The ensemble has
``max_batch_size > 0``: every tensor carries a leading batch dimension, which must be 1 (one document
per request; concurrency comes from the engine's continuous batching, not from request batches).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ocria.errors import RequestError
from ocria.runtime import SamplingParams

ENSEMBLE = "ocria"
ENGINE = "ocria_engine"
PERF_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "first_token_time_ns",
                "last_token_time_ns")

Getter = Callable[[str], "np.ndarray | None"]


def batch_of_one(arr: np.ndarray, name: str) -> np.ndarray:
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
    row = batch_of_one(np.asarray(arr), name)
    if row.size != 1:
        raise RequestError(f"{name}: expected one value, got shape {list(np.shape(arr))}")
    if row.dtype.kind not in kinds:
        raise RequestError(f"{name}: wrong dtype {row.dtype}")
    return row.reshape(-1)[0].item()


def strings(get: Getter, name: str) -> tuple[str, ...]:
    """UTF-8 strings of a BYTES input (empty tuple when absent)."""
    arr = get(name)
    if arr is None:
        return ()
    row = batch_of_one(np.asarray(arr), name).reshape(-1)
    out = []
    for item in row:
        if not isinstance(item, (bytes, str)):
            raise RequestError(f"{name}: expected BYTES, got {type(item).__name__}")
        try:
            out.append(item.decode("utf-8") if isinstance(item, bytes) else item)
        except UnicodeDecodeError:
            raise RequestError(f"{name}: not valid UTF-8") from None
    return tuple(out)


def image_bytes(get: Getter) -> bytes:
    """The raw image file bytes of ``image_bytes_input`` (UINT8 [1, N])."""
    arr = get("image_bytes_input")
    if arr is None:
        raise RequestError("image_bytes_input is missing: send the image file's bytes as UINT8 [1, N]")
    arr = np.asarray(arr)
    if arr.dtype != np.uint8:
        raise RequestError(f"image_bytes_input: wrong dtype {arr.dtype}, expected UINT8 raw file bytes")
    row = batch_of_one(arr, "image_bytes_input")
    if row.size == 0:
        raise RequestError("image_bytes_input: image is empty (0 bytes)")
    return row.reshape(-1).tobytes()


def prompt_text(get: Getter) -> str | None:
    """``text_input`` (the instruction), None when absent so the engine's default OCR prompt applies."""
    texts = strings(get, "text_input")
    if len(texts) > 1:
        raise RequestError(f"text_input: expected one string, got {len(texts)}")
    return texts[0] if texts and texts[0] else None


def sampling_params(get: Getter) -> tuple[SamplingParams, bool]:
    """SamplingParams from the TensorRT-LLM-style inputs, and whether max_tokens was given."""
    d = SamplingParams()
    max_tokens = scalar(get, "max_tokens", "iu")
    end_id = scalar(get, "end_id", "iu")
    params = SamplingParams(
        max_tokens=d.max_tokens if max_tokens is None else int(max_tokens),
        temperature=float(scalar(get, "temperature", "f", d.temperature)),
        top_p=float(scalar(get, "top_p", "f", d.top_p)),
        top_k=int(scalar(get, "top_k", "iu", d.top_k)),
        seed=int(scalar(get, "seed", "iu", d.seed)),
        stop=strings(get, "stop_words"),
        stop_token_ids=() if end_id is None or end_id < 0 else (int(end_id),),
    )
    return params, max_tokens is not None


def flag(get: Getter, name: str) -> bool:
    return bool(scalar(get, name, "b", False))
