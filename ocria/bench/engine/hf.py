"""The HF transformers ``generate`` baseline on the same weights."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ocria.bench.engine.config import BenchConfig
from ocria.bench.engine.decode import sync
from ocria.bench.engine.models import Models

if TYPE_CHECKING:
    from torch import Tensor

    from ocria.runtime.processor import PreparedPrompt


def hf_baseline(models: Models, prompt_ids: Tensor, batch: int, new_tokens: int) -> dict:
    """HF ``generate`` (greedy) on the same weights and text prompt: tokens/s of ``batch`` rows.

    Args:
        models: the run's models (unquantized).
        prompt_ids: [n] long, the prompt's text token ids.
        batch: rows generating the prompt together.
        new_tokens: tokens each row generates (exactly).
    Returns:
        ``batch``, ``new_tokens``, ``seconds`` and ``tokens_per_s`` of the timed ``generate``.
    """
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    target, dev = models.target, models.device
    cfg = Qwen3_5Config(**target.config.to_hf())
    with torch.device(dev):
        hf = Qwen3_5ForConditionalGeneration(cfg).to(models.dtype).eval()
    missing, unexpected = hf.load_state_dict(target.state_dict(), strict=False)
    if unexpected or any(not k.startswith("lm_head") for k in missing):
        raise RuntimeError(f"HF weights do not match: missing {missing[:3]}, unexpected {unexpected[:3]}")
    ids = prompt_ids[None].repeat(batch, 1).to(dev)
    hf.generate(ids, max_new_tokens=4, do_sample=False)
    sync(dev)
    t0 = time.perf_counter()
    hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    sync(dev)
    seconds = time.perf_counter() - t0
    return {"batch": batch, "new_tokens": new_tokens, "seconds": seconds, "tokens_per_s": batch * new_tokens / seconds}


def run_hf_baselines(cfg: BenchConfig, models: Models, prompt: PreparedPrompt) -> list[dict]:
    """The baseline at each ``--hf`` batch size, on unquantized weights only; a failure is recorded, not raised
    (the baseline must not hide the engine's own results)."""
    if models.quantized_layers:
        return []
    text_ids = prompt.input_ids[prompt.input_ids != models.processor.image_token_id][:512]
    out = []
    for b in cfg.hf:
        try:
            out.append(hf_baseline(models, text_ids, b, 64))
            print("HF", out[-1], flush=True)
        except Exception as e:  # reported in the result instead
            out.append({"batch": b, "error": f"{type(e).__name__}: {e}"})
    return out

