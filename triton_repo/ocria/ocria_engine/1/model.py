"""ocria_engine: the ocria runtime behind one background continuous-batching loop (decoupled).

execute() only validates and queues; the loop thread steps the scheduler for all requests at once and
streams each request's events through its response sender. Every request ends with the
TRITONSERVER_RESPONSE_COMPLETE_FINAL flag - finished, failed, or cancelled (by the client directly, or
by postprocessing via a {cancel_key} control request for ensemble requests). If the loop dies, open
requests get an error and the model unloads itself, so readiness turns false instead of clients hanging.
Tensors come in and go out through DLPack (``ocria.serving.tensors``): right under any NumPy.
"""

import json
import threading
import time

import torch
import triton_python_backend_utils as pb_utils

from ocria.errors import OcriaError
from ocria.runtime import PreparedPrompt, load_engine
from ocria.serving import ENSEMBLE, protocol, tensors
from ocria.serving.engine_loop import EngineLoop, EngineUnavailable
from ocria.serving.metrics import ServingMetrics
from ocria.serving.protocol import FINISH_REASONS, Meta

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _error(message: str, code=None):
    code = pb_utils.TritonError.INVALID_ARG if code is None else code
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def _utf8(text: str) -> torch.Tensor:
    data = text.encode("utf-8")
    return (torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8))[None]


class _Stream:
    """One request's response side: streams deltas or collects them for a single final response."""

    def __init__(self, request, key: int, stream: bool, perf: bool, keepalive_s: float):
        self.sender = request.get_response_sender()
        self.key = key
        self.stream = stream
        self.perf = perf
        self.keepalive_s = keepalive_s
        self.last_sent = time.perf_counter()
        self.parts: list[str] = []
        self.ids: list[int] = []

    def __call__(self, event, error):
        if error is not None:
            code = pb_utils.TritonError.UNAVAILABLE if isinstance(error, EngineUnavailable) else None
            self.sender.send(_error(str(error), code), flags=FINAL)
            return
        if event.finished or self.stream:
            text, ids = event.text, event.token_ids
            if not self.stream:
                text, ids = "".join(self.parts) + text, self.ids + ids
            if text or ids or event.finished:
                self._send(text, ids, event)
        else:
            self.parts.append(event.text)
            self.ids += event.token_ids
            # keep-alive (nothing new) so that postprocessing gets to see a cancelled ensemble request
            if time.perf_counter() - self.last_sent >= self.keepalive_s:
                self._send("", [], event)

    def _send(self, text: str, ids: list[int], event) -> None:
        s = event.stats
        meta = [0] * len(Meta)
        meta[Meta.KEY], meta[Meta.FINAL], meta[Meta.RETURN_PERF] = self.key, int(event.finished), int(self.perf)
        meta[Meta.FINISH_REASON] = FINISH_REASONS.index(event.finish_reason or "")
        if s is not None:
            meta[Meta.DRAFTED], meta[Meta.ACCEPTED] = s.num_draft_tokens, s.num_accepted_draft_tokens
            meta[Meta.FIRST_TOKEN_NS], meta[Meta.LAST_TOKEN_NS] = s.first_token_time_ns, s.last_token_time_ns
        outputs = [tensors.output(pb_utils, "text", _utf8(text)),
                   tensors.output(pb_utils, "output_ids", torch.tensor([ids], dtype=torch.int32)),
                   tensors.output(pb_utils, "meta", torch.tensor([meta], dtype=torch.int64))]
        self.last_sent = time.perf_counter()
        try:
            self.sender.send(pb_utils.InferenceResponse(outputs), flags=FINAL if event.finished else 0)
        except pb_utils.TritonModelException:
            if event.finish_reason != "cancelled":  # a cancelled request's sender may already be closed
                raise


