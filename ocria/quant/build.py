"""Calibrate -> quantize -> export -> accuracy report, for ``ocria-build engine --recipe``.

The BF16 teacher's held-out outputs are recorded first (quantization rewrites the model in place),
then ModelOpt quantizes the model with max calibration over real prefill + decode passes
(``mtq.quantize``, or ``mtq.auto_quantize`` for recipes with ``auto``), ModelOpt's exporter writes
the unified HF checkpoint, and the checkpoint is loaded back the way the runtime loads it to measure
what will actually run.

``auto`` searches each layer among the formats the build's format cost table (``ocria.quant.costs``) lets through
for its GEMM (``gpu_aware``, the default); a recipe's FP8 ``lm_head`` is untied from the embeddings
(``ocria.quant.head``), quantized with the rest (in ``auto``: fixed to its format, and counted in the bits budget),
and measured alone in the report against the BF16 head.
"""

from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from ocria.models import OCRiaForConditionalGeneration
from ocria.models.quantized.formats import FORMAT_BITS
from ocria.models.quantized.load import load_quantized_target, quantized_layers
from ocria.quant.accuracy import accuracy_report, format_report, head_report, teacher_pass
from ocria.quant.calibrate import Sample, calibration_set, check_calib_spec, forward_loop, heldout_set
from ocria.quant.costs import DEFAULT_ARCH, CostTable, Gemm, decode_gemms, gemm_of
from ocria.quant.export import export_target, storage_tensors
from ocria.quant.head import untie_head
from ocria.quant.recipe import HEAD, Recipe
from ocria.runtime.processor import Processor
from ocria.staging import staged_directory

CALIB_DECODE_STEPS = 8
HELDOUT_DOCS = 4
HELDOUT_DECODE_STEPS = 24
# Calibration searches that run ModelOpt's NVFP4 fake quantizer, which asserts "amax must be a CUDA tensor"
CUDA_SEARCHES = ("awq_lite", "mse")
NOTES = {
    "nvfp4_cpu": "NVFP4 layers calibrated with max statistics (ModelOpt's NVFP4 fake quantization needs CUDA)",
    "nvfp4_exec": "NVFP4 is exported as W4A4 (with input_scale) for Blackwell; this runtime executes it "
                  "weight-only (BF16 activations) on Hopper and CPU, which is what this report measures",
}


def _cuda(model: torch.nn.Module) -> bool:
    return next(model.parameters()).is_cuda


def _full_logits(model: torch.nn.Module, sample: Sample, continuation: list[int]) -> torch.Tensor:
    """No-cache forward over prompt + a greedy continuation: the prefill and decode positions at once."""
    p = sample.prompt
    device = next(model.parameters()).device
    ids = torch.cat([p.input_ids, torch.tensor(continuation[:-1], dtype=torch.long)])[None].to(device)
    return model(ids, p.pixel_values.to(device), p.image_grid_thw.to(device))


def search_spaces(searchable: list[str], formats: list[str], costs: CostTable,
                  gemms: list[Gemm]) -> tuple[list[dict], list[str], dict[str, list[str]]]:
    """ModelOpt ``module_search_spaces`` that narrow each searched layer to ``costs.candidates`` of its GEMM.

    Returns:
        (search space entries for layers with fewer candidates than ``formats``, layers left with no candidate (they
        stay BF16: every quantized format of their GEMM is slower), GEMM name -> its candidates).
    """
    from ocria.quant.modelopt_cfg import preset

    spaces, none, chosen = [], [], {}
    for gemm in gemms:
        layers = [n for n in searchable if gemm_of(n, gemms) is gemm]
        if not layers:
            continue
        allowed = list(costs.candidates(gemm.name, tuple(formats)))
        chosen[gemm.name] = allowed
        if not allowed:
            none += layers
        elif allowed != formats:
            spaces.append({"module_name_patterns": layers, "quantization_formats": [preset(f) for f in allowed]})
    return spaces, none, chosen


