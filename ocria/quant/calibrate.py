"""Calibration data and the calibration forward loop: real prefill + decode passes of our model.

A calibration set is ``synthetic:N`` (the first N documents of the synthetic 'calib' split, with
ground truth) or a directory of document images (``.png/.jpg/.jpeg/.webp/.bmp/.tif``), each with an
optional ``NAME.txt`` prompt and an optional ``NAME.md`` ground truth. The held-out set the accuracy
report uses is disjoint from it: the synthetic 'heldout' split, or the last quarter of a directory
(sorted by name; the first three quarters calibrate).
"""

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from ocria.data import dataset, is_synthetic_spec, parse_synthetic_spec, synthetic_set
from ocria.errors import OcriaError
from ocria.models import OCRiaForConditionalGeneration, TargetCache
from ocria.runtime.decode import SamplingTensors, decode_step, prefill
from ocria.runtime.processor import PreparedPrompt, Processor

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")
MAX_HELDOUT = 8


@dataclass
class Sample:
    prompt: PreparedPrompt
    truth: str | None  # ground-truth Markdown, when known
    name: str


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _directory_items(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise OcriaError(f"calibration set {str(directory)!r} is neither 'synthetic:N' nor a directory")
    images = sorted(p for p in directory.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise OcriaError(f"{directory}: no document images ({', '.join(IMAGE_SUFFIXES)}) to calibrate on")
    return images


def _from_file(processor: Processor, path: Path) -> Sample:
    prompt_file, truth_file = path.with_suffix(".txt"), path.with_suffix(".md")
    prompt = prompt_file.read_text().strip() if prompt_file.is_file() else None
    truth = truth_file.read_text().rstrip("\n") if truth_file.is_file() else None
    return Sample(processor.prepare(path, prompt), truth, path.name)


def check_calib_spec(spec: str) -> None:
    """Refuse a bad calibration argument before any work (one-line OcriaError)."""
    if is_synthetic_spec(spec):
        parse_synthetic_spec(spec)
    else:
        _directory_items(Path(spec))


def calibration_set(spec: str, processor: Processor) -> list[Sample]:
    """The calibration samples named by ``spec`` (``synthetic:N`` or an image directory)."""
    if is_synthetic_spec(spec):
        return [Sample(processor.prepare(_png(d.image)), d.markdown, f"calib-{d.seed}") for d in synthetic_set(spec)]
    images = _directory_items(Path(spec))
    keep = images if len(images) < 2 else images[: len(images) - max(1, len(images) // 4)]
    return [_from_file(processor, p) for p in keep]


def heldout_set(spec: str, processor: Processor, n: int) -> list[Sample]:
    """Samples for the accuracy report, never used for calibration."""
    if is_synthetic_spec(spec):
        return [Sample(processor.prepare(_png(d.image)), d.markdown, f"heldout-{d.seed}")
                for d in dataset("heldout", min(n, MAX_HELDOUT))]
    images = _directory_items(Path(spec))
    held = images[len(images) - max(1, len(images) // 4):] if len(images) >= 2 else images
    return [_from_file(processor, p) for p in held[:n]]


def greedy_params(batch: int, device: torch.device) -> SamplingTensors:
    zeros = torch.zeros(batch, device=device)
    return SamplingTensors(zeros, torch.ones(batch, device=device), zeros.long(), zeros.long())


@torch.no_grad()
def run_document(model: OCRiaForConditionalGeneration, prompt: PreparedPrompt, decode_steps: int,
                 forced: list[int] | None = None, chunk: int = 512) -> tuple[list[int], torch.Tensor]:
    """Prefill ``prompt`` then ``decode_steps`` single-token decode passes through the runtime's own
    cached path. Greedy unless ``forced`` gives the tokens to feed (teacher forcing). Returns the
    greedy tokens and the logits [decode_steps + 1, V] (fp32) of every step."""
    device = next(model.parameters()).device
    dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
    length = prompt.input_ids.numel() + decode_steps + 1
    cache = TargetCache.allocate(model.text_config, 1, length, 1, dtype, device)
    logits = [prefill(model, None, cache, None, 0, prompt, chunk).float()]
    slots = torch.zeros(1, dtype=torch.long, device=device)
    tokens = [int(logits[0].argmax(-1))]
    params = greedy_params(1, device)
    for step in range(decode_steps):
        last = forced[step] if forced is not None else tokens[-1]
        step_logits = _decode_logits(model, cache, slots, torch.tensor([last], device=device), params,
                                     prompt.input_ids.numel() + step)
        logits.append(step_logits)
        tokens.append(int(step_logits.argmax(-1)))
    return tokens, torch.cat(logits)


def _decode_logits(model: OCRiaForConditionalGeneration, cache: TargetCache, slots: torch.Tensor, last: torch.Tensor,
                   params: SamplingTensors, attn_len: int) -> torch.Tensor:
    """One ``ar`` decode step (``decode_step``) that also returns the step's logits [1, V]."""
    captured = {}
    handle = model.lm_head.register_forward_hook(lambda m, i, o: captured.__setitem__("logits", o))
    try:
        decode_step(model, None, cache, None, slots, last, params, attn_len)
    finally:
        handle.remove()
    return captured["logits"][:, -1].float()


def forward_loop(samples: list[Sample], decode_steps: int,
                 progress: Callable[[int], None] | None = None) -> Callable[[torch.nn.Module], None]:
    """ModelOpt ``forward_loop``: every calibration document through prefill + ``decode_steps``
    greedy decode passes of the model being quantized."""

    def loop(model: torch.nn.Module) -> None:
        for i, sample in enumerate(samples):
            run_document(model, sample.prompt, decode_steps)
            if progress is not None:
                progress(i + 1)

    return loop
