"""postprocessing: engine responses -> client responses (text_output, finish_reason, perf metrics).

Text is detokenized incrementally inside the engine, by the same per-request detokenizer and stop
handling that ``ocria run`` uses: only that stateful position knows which bytes are still held back
(an incomplete UTF-8 character, a possible stop string), so streamed pieces concatenate exactly to the
final text. A stateless model here could not guarantee that. This model shapes the engine's responses
for clients, drops the ones with nothing new (no text and not final), and - because Triton 2.51 only
forwards an ensemble's cancellation to the steps scheduled after it - tells the engine to cancel a
request when it sees that request cancelled.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

from ocria.serving import protocol

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _value(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
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
        if request.is_cancelled():
            self._cancel_engine(int(_value(request, "request_key")))
            sender.send(flags=FINAL)
            return
        text = _value(request, "text", b"")
        final = bool(_value(request, "final", False))
        if not text and not final:
            sender.send(flags=FINAL)  # nothing new for the client: end this step silently
            return
        outputs = [pb_utils.Tensor("text_output", np.array([[text]], dtype=np.object_))]
        if final:
            reason = _value(request, "finish_reason", b"")
            outputs.append(pb_utils.Tensor("finish_reason", np.array([[reason]], np.object_)))
        if final and bool(_value(request, "return_perf_metrics", False)):
            drafted = int(_value(request, "num_draft_tokens"))
            accepted = int(_value(request, "num_accepted_draft_tokens"))
            outputs += [
                pb_utils.Tensor("acceptance_rate", np.array([[accepted / drafted if drafted else 0.0]], np.float32)),
                pb_utils.Tensor("total_accepted_draft_tokens", np.array([[accepted]], np.int32)),
                pb_utils.Tensor("total_draft_tokens", np.array([[drafted]], np.int32)),
            ] + [pb_utils.Tensor(n, np.array([[int(_value(request, n))]], np.int64))
                 for n in ("first_token_time_ns", "last_token_time_ns")]
        sender.send(pb_utils.InferenceResponse(outputs), flags=FINAL)

    @staticmethod
    def _cancel_engine(key: int) -> None:
        cancel = pb_utils.InferenceRequest(
            model_name=protocol.ENGINE, requested_output_names=[],
            inputs=[pb_utils.Tensor("cancel_key", np.array([[key]], np.uint64))])
        for response in cancel.exec(decoupled=True):
            if response.has_error():
                pb_utils.Logger.log_warn(f"cancel of engine request {key}: {response.error().message()}")
