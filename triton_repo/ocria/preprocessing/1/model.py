"""preprocessing: image file bytes + optional instruction -> input_ids, pixel_values, image_grid_thw.

Loads only the engine's tokenizer and image processor (no weights), so it can run several instances
beside the engine. Bad input (corrupt/non-image bytes, too many pixels, wrong shape, out-of-range
sampling values) fails only this request, with INVALID_ARG and a one-line reason.
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from ocria.errors import RequestError
from ocria.runtime import Processor
from ocria.serving import protocol


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        engine_dir = Path(params["engine_dir"]["string_value"])
        profile = json.loads((engine_dir / "manifest.json").read_text()).get("profile", {})
        self.processor = Processor.from_engine_dir(engine_dir, int(profile.get("max_image_pixels", 1 << 20)))

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        def get(name):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

        try:
            protocol.sampling_params(get)[0].check(max_new_tokens=1 << 30)  # the engine checks the length
            prompt = self.processor.prepare(protocol.image_bytes(get), protocol.prompt_text(get))
        except RequestError as e:
            error = pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG)
            return pb_utils.InferenceResponse(error=error)
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("input_ids", prompt.input_ids.numpy().astype(np.int64)[None]),
            pb_utils.Tensor("pixel_values", prompt.pixel_values.numpy().astype(np.float32)[None]),
            pb_utils.Tensor("image_grid_thw", prompt.image_grid_thw.numpy().astype(np.int64).reshape(1, 3)),
        ])
