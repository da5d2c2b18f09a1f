"""postprocessing: engine responses -> client responses (text_output, output_ids, finish_reason, perf metrics).

Text is detokenized incrementally inside the engine, by the same per-request detokenizer and stop
handling that ``ocria run`` uses: only that stateful position knows which bytes are still held back
(an incomplete UTF-8 character, a possible stop string), so streamed pieces concatenate exactly to the
final text. A stateless model here could not guarantee that. This model shapes the engine's responses
for clients, drops the ones with nothing new (no text, no tokens and not final), and - because Triton 2.51
only forwards an ensemble's cancellation to the steps scheduled after it - tells the engine to cancel a
request when it sees that request cancelled. Numeric tensors go through DLPack (``ocria.serving.tensors``).
"""

import json

import torch
import triton_python_backend_utils as pb_utils

from ocria.serving import ENGINE, tensors
from ocria.serving.protocol import FINISH_REASONS, Meta

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        tensors.check_stub(pb_utils)
        self.strings = tensors.string_inputs(json.loads(args["model_config"]))

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._one(request, sender)
            except Exception as e:  # end the request with an error rather than leave its client waiting
                error = pb_utils.TritonError(f"internal error: {type(e).__name__}: {e}", pb_utils.TritonError.INTERNAL)
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
        return None

    def _one(self, request, sender) -> None:
        get = tensors.reader(pb_utils, request, self.strings)
        meta = get("meta").reshape(-1).tolist()
        if request.is_cancelled():
            self._cancel_engine(meta[Meta.KEY])
            sender.send(flags=FINAL)
            return
        text, ids, final = get("text").reshape(-1), get("output_ids").reshape(1, -1), bool(meta[Meta.FINAL])
        if not text.numel() and not ids.numel() and not final:
            sender.send(flags=FINAL)  # nothing new for the client: end this step silently
            return
        outputs = [tensors.string_output(pb_utils, "text_output", [text.numpy().tobytes()]),
                   tensors.output(pb_utils, "output_ids", ids)]
        if final:
            reason = FINISH_REASONS[meta[Meta.FINISH_REASON]].encode()
            outputs.append(tensors.string_output(pb_utils, "finish_reason", [reason]))
        if final and meta[Meta.RETURN_PERF]:
            drafted, accepted = meta[Meta.DRAFTED], meta[Meta.ACCEPTED]
            outputs += [tensors.output(pb_utils, name, torch.tensor([[value]], dtype=dtype)) for name, value, dtype in (
                ("acceptance_rate", accepted / drafted if drafted else 0.0, torch.float32),
                ("total_accepted_draft_tokens", accepted, torch.int32),
                ("total_draft_tokens", drafted, torch.int32),
                ("first_token_time_ns", meta[Meta.FIRST_TOKEN_NS], torch.int64),
                ("last_token_time_ns", meta[Meta.LAST_TOKEN_NS], torch.int64))]
        sender.send(pb_utils.InferenceResponse(outputs), flags=FINAL)

    @staticmethod
    def _cancel_engine(key: int) -> None:
        cancel = pb_utils.InferenceRequest(
            model_name=ENGINE, requested_output_names=[],
            inputs=[tensors.output(pb_utils, "cancel_key", torch.tensor([[key]], dtype=torch.uint64))])
        for response in cancel.exec(decoupled=True):
            if response.has_error():
                pb_utils.Logger.log_warn(f"cancel of engine request {key}: {response.error().message()}")