def _auto_quantize(model: OCRiaForConditionalGeneration, recipe: Recipe, samples: list[Sample],
                   continuations: list[list[int]], notes: list[str], costs: CostTable, loop: Callable) -> dict:
    import modelopt.torch.quantization as mtq

    from ocria.quant.modelopt_cfg import head_entries, head_preset, preset

    modules = dict(model.named_modules())
    searchable = [n for n, f in recipe.formats(modules).items() if f != "bf16"]
    formats = list(recipe.auto.formats)
    if not _cuda(model) and "nvfp4" in formats:
        formats.remove("nvfp4")
        notes.append("auto: NVFP4 left out of the search on CPU (ModelOpt's NVFP4 fake quantization, which "
                     "scores it, needs CUDA)")
    spaces, kept_bf16, allowed = [], [], {}
    reachable = set(formats)  # the formats some searched layer may take
    if recipe.auto.gpu_aware and formats:
        gemms = decode_gemms(model.text_config)
        spaces, kept_bf16, allowed = search_spaces(searchable, formats, costs, gemms)
        searchable = [n for n in searchable if n not in kept_bf16]
        reachable = {f for c in allowed.values() for f in c}
        if any(gemm_of(n, gemms) is None for n in searchable):  # layers outside the table keep every format
            reachable |= set(formats)
    if recipe.lm_head is not None:  # fixed to its format, and in the budget
        spaces.append({"module_name_patterns": [HEAD], "quantization_formats": [head_preset(recipe.lm_head)],
                       "allow_no_quant": False})
    quantized = [*searchable, *([HEAD] if recipe.lm_head is not None else [])]
    # Every other module with a weight matrix stays out of the search and its bit accounting: ModelOpt also
    # searches convolutions (the GDN conv1d, the vision patch embedding), which count as FP8 in its budget
    # while the export keeps them bf16.
    disabled = [n for n, m in modules.items()
                if n not in quantized and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() >= 2]
    bits = recipe.auto.effective_bits
    out = {"effective_bits_target": bits, "formats": formats, "gpu_aware": recipe.auto.gpu_aware,
           "candidates": allowed, "kept_bf16_by_costs": len(kept_bf16), "searched_layers": len(searchable)}
    if not formats or not searchable:
        if recipe.lm_head is not None:  # nothing to search: the head alone, calibrated as a rule recipe's
            mtq.quantize(model, {"quant_cfg": [{"quantizer_name": "*", "enable": False},
                                               *head_entries(recipe.lm_head)], "algorithm": "max"}, loop)
        return out
    floor = min(FORMAT_BITS[f] for f in reachable)
    if bits < floor:
        notes.append(f"auto: effective_bits {bits} is below what {sorted(reachable)} (the formats the searched layers "
                     f"may take) can reach; searched at {floor}")
        bits = floor
    batches = list(zip(samples, continuations, strict=True))
    _, state = mtq.auto_quantize(
        model, constraints={"effective_bits": bits, "cost": {"excluded_module_name_patterns": disabled}},
        quantization_formats=[preset(f) for f in formats], module_search_spaces=spaces or None,
        data_loader=batches, forward_step=lambda m, b: _full_logits(m, *b), method=recipe.auto.score,
        disabled_layers=disabled, num_calib_steps=len(batches), num_score_steps=len(batches), verbose=False)
    best = state.get("best", {})
    return {**out, "effective_bits_searched": bits,
            "effective_bits_chosen": best.get("constraints", {}).get("effective_bits"),  # ModelOpt's accounting
            "budget_met": bool(best.get("is_satisfied", False)), "score": recipe.auto.score}


def _weight_bytes(layer: torch.nn.Module) -> int:
    """Bytes of a layer's stored weight and scales."""
    return sum(t.numel() * t.element_size() for t in layer.buffers()) + sum(
        t.numel() * t.element_size() for t in layer.parameters())


def calibration_algorithm(recipe: Recipe, formats: dict[str, str], cuda: bool, notes: list[str]) -> str:
    """The recipe's algorithm, except a search (``CUDA_SEARCHES``: AWQ-lite, MSE) with NVFP4 layers on
    CPU: ModelOpt's searches run the NVFP4 fake quantizer, which needs CUDA, so such a build calibrates
    every layer with max."""
    if recipe.algorithm in CUDA_SEARCHES and not cuda and "nvfp4" in formats.values():
        notes.append(f"{recipe.algorithm} needs CUDA for NVFP4 layers: this CPU build calibrated every layer with max")
        return "max"
    return recipe.algorithm


def _save_plain(model: OCRiaForConditionalGeneration, directory: Path) -> None:
    import json

    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = storage_tensors(model.state_dict(), model.text_config.tie_word_embeddings)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2) + "\n")