class TritonPythonModel:
    def initialize(self, args):
        tensors.check_stub(pb_utils)
        config = json.loads(args["model_config"])
        self.strings = tensors.string_inputs(config)
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        self.model_name = args["model_name"]
        device = params["device"]
        if device == "cuda" and args.get("model_instance_kind") == "GPU":
            device = f"cuda:{args['model_instance_device_id']}"
        torch.set_grad_enabled(False)
        self.engine = load_engine(params["engine_dir"], device=device)
        max_batch = int(params["scheduler_max_batch_size"])
        self.cancel_period_s = int(params["cancellation_check_period_ms"]) / 1000.0
        self.metrics = ServingMetrics(pb_utils, self.model_name, args.get("model_instance_name", self.model_name),
                                      str(self.engine.device))
        self.loop = EngineLoop(self.engine, max_batch or None, self.cancel_period_s, self.metrics,
                               on_death=self._on_death).start()

    def _on_death(self, reason: str) -> None:
        pb_utils.Logger.log_error(f"ocria engine loop died ({reason}); unloading {self.model_name}")
        # From another thread: unload waits for this instance to finalize, which must not block the loop.
        threading.Thread(target=pb_utils.unload_model, args=(self.model_name,), daemon=True).start()

    def execute(self, requests):
        for request in requests:
            try:
                self._one(request)
            except OcriaError as e:
                request.get_response_sender().send(_error(str(e)), flags=FINAL)
            except Exception as e:  # a bug must still end the request, never leave its client waiting
                message = f"internal error: {type(e).__name__}: {e}"
                request.get_response_sender().send(_error(message, pb_utils.TritonError.INTERNAL), flags=FINAL)
        return None

    def _one(self, request) -> None:
        get = tensors.reader(pb_utils, request, self.strings)
        cancel_key = protocol.scalar(get, "cancel_key", "u")
        if cancel_key is not None:  # control request from postprocessing
            self.loop.cancel(int(cancel_key))
            request.get_response_sender().send(flags=FINAL)
            return
        if not self.loop.alive:
            raise OcriaError(f"engine loop is not running: {self.loop.error}")
        prompt = self._prompt(get)
        self._check_prompt(prompt)
        params, given = protocol.sampling_params(get)
        if not given:
            room = self.engine.max_seq_len - prompt.input_ids.numel()
            params.max_tokens = max(1, min(params.max_tokens, room))
        self.engine.check(prompt, params)
        stream = protocol.flag(get, "stream")
        key = self.loop.new_key()
        sink = _Stream(request, key, stream, protocol.flag(get, "return_perf_metrics"), self.cancel_period_s)
        self.loop.submit(prompt, params, sink, request.is_cancelled, key)

    @staticmethod
    def _prompt(get) -> PreparedPrompt:
        """The prompt tensors, copied out of the request's memory (the loop uses them after execute returns)."""
        arrays = {n: get(n) for n in ("input_ids", "pixel_bytes", "image_grid_thw")}
        missing = [n for n, a in arrays.items() if a is None]
        if missing:
            raise OcriaError(f"missing inputs {missing}: send requests to the '{ENSEMBLE}' model")
        ids, pixels, grid = (protocol.batch_of_one(a, n) for n, a in arrays.items())
        if ids.numel() == 0 or pixels.numel() == 0 or grid.numel() != 3 or pixels.dim() != 2:
            raise OcriaError("empty or malformed prompt or image inputs")
        return PreparedPrompt(input_ids=ids.to(torch.int64, copy=True), pixel_values=pixels.clone(),
                              image_grid_thw=grid.to(torch.int64, copy=True).reshape(1, 3))

    def _check_prompt(self, prompt: PreparedPrompt) -> None:
        """Refuse inconsistent prompt tensors here: inside the shared loop they would fail every request."""
        ids, grid = prompt.input_ids, prompt.image_grid_thw
        vocab = self.engine.target.text_config.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise OcriaError(f"input_ids outside the vocabulary [0, {vocab})")
        proc = self.engine.processor
        t, h, w = grid.tolist()[0]
        patches = t * h * w
        if min(t, h, w) <= 0 or h % proc.merge or w % proc.merge or prompt.pixel_values.shape != (
                patches, proc.patch_dim):
            raise OcriaError(f"pixel_bytes {list(prompt.pixel_values.shape)} do not match image_grid_thw "
                             f"{grid.tolist()[0]}")
        if int((ids == proc.image_token_id).sum()) != patches // proc.merge**2:
            raise OcriaError("the number of image tokens in input_ids does not match image_grid_thw")

    def finalize(self):
        self.loop.stop()
