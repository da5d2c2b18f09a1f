"""ocria_engine: the ocria runtime behind one background continuous-batching loop (decoupled).

execute() only validates and queues; the loop thread steps the scheduler for all requests at once and
streams each request's events through its response sender. Every request ends with the
TRITONSERVER_RESPONSE_COMPLETE_FINAL flag - finished, failed, or cancelled (by the client directly, or
by postprocessing via a {cancel_key} control request for ensemble requests). If the loop dies, open
requests get an error and the model unloads itself, so readiness turns false instead of clients hanging.
"""

import json
import threading
import time

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from ocria.errors import OcriaError
from ocria.runtime import PreparedPrompt, load_engine
from ocria.serving import protocol
from ocria.serving.engine_loop import EngineLoop, EngineUnavailable
from ocria.serving.metrics import ServingMetrics

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _error(message: str, code=None):
    code = pb_utils.TritonError.INVALID_ARG if code is None else code
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


class _Stream:
    """One request's response side: streams deltas or collects them for a single final response."""

    def __init__(self, request, key: int, stream: bool, perf: bool, keepalive_s: float):
        self.sender = request.get_response_sender()
        self.key = np.array([[key]], np.uint64)
        self.stream = stream
        self.perf = np.array([[perf]], bool)
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
            # keep-alive (empty text) so that postprocessing gets to see a cancelled ensemble request
            if time.perf_counter() - self.last_sent >= self.keepalive_s:
                self._send("", [], event)

    def _send(self, text: str, ids: list[int], event) -> None:
        s = event.stats
        outputs = [
            pb_utils.Tensor("text", np.array([[text.encode("utf-8")]], np.object_)),
            pb_utils.Tensor("output_ids", np.array([ids], np.int32)),
            pb_utils.Tensor("final", np.array([[event.finished]], bool)),
            pb_utils.Tensor("request_key", self.key),
            pb_utils.Tensor("finish_reason", np.array([[(event.finish_reason or "").encode()]], np.object_)),
            pb_utils.Tensor("return_perf_metrics", self.perf),
            pb_utils.Tensor("num_draft_tokens", np.array([[s.num_draft_tokens if s else 0]], np.int32)),
            pb_utils.Tensor("num_accepted_draft_tokens",
                            np.array([[s.num_accepted_draft_tokens if s else 0]], np.int32)),
            pb_utils.Tensor("first_token_time_ns", np.array([[s.first_token_time_ns if s else 0]], np.int64)),
            pb_utils.Tensor("last_token_time_ns", np.array([[s.last_token_time_ns if s else 0]], np.int64)),
        ]
        self.last_sent = time.perf_counter()
        try:
            self.sender.send(pb_utils.InferenceResponse(outputs), flags=FINAL if event.finished else 0)
        except pb_utils.TritonModelException:
            if event.finish_reason != "cancelled":  # a cancelled request's sender may already be closed
                raise


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        self.model_name = args["model_name"]
        device = params["device"]
        if device == "cuda" and args.get("model_instance_kind") == "GPU":
            device = f"cuda:{args['model_instance_device_id']}"
        torch.set_grad_enabled(False)
        self.engine = load_engine(params["engine_dir"], device=device)
        max_batch = int(params["scheduler_max_batch_size"])
        self.cancel_period_s = int(params["cancellation_check_period_ms"]) / 1000.0
        self.metrics = ServingMetrics(pb_utils, self.model_name)
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
        def get(name):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

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
        arrays = {n: get(n) for n in ("input_ids", "pixel_values", "image_grid_thw")}
        missing = [n for n, a in arrays.items() if a is None]
        if missing:
            raise OcriaError(f"missing inputs {missing}: send requests to the '{protocol.ENSEMBLE}' model")
        ids, pixels, grid = (protocol.batch_of_one(a, n) for n, a in arrays.items())
        if ids.size == 0 or pixels.size == 0 or grid.size != 3:
            raise OcriaError("empty prompt or image inputs")
        return PreparedPrompt(input_ids=torch.from_numpy(ids.astype(np.int64)),
                              pixel_values=torch.from_numpy(pixels.astype(np.float32)),
                              image_grid_thw=torch.from_numpy(grid.astype(np.int64)).reshape(1, 3))

    def _check_prompt(self, prompt: PreparedPrompt) -> None:
        """Refuse inconsistent prompt tensors here: inside the shared loop they would fail every request."""
        ids, grid = prompt.input_ids, prompt.image_grid_thw
        vocab = self.engine.target.text_config.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise OcriaError(f"input_ids outside the vocabulary [0, {vocab})")
        proc = self.engine.processor
        patches = int(grid.prod())
        if int(grid.min()) <= 0 or patches % proc.merge**2 or prompt.pixel_values.shape[0] != patches:
            raise OcriaError(f"pixel_values {list(prompt.pixel_values.shape)} do not match image_grid_thw "
                             f"{grid.tolist()[0]}")
        if int((ids == proc.image_token_id).sum()) != patches // proc.merge**2:
            raise OcriaError("the number of image tokens in input_ids does not match image_grid_thw")

    def finalize(self):
        self.loop.stop()
