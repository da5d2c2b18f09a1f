"""An ocria engine as an NVIDIA Dynamo worker: OpenAI chat completions with an image, served by the same
continuous-batching ``EngineLoop`` as the Triton engine model.

The worker registers as ``ModelInput.Text`` + ``ModelType.Chat``: Dynamo's frontend forwards each
``/v1/chat/completions`` request body as a dict, so the worker gets the image (an ``image_url`` data URI)
and the instruction as sent and prepares the prompt with the engine's own processor, exactly as ``ocria run``
and the Triton path do. It yields ``chat.completion.chunk`` dicts; the frontend streams them or, for a
non-streaming request, folds them into one ``chat.completion``. A bad request raises Dynamo's
``InvalidArgument``: HTTP 400 with the one-line reason.

Run one per GPU with ``ocria serve --frontend dynamo`` (it sets the discovery variables), or by hand on another
machine of the same deployment: ``python -m ocria.serving.dynamo_worker --engine DIR --device cuda``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import importlib
import importlib.util
import itertools
import os
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from ocria.deps import require
from ocria.errors import OcriaError, RequestError
from ocria.runtime import SamplingParams
from ocria.serving import ENSEMBLE
from ocria.serving.engine_loop import EngineLoop
from ocria.serving.protocol import MAX_STOP_WORD_BYTES, MAX_STOP_WORDS, MAX_TEXT_INPUT_BYTES

DYNAMO_INSTALL = "pip install 'ocria[dynamo]' && pip install --no-deps ai-dynamo==1.6.1"
NAMESPACE = "ocria"
ENDPOINT = f"{NAMESPACE}.worker.generate"
READY_LINE = "ocria dynamo worker ready"  # printed once registered, for whoever started the worker
MAX_IMAGE_BYTES = 64 << 20
FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


def require_dynamo(purpose: str) -> None:
    """One line naming both install steps unless NVIDIA Dynamo's two halves import: ai-dynamo-runtime (the
    ``dynamo`` extra: dynamo.llm, dynamo.runtime) and ai-dynamo (installed without its dependencies: the frontend)."""
    try:
        importlib.import_module("dynamo.llm")
        missing = [m for m in ("dynamo.frontend", "dynamo.common") if importlib.util.find_spec(m) is None]
    except ImportError as e:
        missing = [f"dynamo.llm ({e})"]
    if missing:
        raise OcriaError(f"{purpose} needs NVIDIA Dynamo, and {', '.join(missing)} is missing: {DYNAMO_INSTALL}")


@dataclass(frozen=True)
class ChatRequest:
    """The parts of an OpenAI chat-completions request that ocria serves."""

    image: bytes
    prompt: str | None  # None: the engine's default OCR instruction
    params: SamplingParams
    max_tokens_given: bool


def _number(body: dict, name: str, kind: type, default):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise RequestError(f"{name} must be a{'n integer' if kind is int else ' number'}, got {value!r}")
    return kind(value)


def _image(url: object) -> bytes:
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        raise RequestError("image_url must be a data URI (data:image/png;base64,...); the worker fetches nothing")
    data = url.split(";base64,", 1)[1]
    if len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise RequestError(f"image is larger than {MAX_IMAGE_BYTES} bytes")
    try:
        image = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError("image_url: the data URI is not valid base64") from None
    if not image:
        raise RequestError("image_url: image is empty (0 bytes)")
    return image


def parse_chat(body: dict) -> ChatRequest:
    """The image, instruction and sampling parameters of a chat request: one user message with exactly one
    ``image_url`` part and optional text parts (their text is the instruction). RequestError for anything else."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list")
    if len(messages) != 1 or not isinstance(messages[0], dict) or messages[0].get("role") != "user":
        raise RequestError("ocria reads one document a request: send a single user message")
    content = messages[0].get("content")
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if not isinstance(parts, list):
        raise RequestError("message content must be a string or a list of parts")
    images, texts = [], []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url" and isinstance(part.get("image_url"), dict):
            images.append(part["image_url"].get("url"))
        else:
            raise RequestError(f"unsupported content part {kind!r}: send text and image_url parts")
    if len(images) != 1:
        raise RequestError(f"send exactly one image_url part per request (got {len(images)})")
    prompt = "\n".join(t for t in texts if t) or None
    if prompt is not None and len(prompt.encode("utf-8")) > MAX_TEXT_INPUT_BYTES:
        raise RequestError(f"the instruction is longer than {MAX_TEXT_INPUT_BYTES} bytes")
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise RequestError("stop must be a string or a list of strings")
    if len(stop) > MAX_STOP_WORDS or any(len(s.encode("utf-8")) > MAX_STOP_WORD_BYTES for s in stop):
        raise RequestError(f"stop: at most {MAX_STOP_WORDS} strings of {MAX_STOP_WORD_BYTES} bytes each")
    if body.get("n") not in (None, 1):
        raise RequestError("n must be 1")
    ignore_eos = body.get("ignore_eos", False)  # generate exactly max_tokens (benchmarks); the frontend passes it
    if not isinstance(ignore_eos, bool):
        raise RequestError(f"ignore_eos must be true or false, got {ignore_eos!r}")
    d = SamplingParams()
    max_tokens = _number(body, "max_completion_tokens", int, None)
    max_tokens = _number(body, "max_tokens", int, max_tokens)
    params = SamplingParams(max_tokens=d.max_tokens if max_tokens is None else max_tokens,
                            temperature=_number(body, "temperature", float, d.temperature),
                            top_p=_number(body, "top_p", float, d.top_p),
                            top_k=_number(body, "top_k", int, d.top_k),
                            seed=_number(body, "seed", int, d.seed), stop=tuple(stop), ignore_eos=ignore_eos)
    params.check(max_new_tokens=1 << 31)  # the engine checks the length against the prompt
    return ChatRequest(_image(images[0]), prompt, params, max_tokens is not None)


