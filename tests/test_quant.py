"""Quantized engines: every shipped recipe builds and runs (spec == ar), exported tensors follow the
ModelOpt unified layout, protected layers stay BF16, our dequantization equals ModelOpt's fake
quantization, the accuracy report is measured, and bad recipes are refused before any work."""

import copy
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

import ocria.quant.build as qbuild
from ocria.builder.engine import build_engine
from ocria.builder.presets import load_preset, preset_checkpoints
from ocria.cli import build_main
from ocria.data.metrics import cer, edit_distance
from ocria.errors import CheckpointError, OcriaError
from ocria.models import OCRiaForConditionalGeneration
from ocria.models.quantized.formats import layer_formats, read_quant_config
from ocria.plugins.policy import ALL_KERNELS, REFERENCE
from ocria.quant.recipe import PROTECTED, RECIPE_DIR, load_recipe
from ocria.runtime import SamplingParams, load_engine

EXAMPLE = Path(__file__).parent.parent / "examples" / "report.png"
SHIPPED = ("bf16", "fp8", "nvfp4", "mixed", "auto")
PROTECTED_PREFIXES = ("model.visual.", "model.language_model.embed_tokens.", "lm_head.")


@pytest.fixture(scope="module")
def small_sizes():
    mp = pytest.MonkeyPatch()
    mp.setattr(qbuild, "HELDOUT_DOCS", 1)
    mp.setattr(qbuild, "HELDOUT_DECODE_STEPS", 6)
    mp.setattr(qbuild, "CALIB_DECODE_STEPS", 2)
    yield
    mp.undo()


@pytest.fixture(scope="module")
def engines(tmp_path_factory, small_sizes):
    root = tmp_path_factory.mktemp("quant")
    return {name: build_engine(root / name, recipe=name, calib="synthetic:4" if name == "mixed" else "synthetic:2",
                               progress=False) for name in SHIPPED}


