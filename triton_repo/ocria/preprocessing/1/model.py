"""preprocessing: image file bytes + optional instruction -> input_ids, pixel_bytes, image_grid_thw.

Loads only the engine's tokenizer and image processor (no weights), so several instances decode images beside
the engine. Tensors come in and go out through DLPack (``ocria.serving.tensors``): right under any NumPy. Bad input
(corrupt/non-image bytes, too many pixels, wrong dtype or shape, out-of-range sampling values) fails only this
request, with INVALID_ARG and a one-line reason.
"""

import json
from pathlib import Path

import torch
import triton_python_backend_utils as pb_utils

from ocria.errors import RequestError
from ocria.runtime import Processor
from ocria.serving import protocol, tensors


class TritonPythonModel:
    def initialize(self, args):
        tensors.check_stub(pb_utils)
        torch.set_num_threads(1)  # instances are the parallelism: one core each, no thread oversubscription
        config = json.loads(args["model_config"])
        self.strings = tensors.string_inputs(config)
        params = config["parameters"]
        engine_dir = Path(params["engine_dir"]["string_value"])
        profile = json.loads((engine_dir / "manifest.json").read_text()).get("profile", {})
        self.processor = Processor.from_engine_dir(engine_dir, int(profile.get("max_image_pixels", 1 << 20)))

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        get = tensors.reader(pb_utils, request, self.strings)
        try:
            protocol.sampling_params(get)
            protocol.flag(get, "stream")
            protocol.flag(get, "return_perf_metrics")
            prompt = self.processor.prepare(protocol.image_bytes(get), protocol.prompt_text(get), as_bytes=True)
        except RequestError as e:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG))
        return pb_utils.InferenceResponse([
            tensors.output(pb_utils, "input_ids", prompt.input_ids[None]),
            tensors.output(pb_utils, "pixel_bytes", prompt.pixel_values[None]),
            tensors.output(pb_utils, "image_grid_thw", prompt.image_grid_thw.to(torch.int64).reshape(1, 3)),
        ])