def _chunk(rid: str, model: str, fingerprint: str, text: str | None, ids: list[int], finish: str | None = None,
           usage: dict | None = None) -> dict:
    """A ``chat.completion.chunk``; ``nvext.token_ids`` (Dynamo's extension field) carries the chunk's token ids,
    as the Triton path's ``output_ids`` does."""
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
             "system_fingerprint": fingerprint,
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": text} if text is not None else {},
                          "finish_reason": finish}]}
    if ids:
        chunk["nvext"] = {"token_ids": ids}
    if usage is not None:
        chunk["usage"] = usage
    return chunk


class ChatHandler:
    """Turns chat requests into EngineLoop submissions and the loop's events into chunks: one per engine step
    when streaming, else one with the whole text (the frontend folds chunks into one ``chat.completion``, but keeps
    only the last ``nvext``). The last chunk has the finish reason and ``usage``."""

    def __init__(self, engine, loop: EngineLoop, model: str, invalid: type[Exception], poll_s: float = 0.1):
        self.engine = engine
        self.loop = loop
        self.model = model
        self.invalid = invalid  # Dynamo's InvalidArgument: the frontend answers HTTP 400 with its message
        self.poll_s = poll_s
        self.fingerprint = f"ocria-{secrets.token_hex(4)}"  # this worker's: which worker served a request shows
        self._ids = itertools.count(1)

    def _submit(self, body: dict, on_item) -> tuple[int, int]:
        """Queue the request; its loop key and its prompt's length in tokens."""
        req = parse_chat(body)
        prompt = self.engine.processor.prepare(req.image, req.prompt, as_bytes=True)
        params = req.params
        if not req.max_tokens_given:  # as the Triton path: the default fills at most the room left
            room = self.engine.max_seq_len - prompt.input_ids.numel()
            params.max_tokens = max(1, min(params.max_tokens, room))
        self.engine.check(prompt, params)
        return self.loop.submit(prompt, params, on_item), prompt.input_ids.numel()

    async def generate(self, body: dict, context=None) -> AsyncIterator[dict]:
        aio = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def on_item(event, error) -> None:  # the loop's sender thread
            aio.call_soon_threadsafe(queue.put_nowait, (event, error))

        try:
            key, prompt_tokens = self._submit(body, on_item)
        except RequestError as e:
            raise self.invalid(str(e)) from None
        stream = body.get("stream") is True
        rid = f"chatcmpl-{self.fingerprint}-{next(self._ids)}"
        parts, ids, done = [], [], False
        try:
            while not done:
                try:
                    event, error = await asyncio.wait_for(queue.get(), self.poll_s)
                except asyncio.TimeoutError:
                    if context is not None and context.is_stopped():
                        return  # the client went away: finally cancels the request
                    continue
                if error is not None:
                    done = True
                    raise self.invalid(str(error)) if isinstance(error, RequestError) else OcriaError(str(error))
                done = event.finished
                parts.append(event.text)
                ids += event.token_ids
                if stream and (event.text or event.token_ids):
                    yield _chunk(rid, self.model, self.fingerprint, event.text, list(event.token_ids))
            if not stream:
                yield _chunk(rid, self.model, self.fingerprint, "".join(parts), ids)
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids),
                     "total_tokens": prompt_tokens + len(ids)}
            yield _chunk(rid, self.model, self.fingerprint, None, [], FINISH[event.finish_reason or "stop"], usage)
        finally:
            if not done:
                self.loop.cancel(key)