def quantize_target(model: OCRiaForConditionalGeneration, recipe: Recipe, calib_spec: str, out_dir: str | Path,
                    tokenizer_dir: str | Path, progress: bool = True, heldout_docs: int | None = None,
                    calib_decode_steps: int | None = None, heldout_decode_steps: int | None = None,
                    costs: CostTable | None = None) -> dict:
    """Quantize ``model`` (modified in place) by ``recipe``, write the checkpoint to ``out_dir`` and
    return the accuracy report (also printed when ``progress``). Sizes default to the module's
    ``HELDOUT_DOCS`` / ``CALIB_DECODE_STEPS`` / ``HELDOUT_DECODE_STEPS``; ``costs`` (an ``auto`` recipe's format
    cost table) to the default model of ``DEFAULT_ARCH``."""
    import modelopt.torch.quantization as mtq

    from ocria.quant.modelopt_cfg import quant_cfg

    heldout_docs = heldout_docs or HELDOUT_DOCS
    calib_decode_steps = calib_decode_steps or CALIB_DECODE_STEPS
    heldout_decode_steps = heldout_decode_steps or HELDOUT_DECODE_STEPS
    out_dir = Path(out_dir)
    check_calib_spec(calib_spec)
    recipe.check(dict(model.named_modules()))
    processor = Processor(tokenizer_dir)
    samples = calibration_set(calib_spec, processor)
    heldout = heldout_set(calib_spec, processor, heldout_docs)
    bar = tqdm(total=len(samples) + 3, desc=f"quantize ({recipe.name})", disable=not progress, unit="step")
    bar.set_postfix_str("BF16 teacher")
    teacher = teacher_pass(model, heldout, heldout_decode_steps)
    bar.update()
    notes: list[str] = []
    planned = recipe.formats(dict(model.named_modules()))
    head_reference = None
    if recipe.lm_head is not None:  # the BF16 head the quantized one is measured against (tied: the embeddings)
        tied = model.text_config.tie_word_embeddings
        head_reference = model.text.embed_tokens.weight if tied else model.lm_head.weight.detach().clone()
        untie_head(model)
    search, algorithm = None, "max"
    bar.set_postfix_str("calibration")
    if recipe.auto is not None:
        continuations = [teacher_pass(model, [s], calib_decode_steps)[0].tokens for s in samples]
        costs = costs or CostTable.default(DEFAULT_ARCH, decode_gemms(model.text_config))
        search = _auto_quantize(model, recipe, samples, continuations, notes, costs,
                                forward_loop(samples, calib_decode_steps))
        search["costs"] = {"arch": costs.arch, "source": costs.source.value, "device": costs.device}
        bar.update(len(samples))
    elif recipe.quantizes:
        algorithm = calibration_algorithm(recipe, planned, _cuda(model), notes)
        mtq.quantize(model, quant_cfg(recipe, algorithm),
                     forward_loop(samples, calib_decode_steps, lambda i: bar.update()))
    else:
        bar.update(len(samples))
    bar.set_postfix_str("export")
    with staged_directory(out_dir) as tmp:
        if recipe.quantizes:
            export_target(model, tmp)
        else:
            _save_plain(model, tmp)
    bar.update()
    bar.set_postfix_str("accuracy")
    dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
    device = next(model.parameters()).device
    student = load_quantized_target(out_dir, dtype=dtype, device=device)
    layers = quantized_layers(out_dir)
    formats = {n: layers.get(n, "bf16") for n in planned}
    if any(f == "nvfp4" for f in layers.values()):
        notes.append(NOTES["nvfp4_exec"])
        if not _cuda(model):
            notes.insert(0, NOTES["nvfp4_cpu"])
    report = accuracy_report(student, heldout, teacher, processor.tokenizer, heldout_decode_steps)
    if head_reference is not None:
        stored = layers.get(HEAD)
        report["lm_head"] = {"format": stored or "bf16", "scale": recipe.lm_head.scale.value,
                             "weight_bytes": _weight_bytes(student.lm_head),
                             "bf16_weight_bytes": head_reference.numel() * 2,
                             "alone": head_report(student, heldout, teacher, head_reference, heldout_decode_steps)}
    bar.update()
    bar.close()
    counts = {f: sum(1 for v in formats.values() if v == f) for f in ("bf16", "fp8", "nvfp4")}
    report = {
        "recipe": recipe.name,
        "recipe_source": recipe.source,
        "calibration": {"set": calib_spec, "documents": len(samples), "algorithm": algorithm,
                        "passes": f"prefill + {calib_decode_steps} greedy decode steps per document",
                        "device": str(device)},
        "heldout": {"documents": len(heldout), "decode_steps": heldout_decode_steps},
        "layers": counts,
        "layer_formats": formats,
        "quantized_layers": {name: str(fmt) for name, fmt in sorted(layers.items())},  # the LM head included
        **({"auto": search} if search is not None else {}),
        "notes": notes,
        **report,
    }
    if progress:
        print(format_report(report))
        for note in notes:
            print(f"  note: {note}")
    return report