def _tensors(engine: Path) -> dict[str, torch.Tensor]:
    with safe_open(engine / "target" / "model.safetensors", framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _mini_modules() -> dict:
    spec = load_preset("ocria-mini")
    from ocria.models import OCRiaConfig

    with torch.device("meta"):
        model = OCRiaForConditionalGeneration(OCRiaConfig.from_dict(spec.target))
    return dict(model.named_modules())


@pytest.mark.parametrize("name", SHIPPED)
def test_recipe_engine_runs_and_spec_equals_ar(engines, name):
    engine = load_engine(engines[name])
    out = {}
    for mode in ("spec", "ar"):
        out[mode] = [t for ev in engine.generate(EXAMPLE, None, SamplingParams(max_tokens=8, mode=mode))
                     for t in ev.token_ids]
    assert len(out["ar"]) > 0
    assert out["spec"] == out["ar"]
    manifest = json.loads((engines[name] / "manifest.json").read_text())
    assert manifest["recipe"] == name
    assert (engines[name] / "accuracy.json").is_file() == (name != "bf16")
    planned = {n: f for n, f in load_recipe(name).formats(_mini_modules()).items() if f != "bf16"}
    assert manifest["quantized_layers"] == planned  # the recipe's decisions, which the loader follows


def test_loader_follows_the_manifest_and_refuses_a_checkpoint_that_disagrees(engines, tmp_path):
    engine = tmp_path / "mixed"
    shutil.copytree(engines["mixed"], engine)
    path = engine / "manifest.json"
    manifest = json.loads(path.read_text())
    layer, fmt = sorted(manifest["quantized_layers"].items())[0]
    other = "fp8" if fmt == "nvfp4" else "nvfp4"
    for recorded, stored in ((dict(manifest["quantized_layers"], **{layer: other}), fmt),
                             ({k: v for k, v in manifest["quantized_layers"].items() if k != layer}, fmt)):
        path.write_text(json.dumps(dict(manifest, quantized_layers=recorded)))
        with pytest.raises(CheckpointError, match=f"records {layer} as .*, but its weights are stored as {stored}"):
            load_engine(engine)


def test_exported_layout_matches_modelopt_unified_format(engines):
    modules = _mini_modules()
    for name, algo in (("fp8", "FP8"), ("nvfp4", "NVFP4"), ("mixed", "MIXED_PRECISION")):
        engine = engines[name]
        quant = read_quant_config(engine / "target")
        assert quant["quant_algo"] == algo
        planned = {n: f for n, f in load_recipe(name).formats(modules).items() if f != "bf16"}
        if algo == "MIXED_PRECISION":
            assert layer_formats(quant) == planned
            assert set(planned.values()) == {"fp8", "nvfp4"}
        else:
            assert set(planned.values()) == {algo.lower()}
        config = json.loads((engine / "target" / "config.json").read_text())
        assert config["quantization_config"]["quant_algo"] == algo
        tensors = _tensors(engine)
        for layer, fmt in planned.items():
            n, k = modules[layer].weight.shape
            w, ws, s_in = tensors[f"{layer}.weight"], tensors[f"{layer}.weight_scale"], tensors[f"{layer}.input_scale"]
            assert s_in.dtype == torch.float32 and s_in.shape == () and float(s_in) > 0
            if fmt == "fp8":
                assert w.dtype == torch.float8_e4m3fn and w.shape == (n, k)
                assert ws.dtype == torch.float32 and ws.shape == ()
                assert f"{layer}.weight_scale_2" not in tensors
            else:
                assert w.dtype == torch.uint8 and w.shape == (n, k // 2)
                assert ws.dtype == torch.float8_e4m3fn and ws.shape == (n, k // 16)
                ws2 = tensors[f"{layer}.weight_scale_2"]
                assert ws2.dtype == torch.float32 and ws2.shape == ()
        # everything else is BF16, and the tied head is stored once
        quantized = {f"{layer}.{s}" for layer in planned for s in ("weight", "weight_scale", "weight_scale_2",
                                                                      "input_scale")}
        assert all(t.dtype == torch.bfloat16 for k, t in tensors.items() if k not in quantized)
        assert "lm_head.weight" not in tensors


def test_protected_layers_stay_bf16(engines):
    for name in SHIPPED:
        tensors = _tensors(engines[name])
        protected = [k for k in tensors if k.startswith(PROTECTED_PREFIXES)
                     or any(p in k for p in ("in_proj_a.", "in_proj_b.", "conv1d.", "norm."))]
        assert any(k.startswith("model.visual.") for k in protected)
        for k in protected:
            assert tensors[k].dtype == torch.bfloat16, (name, k)
            assert not k.endswith(("_scale", "_scale_2")), (name, k)
    assert PROTECTED  # the recipe module's list is what the engines were built with


def test_dequantization_equals_modelopt_fake_quant(tmp_path, small_sizes):
    """FP8: ModelOpt's own weight fake quantizer (it runs on CPU) is the reference: the exported E4M3
    codes are its codes, and our dequantized values equal its values to the last bit of the scale
    (it multiplies by ``1 / (448 / amax)``, the format stores ``amax / 448``; they can differ by one
    ulp). NVFP4: ModelOpt's fake quantizer needs CUDA, so the reference is its CPU pieces on the same
    quantizer state (``NVFP4QTensor.get_weights_scaling_factor(_2)_from_quantizer`` + ``quantize`` +
    ``dequantize``), matched bit for bit."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    from ocria.models.quantized.load import load_quantized_target
    from ocria.quant.calibrate import calibration_set, forward_loop
    from ocria.quant.export import export_target
    from ocria.quant.modelopt_cfg import quant_cfg
    from ocria.runtime.processor import Processor

    spec = load_preset("ocria-mini")
    target_dir, _ = preset_checkpoints(spec, tmp_path / "src")
    model = OCRiaForConditionalGeneration.from_pretrained(target_dir)
    recipe = load_recipe("mixed")
    mtq.quantize(model, quant_cfg(recipe), forward_loop(calibration_set("synthetic:1", Processor(spec.assets)), 1))
    from modelopt.torch.export.unified_export_hf import requantize_resmooth_fused_llm_layers

    from ocria.quant.export import ExportView

    with torch.no_grad():
        requantize_resmooth_fused_llm_layers(ExportView(model))  # the scale unification export applies
    reference = {}
    for name, module in model.named_modules():
        wq = getattr(module, "weight_quantizer", None)
        if wq is None or not wq.is_enabled:
            continue
        w = module.weight.detach().float()
        if wq.num_bits == (4, 3):
            with torch.no_grad():
                reference[name] = ("fp8", wq(w), w)
        else:
            ws2 = NVFP4QTensor.get_weights_scaling_factor_2_from_quantizer(wq)
            ws = NVFP4QTensor.get_weights_scaling_factor_from_quantizer(wq, w, ws2)[0]
            qt, ws, ws2 = NVFP4QTensor.quantize(w, 16, ws, ws2)
            reference[name] = ("nvfp4", qt.dequantize(torch.float32, scale=ws, double_scale=ws2,
                                                      block_sizes={-1: 16}), None)
    assert {r[0] for r in reference.values()} == {"fp8", "nvfp4"}
    export_target(model, tmp_path / "q")
    loaded = load_quantized_target(tmp_path / "q", dtype=torch.float32)
    linears = {n: m for n, m in loaded.named_modules() if hasattr(m, "dequantized_weight")}
    for name, (fmt, ref, w) in reference.items():
        layer = linears[name]  # gate/up keep their names as views of the fused gate_up GEMM
        assert layer.fmt == fmt
        ours = layer.dequantized_weight(torch.float32)
        if fmt == "nvfp4":
            assert torch.equal(ours, ref), name
        else:
            # ModelOpt's FP8 weight export: codes = weight / (amax / 448), cast with round-to-nearest-even
            amax = model.get_submodule(name).weight_quantizer.amax.float()
            torch.testing.assert_close(layer.weight_scale, amax / 448.0, rtol=0.0, atol=0.0)
            codes = (w / layer.weight_scale).to(torch.float8_e4m3fn)
            assert torch.equal(layer.weight.view(torch.uint8), codes.view(torch.uint8)), name
            # ModelOpt's fake quant scales by 448/amax, its export divides by amax/448: where a (bf16-valued)
            # weight sits exactly halfway between two FP8 values, that last-bit difference picks either
            # neighbour. Ours follows the export; anywhere else it equals the fake quant.
            off = ~torch.isclose(ours, ref, rtol=2.0**-21, atol=0.0)
            torch.testing.assert_close(w[off], (ours[off] + ref[off]) / 2, rtol=2.0**-20, atol=0.0)


def test_accuracy_report(engines):
    report = json.loads((engines["mixed"] / "accuracy.json").read_text())
    s = report["summary"]
    for key in ("teacher_forced_agreement", "free_running_agreement", "mean_abs_logit_error", "max_abs_logit_error",
                "cer_bf16", "cer_quantized"):
        assert key in s
    assert 0.0 <= s["teacher_forced_agreement"] <= 1.0
    assert s["max_abs_logit_error"] > 0.0  # quantization changed the logits, and it was measured
    assert report["layers"]["nvfp4"] > 0 and report["layers"]["fp8"] > 0
    assert any("max statistics" in n for n in report["notes"])
    assert report["calibration"]["documents"] == 4


def test_accuracy_of_an_unquantized_export_is_exact(tmp_path, small_sizes):
    """The bf16 recipe given as a YAML path runs the whole pipeline with nothing to quantize: a plain
    checkpoint, and the report measures exactly zero error and full agreement."""
    engine = build_engine(tmp_path / "e", recipe=str(RECIPE_DIR / "bf16.yaml"), calib="synthetic:1", progress=False)
    same = json.loads((engine / "accuracy.json").read_text())["summary"]
    assert same["mean_abs_logit_error"] == 0.0 and same["max_abs_logit_error"] == 0.0
    assert same["teacher_forced_agreement"] == 1.0 and same["free_running_agreement"] == 1.0
    assert same["cer_bf16"] == same["cer_quantized"]
    assert not (engine / "target" / "hf_quant_config.json").exists()


def test_auto_recipe_searches_under_budget(engines, tmp_path, small_sizes):
    report = json.loads((engines["auto"] / "accuracy.json").read_text())
    assert report["auto"]["score"] == "kl_div" and report["auto"]["budget_met"]
    recipe = tmp_path / "auto12.yaml"
    recipe.write_text("name: auto12\nrules:\n  - {match: 'model.language_model.layers.*', format: fp8}\n"
                      "auto: {effective_bits: 12.0, formats: [fp8]}\n")
    engine = build_engine(tmp_path / "e", recipe=str(recipe), calib="synthetic:1", progress=False)
    formats = json.loads((engine / "accuracy.json").read_text())["layer_formats"]  # read back from the tensors
    modules = _mini_modules()
    searched = load_recipe(str(recipe)).formats(modules)
    numel = {n: modules[n].weight.numel() for n in searched}
    bits = sum(numel[n] * (8 if formats.get(n) == "fp8" else 16) for n in searched) / sum(numel.values())
    assert bits <= 12.0 + 1e-6
    assert 0 < sum(1 for f in formats.values() if f == "fp8") < len(searched)  # a real mix, not all or nothing
    auto = json.loads((engine / "accuracy.json").read_text())["auto"]
    assert auto["budget_met"] and auto["effective_bits_chosen"] <= 12.0 + 1e-6


def test_cer():
    assert edit_distance("kitten", "sitting") == 3
    assert cer("abc", "abc") == 0.0 and cer("", "abcd") == 1.0


BAD = {
    "unknown format": ("rules:\n  - {match: 'model.language_model.layers.*', format: int3}\n", "unknown format"),
    "glob matches nothing": ("rules:\n  - {match: '*.mpl.*', format: fp8}\n", "matches no module"),
    "vision": ("rules:\n  - {match: 'model.visual.*', format: fp8}\n", "--allow-vision-quant"),
    "everything incl. vision": ("rules:\n  - {match: '*', format: nvfp4}\n", "--allow-vision-quant"),
    "only protected": ("rules:\n  - {match: 'lm_head', format: fp8}\n", "stay BF16"),
    "bad budget": ("rules: []\nauto: {effective_bits: 2.0}\n", "effective_bits"),
    "unknown key": ("rule: []\n", "unknown recipe keys"),
    "unknown algorithm": ("algorithm: gptq\nrules: []\n", "'gptq'; choose one of max, awq_lite, mse"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_recipe_refused_before_any_work(tmp_path, case):
    text, message = BAD[case]
    path = tmp_path / "bad.yaml"
    path.write_text(f"name: bad\n{text}")
    with pytest.raises(OcriaError, match=message):
        build_engine(tmp_path / "out", recipe=str(path), calib="synthetic:1", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # nothing started, nothing left


@pytest.mark.parametrize("device, message", [("tpu", "'tpu': use cpu, cuda or cuda:N"),
                                             ("cuda:x", "'cuda:x': use cpu, cuda or cuda:N")]
                         + ([] if torch.cuda.is_available() else [("cuda", "this machine has no CUDA GPU")]))
def test_bad_calibration_device_refused_before_any_work(tmp_path, capsys, device, message):
    assert build_main(["engine", "--out", str(tmp_path / "x"), "--recipe", "fp8", "--device", device]) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_bad_recipe_cli_and_vision_opt_in(tmp_path, capsys):
    assert build_main(["engine", "--out", str(tmp_path / "x"), "--recipe", "nope"]) == 2
    assert "unknown quantization recipe 'nope'" in capsys.readouterr().err
    vision = tmp_path / "vision.yaml"
    vision.write_text("name: vision\nrules:\n  - {match: 'model.visual.blocks.*', format: fp8}\n")
    recipe = load_recipe(str(vision), allow_vision_quant=True)
    formats = recipe.formats(_mini_modules())
    assert formats["model.visual.blocks.0.attn.qkv"] == "fp8"
    assert formats["model.language_model.layers.0.mlp.up_proj"] == "bf16"
    # a glob that fits the architecture but not this model is refused against the real module names
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: deep\nrules:\n  - {match: 'model.language_model.layers.40.*', format: fp8}\n")
    with pytest.raises(OcriaError, match="matches no module of the target"):
        load_recipe(str(deep)).check(_mini_modules())


def test_directory_calibration_set(tmp_path):
    """A directory of images (+ NAME.txt prompt, + NAME.md truth): the first three quarters calibrate,
    the rest is held out for the report; bad sets are one-line errors."""
    import shutil

    from ocria.quant.calibrate import calibration_set, check_calib_spec, heldout_set
    from ocria.runtime.processor import Processor

    examples = EXAMPLE.parent
    for i, name in enumerate(("checklist", "invoice_table", "report", "checklist")):
        shutil.copy(examples / f"{name}.png", tmp_path / f"doc{i}.png")
        if i != 1:
            shutil.copy(examples / f"{name}.md", tmp_path / f"doc{i}.md")
    (tmp_path / "doc0.txt").write_text("List the items.\n")
    (tmp_path / "notes.json").write_text("{}")
    processor = Processor(load_preset("ocria-mini").assets)
    calib = calibration_set(str(tmp_path), processor)
    held = heldout_set(str(tmp_path), processor, 8)
    assert [s.name for s in calib] == ["doc0.png", "doc1.png", "doc2.png"] and [s.name for s in held] == ["doc3.png"]
    assert calib[1].truth is None and held[0].truth == (examples / "checklist.md").read_text().rstrip("\n")
    prompt_ids = calib[0].prompt.input_ids.tolist()
    assert processor.tokenizer.encode("List the items.", add_special_tokens=False)[0] in prompt_ids
    (tmp_path / "empty").mkdir()
    with pytest.raises(OcriaError, match="no document images"):
        check_calib_spec(str(tmp_path / "empty"))
    with pytest.raises(OcriaError, match="neither 'synthetic:N' nor a directory"):
        check_calib_spec(str(tmp_path / "missing"))
    with pytest.raises(OcriaError, match="synthetic:N"):
        check_calib_spec("synthetic:zero")


@pytest.mark.parametrize("algorithm", ["max", "awq_lite", "mse"])
def test_executor_matches_modelopt_fake_quant_model(tmp_path, algorithm):
    """FP8 runs fake-quantized in ModelOpt on CPU, so the exported-and-loaded target can be checked
    against ModelOpt's own quantized model end to end (prefill + teacher-forced decode logits), with
    max calibration, with AWQ-lite (whose per-channel ``pre_quant_scale`` the loader applies) and with
    MSE (max, then each weight's amax searched for the least weight quantization error)."""
    import modelopt.torch.quantization as mtq

    from ocria.models.quantized.load import PreScaledLinear, load_quantized_target
    from ocria.quant.calibrate import calibration_set, forward_loop, run_document
    from ocria.quant.export import export_target
    from ocria.quant.modelopt_cfg import quant_cfg
    from ocria.runtime.processor import Processor

    spec = load_preset("ocria-mini")
    target_dir, _ = preset_checkpoints(spec, tmp_path / "src")
    model = OCRiaForConditionalGeneration.from_pretrained(target_dir)
    samples = calibration_set("synthetic:2", Processor(spec.assets))
    bf16_tokens, bf16_logits = run_document(model, samples[0].prompt, 4)
    twin = copy.deepcopy(model) if algorithm == "mse" else None
    mtq.quantize(model, quant_cfg(load_recipe("fp8"), algorithm), forward_loop(samples, 2))
    if algorithm == "mse":
        # MSE keeps max's activation amaxes and moves the weight amaxes, never to a larger weight error
        # (ModelOpt's own fake quantizer) than max's and to a smaller one for most layers.
        mtq.quantize(twin, quant_cfg(load_recipe("fp8"), "max"), forward_loop(samples, 2))
        by_max = dict(twin.named_modules())
        moved = lower = 0
        with torch.no_grad():
            for name, module in model.named_modules():
                if not getattr(getattr(module, "weight_quantizer", None), "is_enabled", False):
                    continue
                ref = by_max[name]
                assert torch.equal(module.input_quantizer.amax, ref.input_quantizer.amax), name
                error, max_error = ((m.weight_quantizer(m.weight) - m.weight).square().sum() for m in (module, ref))
                assert error <= max_error, name
                moved += not torch.equal(module.weight_quantizer.amax, ref.weight_quantizer.amax)
                lower += bool(error < max_error)
        assert moved > 20 and lower > 0.5 * moved
    from modelopt.torch.export.unified_export_hf import requantize_resmooth_fused_llm_layers

    from ocria.quant.export import ExportView

    with torch.no_grad():  # what export does first: layers sharing an input get one (AWQ: averaged) scale
        requantize_resmooth_fused_llm_layers(ExportView(model))
    reference = copy.deepcopy(model)  # export leaves quantized weights in the model it exports
    export_target(model, tmp_path / "q")
    loaded = load_quantized_target(tmp_path / "q", dtype=torch.float32)
    if algorithm != "awq_lite":
        # A weight exactly halfway between two FP8 values may get neighbouring codes from ModelOpt's fake
        # quantizer and its export (test_dequantization_equals_modelopt_fake_quant). Put the exported
        # values into ModelOpt's model (they sit on its FP8 grid, so its quantizer keeps them) to compare
        # the execution alone: activation quantization, scales, fused GEMMs.
        exported = {n: m for n, m in loaded.named_modules() if hasattr(m, "dequantized_weight")}
        with torch.no_grad():
            for name, module in reference.named_modules():
                wq = getattr(module, "weight_quantizer", None)
                if wq is not None and wq.is_enabled:
                    module.weight.copy_(exported[name].dequantized_weight(torch.float32))
    calls: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    hooks = [module.register_forward_hook(lambda m, i, o, name=name: calls.setdefault(name, []).append((i[0], o)))
             for name, module in reference.named_modules()
             if getattr(getattr(module, "weight_quantizer", None), "is_enabled", False)]
    _, fake = run_document(reference, samples[0].prompt, 4, forced=bf16_tokens)
    for hook in hooks:
        hook.remove()
    _, ours = run_document(loaded, samples[0].prompt, 4, forced=bf16_tokens)
    prescaled = [m for m in loaded.modules() if isinstance(m, PreScaledLinear)]
    assert bool(prescaled) == (algorithm == "awq_lite")
    quant_error = (fake - bf16_logits).abs().max()
    assert quant_error > 0
    # End to end the two agree only to a fraction of the quantization error: wherever an FP8 activation
    # sits within float rounding of a code boundary, the two round it to neighbouring codes, and the
    # random layers amplify each flip (1e-7 -> 6e-3 in one prefill row of layer 1, 14% at layer 7 here).
    # AWQ adds flipped weight codes (ModelOpt's exporter recomputes the scaled weight's amax one ulp away),
    # which trained weights amplify at the logits (0.6 of the quantization error with run 5's shipped pair,
    # 1.1 with run 6's). With run 7's pair even max differs by 0.64 of it end to end (per linear: no row off),
    # and ModelOpt's own fake-quantized model moves its logits by about as much (0.72) when its token
    # embeddings are scaled by 1 + 1e-6 noise: end to end only a sanity bound, and the per-linear check below.
    # MSE, with its weight amaxes moved (and a smaller quantization error), differs by 1.36 of it end to end
    # on the random preset although no linear output row is off.
    assert (ours - fake).abs().max() < (1.0 if algorithm == "max" else 2.0) * quant_error
    # So the execution is checked linear by linear on ModelOpt's own inputs: every output row equals ModelOpt's to
    # float rounding (AWQ: to 1% of the largest output, for the flipped weight codes) except rows that hold a
    # flipped activation code (rare).
    tol = 1e-2 if algorithm == "awq_lite" else 1e-4
    executors = {n: m for n, m in loaded.named_modules() if hasattr(m, "dequantized_weight") or m in prescaled}
    rows = flipped = 0
    with torch.no_grad():
        for name, pairs in calls.items():
            for x, want in pairs:
                got = executors[name](x)
                off = (got - want).abs().amax(-1) > tol * want.abs().amax().clamp_min(1e-6)
                rows, flipped = rows + off.numel(), flipped + int(off.sum())
    assert len(calls) == len(hooks) > 40 and set(calls) <= set(executors) and rows > 1000  # every quantized linear
    assert flipped <= 0.01 * rows, f"{flipped} of {rows} linear output rows differ from ModelOpt's"


def test_awq_checkpoints_run_with_their_pre_quant_scales(engines, tmp_path):
    """A CUDA build with ``algorithm: awq_lite`` exports NVFP4 layers as ``NVFP4_AWQ`` (NVFP4 tensors plus a
    per-channel ``pre_quant_scale``) and FP8 layers with a ``pre_quant_scale`` too. The loader multiplies each
    such layer's input by its scale, and the runtime (projection runs included) serves the engine. Written into
    the mixed engine here, since ModelOpt's NVFP4 AWQ search needs CUDA."""
    import shutil

    from safetensors.torch import save_file

    from ocria.manifest import MANIFEST, file_table
    from ocria.models.gdn import PROJECTIONS
    from ocria.models.layers import project
    from ocria.models.quantized.linear import QuantLinear
    from ocria.models.quantized.load import PreScaledLinear, QuantSwiGLU
    from ocria.plugins.silu_quant import silu_mul

    root = tmp_path / "mixed-awq"
    shutil.copytree(engines["mixed"], root)
    tensors = _tensors(engines["mixed"])
    config = json.loads((root / "target" / "hf_quant_config.json").read_text())
    layers = config["quantization"]["quantized_layers"]
    gdn1, gdn2 = "model.language_model.layers.1.linear_attn", "model.language_model.layers.2.linear_attn"
    prescaled = [n for n in layers if n.endswith("mlp.down_proj")]
    # GDN projections share an input: one scale for layer 2's in_proj_qkv and in_proj_z (one GEMM, as ModelOpt's
    # export averages them), none for layer 1's in_proj_z (a run of its own)
    prescaled += [f"{gdn1}.in_proj_qkv", f"{gdn2}.in_proj_qkv", f"{gdn2}.in_proj_z"]
    torch.manual_seed(0)
    for name in prescaled:
        if layers[name]["quant_algo"] == "NVFP4":
            layers[name]["quant_algo"] = "NVFP4_AWQ"
        k = tensors[f"{name}.weight"].shape[1] * (2 if tensors[f"{name}.weight"].dtype == torch.uint8 else 1)
        shared = tensors.get(f"{gdn2}.in_proj_qkv.pre_quant_scale") if name == f"{gdn2}.in_proj_z" else None
        tensors[f"{name}.pre_quant_scale"] = shared.clone() if shared is not None else (torch.rand(k) + 0.5).bfloat16()
    (root / "target" / "hf_quant_config.json").write_text(json.dumps(config))
    save_file(tensors, str(root / "target" / "model.safetensors"), metadata={"format": "pt"})
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["files"] = file_table(root)
    (root / MANIFEST).write_text(json.dumps(manifest))

    assert {"NVFP4_AWQ", "FP8"} <= {e["quant_algo"] for e in layers.values()}
    assert set(layer_formats(config["quantization"]).values()) == {"fp8", "nvfp4"}
    engine = load_engine(root)
    modules = dict(engine.target.named_modules())
    for name in prescaled:
        layer = modules[name]
        assert isinstance(layer, PreScaledLinear) and isinstance(layer.linear, QuantLinear)
        x = torch.randn(3, layer.in_features)
        scale = tensors[f"{name}.pre_quant_scale"].float()
        assert torch.equal(layer(x), layer.linear(x * scale))
    assert modules[prescaled[0]].linear.fmt == "nvfp4" and modules[prescaled[-1]].linear.fmt == "fp8"
    for gdn, shapes in ((gdn1, [("PreScaledLinear", 1), ("QuantLinear", 1), ("Tensor", 2)]),
                        (gdn2, [("PreScaledLinear", 2), ("Tensor", 2)])):
        mixer = modules[gdn]
        runs = mixer.__dict__["_runs"][PROJECTIONS]
        assert [(type(ex).__name__, len(sizes)) for ex, sizes in runs] == shapes
        x = torch.randn(2, 3, mixer.in_proj_qkv.in_features)
        one_by_one = [getattr(mixer, n)(x) if not isinstance(getattr(mixer, n), torch.nn.Linear)
                      else F.linear(x, getattr(mixer, n).weight) for n in PROJECTIONS]
        for got, want in zip(project(mixer, x, PROJECTIONS, REFERENCE), one_by_one, strict=True):
            assert torch.equal(got, want)
    mlp = modules[prescaled[0].removesuffix(".down_proj")]  # one gate/up GEMM and the fused SiLU before its down
    assert isinstance(mlp, QuantSwiGLU) and isinstance(mlp.down_proj, PreScaledLinear)
    x = torch.randn(2, 3, mlp.gate_proj.in_features)
    assert torch.equal(mlp(x), mlp.down_proj(silu_mul(torch.cat([mlp.gate_proj(x), mlp.up_proj(x)], -1))))
    out = {mode: [t for ev in engine.generate(EXAMPLE, None, SamplingParams(max_tokens=6, mode=mode))
                  for t in ev.token_ids] for mode in ("spec", "ar")}
    assert len(out["ar"]) > 0 and out["spec"] == out["ar"]


@pytest.mark.parametrize("algorithm", ["awq_lite", "mse"])
def test_search_with_nvfp4_on_cpu_falls_back_to_max(tmp_path, algorithm):
    from ocria.quant.build import calibration_algorithm

    path = tmp_path / "search.yaml"
    path.write_text(f"name: search\nalgorithm: {algorithm}\nrules:\n"
                    "  - {match: 'model.language_model.layers.*.mlp.*', format: nvfp4}\n"
                    "  - {match: '*.self_attn.*', format: fp8}\n")
    recipe = load_recipe(str(path))
    notes: list[str] = []
    formats = recipe.formats(_mini_modules())
    assert calibration_algorithm(recipe, formats, cuda=True, notes=notes) == algorithm and not notes
    assert calibration_algorithm(recipe, formats, cuda=False, notes=notes) == "max"
    assert notes == [f"{algorithm} needs CUDA for NVFP4 layers: this CPU build calibrated every layer with max"]
    fp8_only = {n: "fp8" for n in formats}
    assert calibration_algorithm(recipe, fp8_only, cuda=False, notes=[]) == algorithm


def test_the_policy_reaches_quantized_mlps(engines):
    """A quantized MLP runs its fused SiLU-multiply as the ``ocria::`` kernel under a policy with the kernels and as
    the reference under one without, the same numbers within one bf16 rounding."""
    from torch.profiler import ProfilerActivity, profile

    from ocria.models.quantized.load import QuantSwiGLU

    engine = load_engine(engines["mixed"], policy=REFERENCE)
    mlps = [m for m in engine.target.modules() if isinstance(m, QuantSwiGLU)]
    x = torch.randn(2, 3, mlps[0].gate_proj.in_features)
    out, launches = {}, {}
    for name, policy in (("reference", REFERENCE), ("kernels", ALL_KERNELS)):
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            out[name] = mlps[0](x, policy)
        launches[name] = sum(e.name == "ocria::silu_mul_quant" for e in prof.events())
    assert mlps and launches == {"reference": 0, "kernels": 1}
    torch.testing.assert_close(out["kernels"], out["reference"], rtol=2e-2, atol=2e-2)


def test_calibration_free_quantization_follows_the_recipe():
    """``quantize_in_place`` (ocria bench engine --recipe): the recipe's layers become QuantLinears whose
    weights are the reference quantizers' output, MLP gate/up fuse under one NVFP4 global scale, and
    the quantized model's logits follow the unquantized model's."""
    from ocria.builder.presets import random_models
    from ocria.models.quantized.linear import QuantLinear
    from ocria.models.quantized.load import QuantSwiGLU
    from ocria.plugins import numerics as nx
    from ocria.quant.direct import quantize_in_place

    spec = load_preset("ocria-mini")
    model, _ = random_models(spec, "cpu", torch.float32)
    originals = {n: m.weight.detach().clone() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    ids = torch.randint(7, 500, (1, 12))
    pos = torch.arange(12).expand(3, 1, 12)
    with torch.no_grad():
        ref = model.logits(model.text(model.text.embed_tokens(ids), pos)[0])
    recipe = load_recipe("mixed")
    formats = quantize_in_place(model, recipe)
    assert formats == {n: f for n, f in recipe.formats(dict(_mini_modules())).items() if f != "bf16"}
    assert set(formats.values()) == {"fp8", "nvfp4"}
    modules = dict(model.named_modules())
    for name, fmt in formats.items():
        layer = modules[name]
        assert isinstance(layer, QuantLinear) and layer.fmt == fmt and layer.input_scale is None
        w = originals[name]
        if fmt == "fp8":
            want = nx.dequantize_fp8(nx.quantize_fp8(w, w.abs().amax() / 448.0), w.abs().amax() / 448.0, torch.float32)
            assert torch.equal(layer.dequantized_weight(torch.float32), want), name
    mlps = [m for m in model.modules() if isinstance(m, QuantSwiGLU)]
    assert len(mlps) == spec.target["text_config"]["num_hidden_layers"] - 1  # layer 0 stays bf16 in "mixed"
    for mlp in mlps:
        gate_up = mlp.gate_up.dequantized_weight(torch.float32)
        assert (gate_up - torch.cat([originals[mlp.gate_up.name.replace("gate_up", p)]
                                     for p in ("gate_proj", "up_proj")])).abs().max() < 0.2 * gate_up.abs().max()
    with torch.no_grad():
        out = model.logits(model.text(model.text.embed_tokens(ids), pos)[0])
    assert not torch.equal(out, ref)
    # 7 of 8 random layers with NVFP4 MLPs: ~0.4 relative logit error; a wrong layout is uncorrelated (~0)
    assert F.cosine_similarity(out.flatten(), ref.flatten(), dim=0) > 0.8


def test_projections_sharing_an_input_run_as_one_gemm_per_format(engines):
    """A quantized mixer's projections (one input) run as one GEMM per run of neighbours with one format and
    activation scale: GDN ``in_proj_qkv + in_proj_z`` (FP8) and ``in_proj_b + in_proj_a`` (bf16), attention
    ``q + k + v`` (FP8); with the same outputs as the layers one by one, which stay reachable as views."""
    from ocria.models.attention import PROJECTIONS as ATTENTION
    from ocria.models.gdn import PROJECTIONS as GDN
    from ocria.models.layers import project
    from ocria.models.quantized.linear import QuantLinear

    engine = load_engine(engines["mixed"], policy=REFERENCE)
    layers = engine.target.text.layers
    runs_of_layer_1 = layers[1].linear_attn.__dict__["_runs"][GDN][0][0]
    torch.manual_seed(0)
    seen = set()
    for layer in list(layers)[1:]:  # layer 0 stays bf16 in "mixed": one stacked GEMM, as before
        mixer, names = (layer.linear_attn, GDN) if hasattr(layer, "linear_attn") else (layer.self_attn, ATTENTION)
        runs = mixer.__dict__["_runs"][names]
        shapes = [(type(ex).__name__, getattr(ex, "fmt", "bf16"), len(sizes)) for ex, sizes in runs]
        assert shapes in ([("QuantLinear", "fp8", 2), ("Tensor", "bf16", 2)], [("QuantLinear", "fp8", 3)]), shapes
        seen.add(len(runs))
        x = torch.randn(2, 3, runs[0][0].in_features)
        fused_out = project(mixer, x, names, REFERENCE)
        one_by_one = [getattr(mixer, n)(x) if isinstance(getattr(mixer, n), QuantLinear)
                      else F.linear(x, getattr(mixer, n).weight) for n in names]
        for got, want in zip(fused_out, one_by_one, strict=True):
            assert torch.equal(got, want)
        fused = runs[0][0]
        views = [getattr(mixer, n) for n in names[: len(runs[0][1])]]
        assert all(v.weight.untyped_storage().data_ptr() == fused.weight.untyped_storage().data_ptr() for v in views)
    assert seen == {1, 2}
    engine.target.text.fuse_projections()  # a second call keeps the runs it made
    assert layers[1].linear_attn.__dict__["_runs"][GDN][0][0] is runs_of_layer_1


# the norms' and activations' kernels (Triton's interpreter); the GEMMs and attention on their references
NORM_KERNELS = replace(ALL_KERNELS, disabled=frozenset({"decode_gemm", "decode_gemm_fp8", "decode_gemm_norm",
                                                        "nvfp4_gemm", "gemm_prologue", "decode_attention", "kv_write"}))


@pytest.mark.parametrize("policy", [REFERENCE, NORM_KERNELS], ids=["reference", "kernels"])
def test_norms_write_the_fp8_inputs_of_the_fp8_layers_after_them(engines, monkeypatch, policy):
    """In the mixed engine the decoder's input norm and the GDN output norm also write the FP8 input (bytes and
    per-token scales) of the FP8 projections after them, instead of those layers quantizing it again: the hidden
    states equal those of the path where each FP8 layer quantizes its own input."""
    from ocria.models.quantized.linear import QuantLinear

    engine = load_engine(engines["mixed"], policy=policy)
    text = engine.target.text
    torch.manual_seed(0)
    embeds = torch.randn(1, 6, text.cfg.hidden_size)
    pos = torch.arange(6).expand(3, 1, 6)
    calls = []  # FP8 layers that quantize their own input (on CPU: QuantLinear._emulate_fp8)
    real = QuantLinear._emulate_fp8
    monkeypatch.setattr(QuantLinear, "_emulate_fp8",
                        lambda self, x, *out: calls.append(self.name) or real(self, x, *out))
    with torch.no_grad():
        fused = text(embeds, pos, policy=policy)[0]
        own_in_fused = len(calls)
        monkeypatch.setattr(QuantLinear, "input_quant", property(lambda self: None))
        calls.clear()
        separate = text(embeds, pos, policy=policy)[0]
    assert torch.equal(fused, separate)
    gdn = sum(1 for layer in list(text.layers)[1:] if hasattr(layer, "linear_attn"))
    attn = len(text.layers) - 1 - gdn
    assert (own_in_fused, len(calls)) == (attn, 2 * gdn + 2 * attn)  # fused: only o_proj (after the output gate)