@dataclass(frozen=True)
class WorkerOptions:
    engine: Path
    device: str = "cpu"  # cpu | cuda | cuda:N
    max_batch: int | None = None  # default: the engine profile's
    model_name: str = ENSEMBLE
    endpoint: str = ENDPOINT


async def serve(opts: WorkerOptions) -> None:
    """Load the engine, register the model with Dynamo's discovery and serve until SIGTERM/SIGINT (which
    unregister the worker first, so the frontend stops routing to it). A dead engine loop stops the worker the
    same way: its open requests have their errors, and the frontend routes to the other workers."""
    require_dynamo("the ocria Dynamo worker")
    import torch
    from dynamo.common.utils.graceful_shutdown import install_signal_handlers
    from dynamo.llm import ModelInput, ModelType, WorkerType, register_model
    from dynamo.llm.exceptions import InvalidArgument
    from dynamo.runtime import DistributedRuntime

    from ocria.runtime import load_engine

    torch.set_grad_enabled(False)
    engine = load_engine(opts.engine, device=opts.device)
    loop = EngineLoop(engine, opts.max_batch, on_death=lambda _: os.kill(os.getpid(), signal.SIGTERM)).start()
    aio = asyncio.get_running_loop()
    runtime = DistributedRuntime(aio, os.environ.get("DYN_DISCOVERY_BACKEND", "file"),
                                 os.environ.get("DYN_REQUEST_PLANE", "tcp"))
    endpoint = runtime.endpoint(opts.endpoint)
    install_signal_handlers(aio, runtime, [endpoint], grace_period_s=0)
    await register_model(ModelInput.Text, ModelType.Chat, endpoint, opts.model_name, opts.model_name,
                         worker_type=WorkerType.Aggregated, skip_model_assets=True)
    handler = ChatHandler(engine, loop, opts.model_name, InvalidArgument)
    print(f"{READY_LINE}: model '{opts.model_name}' on {opts.device} (pid {os.getpid()}, instance "
          f"{endpoint.connection_id():x})", flush=True)
    try:
        await endpoint.serve_endpoint(handler.generate, graceful_shutdown=True)
    finally:
        loop.stop()
    if loop.error is not None:
        raise OcriaError(f"engine loop died: {loop.error}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ocria.serving.dynamo_worker",
                                description="one ocria engine as an NVIDIA Dynamo worker (discovery from DYN_* "
                                            "variables; default: file discovery, TCP request plane)")
    p.add_argument("--engine", required=True, type=Path, help="engine directory (from ocria-build engine)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--max-batch", type=int, help="max batch size (default: the engine profile's)")
    p.add_argument("--model-name", default=ENSEMBLE, help="the name clients put in 'model'")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        uvloop = require("uvloop", "dynamo", "the ocria Dynamo worker")
        uvloop.run(serve(WorkerOptions(args.engine, args.device, args.max_batch, args.model_name)))
    except OcriaError as e:
        print(f"ocria dynamo worker: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
