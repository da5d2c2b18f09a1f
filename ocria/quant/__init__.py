"""Workload-aware mixed precision (BF16 / FP8 / NVFP4) with NVIDIA ModelOpt.

- ``recipe``: YAML glob -> format rules (``configs/quant/*.yaml``), checked before any work.
- ``modelopt_cfg``: recipes -> ModelOpt ``quant_cfg`` / ``auto_quantize`` arguments.
- ``calibrate``: calibration and held-out documents, the prefill + decode forward loop.
- ``export``: ModelOpt unified HF checkpoint of the target (``hf_quant_config.json``).
- ``load``: that checkpoint back as a runtime target with quantized linears (``linear``).
- ``accuracy``: quantized vs BF16 teacher on held-out documents.
- ``build``: ``quantize_target``, the builder's entry point.
"""
