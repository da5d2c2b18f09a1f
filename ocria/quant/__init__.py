"""Workload-aware mixed precision (BF16 / FP8 / NVFP4) with NVIDIA ModelOpt, at build time. What the runtime
executes (quantized linears, the checkpoint loader, the ``Format`` enum) is ``ocria.models.quantized``.

- ``recipe``: YAML glob -> format rules (``configs/quant/*.yaml``), checked before any work.
- ``modelopt_cfg``: recipes -> ModelOpt ``quant_cfg`` / ``auto_quantize`` arguments.
- ``calibrate``: calibration and held-out documents, the prefill + decode forward loop.
- ``export``: ModelOpt unified HF checkpoint of the target (``hf_quant_config.json``).
- ``head``: the recipe's FP8 LM head (untied from the embeddings).
- ``costs``: format cost tables (measured by ``ocria bench formats`` or a GPU architecture's default) and the
  per-layer candidates the ``auto`` search takes from them.
- ``accuracy``: quantized vs BF16 teacher on held-out documents.
- ``build``: ``quantize_target``, the builder's entry point.
- ``direct``: calibration-free quantization of random weights, for ``ocria bench engine --recipe``.
"""
