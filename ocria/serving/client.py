"""gRPC client for the ``ocria`` ensemble (tritonclient): streams text, ends on the final-response flag.

The ensemble contains a decoupled step, so every request goes over a gRPC stream, streaming or not;
``stream=False`` yields a single chunk with the whole text. Leaving the iterator early cancels the
request on the server (its sequence slot is freed within the engine's cancellation check period).
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ocria.errors import OcriaError
from ocria.serving import ENSEMBLE
from ocria.serving.protocol import PERF_OUTPUTS


class ServerError(OcriaError):
    """The server refused or failed a request; ``status`` is the gRPC status (e.g. INVALID_ARGUMENT)."""

    def __init__(self, message: str, status: str = ""):
        super().__init__(message)
        self.status = status


@dataclass
class Chunk:
    """One response of a request: its new text and token ids (the whole output when not streaming)."""

    text: str
    final: bool
    finish_reason: str | None = None
    perf: dict = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)


def _input(name: str, value: np.ndarray, dtype: str):
    from tritonclient.grpc import InferInput

    t = InferInput(name, list(value.shape), dtype)
    t.set_data_from_numpy(value)
    return t


def request_inputs(image: bytes, prompt: str | None = None, stream: bool = True, max_tokens: int | None = None,
                   temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                   seed: int | None = None, end_id: int | None = None, stop_words: tuple[str, ...] = (),
                   return_perf_metrics: bool = False) -> list:
    """The ensemble's inputs with the TensorRT-LLM backend's names and shapes ([1, 1] scalars, [1, N] image)."""
    inputs = [_input("image_bytes_input", np.frombuffer(image, np.uint8).reshape(1, -1), "UINT8"),
              _input("stream", np.array([[stream]], bool), "BOOL"),
              _input("return_perf_metrics", np.array([[return_perf_metrics]], bool), "BOOL")]
    if prompt is not None:
        inputs.append(_input("text_input", np.array([[prompt.encode("utf-8")]], np.object_), "BYTES"))
    if seed is not None:  # any signed or unsigned 64-bit seed travels as its UINT64 bit pattern
        if not -(1 << 63) <= seed < 1 << 64:
            raise OcriaError(f"seed must be a 64-bit integer (signed or unsigned), got {seed}")
        seed %= 1 << 64
    for name, value in (("max_tokens", max_tokens), ("top_k", top_k), ("end_id", end_id)):
        if value is not None and not -(1 << 31) <= value < 1 << 31:
            raise OcriaError(f"{name} must fit in INT32, got {value}")
    for name, value, np_type, dtype in (("max_tokens", max_tokens, np.int32, "INT32"),
                                        ("temperature", temperature, np.float32, "FP32"),
                                        ("top_k", top_k, np.int32, "INT32"), ("top_p", top_p, np.float32, "FP32"),
                                        ("seed", seed, np.uint64, "UINT64"), ("end_id", end_id, np.int32, "INT32")):
        if value is not None:
            inputs.append(_input(name, np.array([[value]], np_type), dtype))
    if stop_words:
        inputs.append(_input("stop_words", np.array([[s.encode("utf-8") for s in stop_words]], np.object_), "BYTES"))
    return inputs


class Client:
    """Requests to one server. Safe to share between threads: each thread keeps its own gRPC connection (a
    connection carries one stream at a time) and reuses it for its next requests."""

    def __init__(self, url: str, timeout_s: float = 600.0):
        import tritonclient.grpc as grpcclient

        self.url = url
        self.timeout_s = timeout_s
        self._grpc = grpcclient
        self._local = threading.local()

    def _connection(self):
        """This thread's connection, checked live when it is made."""
        from tritonclient.utils import InferenceServerException

        client = getattr(self._local, "client", None)
        if client is None:
            client = self._grpc.InferenceServerClient(self.url)
            try:
                client.is_server_live()
            except InferenceServerException as e:
                client.close()
                raise ServerError(f"cannot reach a Triton server at {self.url} ({_message(e)})",
                                  "UNAVAILABLE") from None
            self._local.client = client
        return client

    def _drop_connection(self) -> None:
        client = getattr(self._local, "client", None)
        self._local.client = None
        if client is not None:
            client.close()

    def generate(self, image: bytes, model: str = ENSEMBLE, **kwargs) -> Iterator[Chunk]:
        """Yield chunks of text until the final one; raise ServerError on a server-side error."""
        return self.stream(request_inputs(image, **kwargs), model)

    def stream(self, inputs: list, model: str = ENSEMBLE) -> Iterator[Chunk]:
        """Send prepared tritonclient InferInputs over a gRPC stream; yield chunks (new text and token ids) until
        the final one."""
        from tritonclient.utils import InferenceServerException

        responses: queue.Queue = queue.Queue()
        client = self._connection()
        done = failed = False
        try:
            client.start_stream(callback=lambda result, error: responses.put((result, error)))
            client.async_stream_infer(model, inputs, enable_empty_final_response=True)
            while not done:
                try:
                    result, error = responses.get(timeout=self.timeout_s)
                except queue.Empty:
                    failed = True
                    raise OcriaError(f"no response from {self.url} within {self.timeout_s:.0f}s") from None
                if error is not None:
                    done = True
                    raise ServerError(_message(error), error.status() or "")
                done = result.get_response().parameters["triton_final_response"].bool_param
                chunk = _chunk(result, done)
                if chunk.text or chunk.token_ids or done:
                    yield chunk
        except InferenceServerException as e:
            failed = True
            raise ServerError(_message(e), e.status() or "") from None
        finally:
            try:
                client.stop_stream(cancel_requests=not done)
            finally:
                if failed:  # a connection in an unknown state is not reused
                    self._drop_connection()

    def complete(self, image: bytes, **kwargs) -> Chunk:
        """The whole response as one chunk (text concatenated, final fields kept)."""
        parts, last = [], None
        ids: list[int] = []
        for chunk in self.generate(image, **kwargs):
            parts.append(chunk.text)
            ids += chunk.token_ids
            last = chunk
        return Chunk("".join(parts), True, last.finish_reason if last else None, last.perf if last else {}, ids)


def _message(error) -> str:
    """One line; without the "in ensemble 'ocria', " prefix Triton puts before a step's own message."""
    text = " ".join(str(error.message() if hasattr(error, "message") else error).split())
    return re.sub(r"^in ensemble '[^']*', ", "", text)


def _chunk(result, final: bool) -> Chunk:
    names = {o.name for o in result.get_response().outputs}
    text = result.as_numpy("text_output").reshape(-1)[0].decode("utf-8") if "text_output" in names else ""
    reason = result.as_numpy("finish_reason").reshape(-1)[0].decode() if "finish_reason" in names else None
    perf = {n: result.as_numpy(n).reshape(-1)[0].item() for n in PERF_OUTPUTS if n in names}
    ids = result.as_numpy("output_ids").reshape(-1).tolist() if "output_ids" in names else []
    return Chunk(text, final, reason or None, perf, ids)
