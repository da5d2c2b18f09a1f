"""How a request is sent: the ``Backend`` protocol and its two implementations, Triton's ``ocria`` ensemble over
gRPC and an OpenAI-compatible chat completions server over HTTP. The measurement code sees only ``Reply`` objects."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from ocria.bench.serve.config import RequestParams
from ocria.errors import OcriaError


class Reply(Protocol):
    """One response of a request: its new text and the token ids new in it (empty if the server sends none). A
    reply that knows which engine served it (an OpenAI ``system_fingerprint``) also has ``served_by``."""

    text: str
    token_ids: list[int]
    finish_reason: str | None


class Backend(Protocol):
    """Sends requests to one server; each sending thread gets its own instance (``BackendFactory``)."""

    name: str

    def check(self) -> None:
        """Raise OcriaError (one line, naming the server) unless the server is up and serving the model."""

    def send(self, image: bytes, params: RequestParams, seed: int) -> Iterator[Reply]:
        """Send one request; yield its responses until the last; raise OcriaError if it fails."""


BackendFactory = Callable[[], Backend]


class TritonBackend:
    """The ``ocria`` ensemble of a Triton Inference Server over gRPC (``ocria.serving.client``)."""

    name = "triton-grpc"

    def __init__(self, url: str, timeout_s: float):
        """Args:
            url: the server's gRPC address HOST:PORT.
            timeout_s: seconds to wait for each response of a request.
        """
        from ocria.serving.client import Client

        self.url = url
        self.timeout_s = timeout_s
        self._client = Client(url, timeout_s)

    def check(self) -> None:
        """Raise OcriaError unless the server at ``url`` is live and its ``ocria`` model is ready."""
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        from ocria.serving import ENSEMBLE

        timeout = min(self.timeout_s, 10.0)
        try:
            client = grpcclient.InferenceServerClient(self.url)
        except (InferenceServerException, ValueError) as e:
            raise OcriaError(f"--url {self.url}: not a gRPC address HOST:PORT ({one_line(e)})") from None
        try:
            try:
                live = client.is_server_live(client_timeout=timeout)
            except InferenceServerException as e:
                raise OcriaError(f"cannot reach a Triton server at {self.url} ({one_line(e)})") from None
            if not live:
                raise OcriaError(f"the Triton server at {self.url} is not live")
            if not client.is_model_ready(ENSEMBLE, client_timeout=timeout):
                raise OcriaError(f"the Triton server at {self.url} has no ready model '{ENSEMBLE}'")
        finally:
            client.close()

    def send(self, image: bytes, params: RequestParams, seed: int) -> Iterator[Reply]:
        """Yield the ensemble's chunks (``ocria.serving.client.Chunk``) for one request."""
        return self._client.generate(image, prompt=params.prompt, stream=params.stream, max_tokens=params.max_tokens,
                                     temperature=params.temperature, seed=seed)


@dataclass
class ChatReply:
    """One chunk of an OpenAI chat completion."""

    text: str
    token_ids: list[int]
    finish_reason: str | None
    served_by: str | None = None  # its ``system_fingerprint``: ocria's Dynamo workers name themselves there


def _image_type(image: bytes) -> str:
    if image.startswith(b"\x89PNG"):
        return "image/png"
    if image.startswith(b"\xff\xd8"):
        return "image/jpeg"
    if image[:4] == b"RIFF" and image[8:12] == b"WEBP":
        return "image/webp"
    return "application/octet-stream"


class OpenAIBackend:
    """An OpenAI-compatible ``/v1/chat/completions`` server (``ocria serve --frontend dynamo``): the image goes as a
    data URI. Token ids come from each chunk's ``nvext.token_ids`` (ocria's Dynamo workers send them); a server that
    sends none gives null token numbers."""

    name = "openai-chat"

    def __init__(self, url: str, timeout_s: float, model: str = "ocria"):
        """Args:
            url: the server's base URL, http://HOST:PORT (http:// is added to a bare HOST:PORT).
            timeout_s: seconds to wait for each response of a request.
            model: the ``model`` of each request.
        """
        self.url = (url if "://" in url else f"http://{url}").rstrip("/")
        self.timeout_s = timeout_s
        self.model = model

    def check(self) -> None:
        """Raise OcriaError unless ``/v1/models`` of the server lists ``model``."""
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=min(self.timeout_s, 10.0)) as r:
                models = [m.get("id") for m in json.loads(r.read()).get("data", [])]
        except (OSError, ValueError) as e:
            raise OcriaError(f"cannot reach an OpenAI-compatible server at {self.url} ({one_line(e)})") from None
        if self.model not in models:
            raise OcriaError(f"the server at {self.url} serves no model '{self.model}' (it lists {models})")

    def send(self, image: bytes, params: RequestParams, seed: int) -> Iterator[Reply]:
        """Yield the chunks of one chat completion (one for a non-streaming request)."""
        content = [{"type": "image_url", "image_url": {
            "url": f"data:{_image_type(image)};base64,{base64.b64encode(image).decode()}"}}]
        if params.prompt is not None:
            content.insert(0, {"type": "text", "text": params.prompt})
        body = {"model": self.model, "messages": [{"role": "user", "content": content}], "stream": params.stream,
                "seed": seed}
        if params.max_tokens is not None:
            body["max_tokens"] = params.max_tokens
        if params.temperature is not None:
            body["temperature"] = params.temperature
        request = urllib.request.Request(f"{self.url}/v1/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as r:
                if not params.stream:
                    yield self._reply(json.loads(r.read()), "message")
                    return
                for line in r:
                    data = line.decode("utf-8").strip()
                    if not data.startswith("data:"):
                        continue
                    data = data[len("data:"):].strip()
                    if data == "[DONE]":
                        return
                    yield self._reply(json.loads(data), "delta")
        except urllib.error.HTTPError as e:
            raise OcriaError(f"HTTP {e.code}: {_error_message(e.read())}") from None
        except (OSError, ValueError) as e:
            raise OcriaError(f"{self.url}: {one_line(e)}") from None

    @staticmethod
    def _reply(chunk: dict, part: str) -> ChatReply:
        if "error" in chunk:
            raise OcriaError(_error_message(json.dumps(chunk)))
        choice = (chunk.get("choices") or [{}])[0]
        ids = (chunk.get("nvext") or {}).get("token_ids") or []
        return ChatReply((choice.get(part) or {}).get("content") or "", list(ids), choice.get("finish_reason"),
                         chunk.get("system_fingerprint"))


def backend_factory(kind: str, url: str, timeout_s: float) -> BackendFactory:
    """A factory of ``--backend kind``'s backends.

    Args:
        kind: ``triton`` or ``openai``.
        url: the server's address (``--url``).
        timeout_s: seconds to wait for each response of a request.
    Returns:
        A callable making a new Backend each call (one per sending thread).
    """
    if kind == "openai":
        return lambda: OpenAIBackend(url, timeout_s)
    return lambda: TritonBackend(url, timeout_s)


def _error_message(body: bytes | str) -> str:
    """The message of an OpenAI-style error body (``{"error": {"message"}}`` or ``{"message"}``)."""
    try:
        doc = json.loads(body)
        error = doc.get("error", doc)
        return one_line(str(error.get("message", error)))
    except (ValueError, AttributeError):
        return one_line(body.decode("utf-8", "replace") if isinstance(body, bytes) else body)


def one_line(error: BaseException) -> str:
    """An error's message on one line (whitespace runs become one space)."""
    return " ".join(str(error).split())

