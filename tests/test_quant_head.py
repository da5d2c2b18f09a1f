"""The quantized LM head recipe option: parsed into typed config, quantized by ModelOpt's FP8 presets and exported in
the unified layout (untied from the BF16 embeddings), executed with fp32 logits, measured alone in accuracy.json,
and shared by the drafter (its first draft-vocabulary rows too) with ``spec`` == ``ar``."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tiny_models import drafter_config, hf_vlm, image_prompt, pixels, save_hf, text_config, vlm_config, write_drafter

import ocria.quant.build as qbuild
from ocria.builder.engine import build_engine
from ocria.models import DFlash2Drafter, DrafterCache, OCRiaForConditionalGeneration, TargetCache
from ocria.models.quantized.linear import QuantLinear
from ocria.plugins import numerics as nx
from ocria.plugins.policy import ALL_KERNELS, KERNEL_NAMES, REFERENCE, ExecutionPolicy
from ocria.quant.direct import quantize_in_place
from ocria.quant.head import head_weight_tensors
from ocria.quant.modelopt_cfg import quant_cfg
from ocria.quant.recipe import HeadQuant, HeadScale, RecipeError, _parse, load_recipe
from ocria.runtime import SamplingParams, load_engine
from ocria.runtime.decode import SamplingTensors, decode_step, prefill
from ocria.runtime.processor import PreparedPrompt

EXAMPLE = Path(__file__).parent.parent / "examples" / "report.png"
RULES = [{"match": "model.language_model.layers.*", "format": "fp8"}]

# the FP8 decode GEMM in the interpreter, every other op its reference (tested elsewhere)
FP8_DECODE_GEMM = replace(ALL_KERNELS, disabled=frozenset(KERNEL_NAMES) - {"decode_gemm_fp8"})


def _recipe(head: dict | str | None, **more):
    raw = {"name": "t", "rules": RULES, **more}
    if head is not None:
        raw["lm_head"] = head
    return _parse(raw, "t.yaml", False)


def test_head_option_is_typed_and_bad_values_are_refused():
    assert _recipe(None).lm_head is None and _recipe("bf16").lm_head is None
    head = _recipe({"format": "FP8", "scale": "per_tensor"}).lm_head
    assert head == HeadQuant("fp8", HeadScale.PER_TENSOR)
    assert load_recipe("mixed_fp8_head").lm_head == HeadQuant("fp8", HeadScale.PER_CHANNEL)
    assert load_recipe("mixed_fp8_head").quantizes and not load_recipe("bf16").quantizes
    for bad, match in (({"format": "nvfp4", "scale": "per_channel"}, "quantizes to fp8"),
                       ({"format": "fp8", "scale": "per_block"}, "per_channel, per_tensor"),
                       ({"format": "fp8"}, "lm_head must be"), ("fp8", "lm_head must be")):
        with pytest.raises(RecipeError, match=match):
            _recipe(bad)
    with pytest.raises(RecipeError, match="unknown auto keys"):
        _recipe(None, auto={"effective_bits": 8, "cost": 1})


@pytest.mark.parametrize("scale,weight_axis,input_type", [(HeadScale.PER_CHANNEL, 0, "dynamic"),
                                                          (HeadScale.PER_TENSOR, None, None)])
def test_head_takes_modelopts_fp8_preset_after_the_protected_layers(scale, weight_axis, input_type):
    entries = quant_cfg(_recipe({"format": "fp8", "scale": scale.value}))["quant_cfg"]
    names = [e["quantizer_name"] for e in entries]
    head = [e for e in entries if e["quantizer_name"].endswith("_quantizer") and e["quantizer_name"].startswith("lm_")]
    disabled = names.index("lm_head.*")
    assert entries[disabled]["enable"] is False and len(head) == 2
    assert all(names.index(e["quantizer_name"]) > disabled for e in head)
    cfg = {e["quantizer_name"]: e["cfg"] for e in head}
    assert cfg["lm_head.weight_quantizer"]["num_bits"] == (4, 3)
    assert cfg["lm_head.weight_quantizer"]["axis"] == weight_axis
    assert cfg["lm_head.input_quantizer"].get("type") == input_type
    assert not [e for e in quant_cfg(_recipe(None))["quant_cfg"] if e["quantizer_name"].startswith("lm_head")
                and e.get("enable") is not False]


@pytest.mark.parametrize("scale", list(HeadScale))
def test_calibration_free_head_scales_follow_modelopt(scale):
    w = torch.randn(40, 32) * torch.logspace(-2, 0, 40)[:, None]
    w[3] = 0.0
    t = head_weight_tensors(w, HeadQuant("fp8", scale))
    amax = w.abs().amax(1) if scale == HeadScale.PER_CHANNEL else w.abs().amax()
    amax = torch.where(amax == 0, torch.ones_like(amax), amax)
    torch.testing.assert_close(t["weight_scale"], amax / 448.0, rtol=0, atol=0)
    layer = QuantLinear("fp8", t["weight"], None, t["weight_scale"])
    err = (layer.dequantized_weight(torch.float32) - w).abs() / (w.abs().amax(1, keepdim=True) + 1e-30)
    assert float(err.max()) < (2**-4 if scale == HeadScale.PER_CHANNEL else 1.0)  # per row: E4M3 resolution
    assert torch.equal(t["weight"][3].view(torch.uint8), torch.zeros(32, dtype=torch.uint8))


@pytest.mark.parametrize("policy", [REFERENCE, ALL_KERNELS], ids=["reference", "interpreter"])
def test_fp8_head_logits_are_fp32_sums_and_rows_are_views(policy):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g)
    t = head_weight_tensors(w, HeadQuant("fp8", HeadScale.PER_CHANNEL))
    head = QuantLinear("fp8", t["weight"], None, t["weight_scale"], name="lm_head")
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    logits = head(x, policy, out_fp32=True)
    q, s = nx.quantize_fp8_per_token(x)
    exact = (nx.dequantize_fp8(q, s, torch.float32) @ head.dequantized_weight(torch.float32).T)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, exact, rtol=1e-5, atol=1e-5)
    assert not torch.equal(logits, logits.to(torch.bfloat16).float())  # not rounded to bf16 on the way
    rows = head.rows(48)
    assert rows is head.rows(48) and rows.weight.data_ptr() == head.weight.data_ptr()  # made once, a view
    assert tuple(rows.weight_scale.shape) == (48,)
    torch.testing.assert_close(rows(x, policy, out_fp32=True), logits[:, :48], rtol=0, atol=0)
    assert head(x).dtype == torch.bfloat16


@pytest.fixture(scope="module")
def head_engine(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setattr(qbuild, "HELDOUT_DOCS", 1)
    mp.setattr(qbuild, "HELDOUT_DECODE_STEPS", 6)
    mp.setattr(qbuild, "CALIB_DECODE_STEPS", 2)
    out = build_engine(tmp_path_factory.mktemp("q") / "e", recipe="mixed_fp8_head", calib="synthetic:2",
                       progress=False)
    mp.undo()
    return out


def test_head_is_exported_untied_in_modelopt_unified_layout(head_engine):
    target = head_engine / "target"
    with safe_open(target / "model.safetensors", framework="pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys() if k.startswith(("lm_head.", "model.language_model.embed_tokens."))}
    vocab, hidden = t["model.language_model.embed_tokens.weight"].shape
    assert t["model.language_model.embed_tokens.weight"].dtype == torch.bfloat16
    assert t["lm_head.weight"].dtype == torch.float8_e4m3fn and t["lm_head.weight"].shape == (vocab, hidden)
    assert t["lm_head.weight_scale"].dtype == torch.float32 and t["lm_head.weight_scale"].shape == (vocab,)
    assert "lm_head.input_scale" not in t  # per-token activation scales
    quant = json.loads((target / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "MIXED_PRECISION"
    assert quant["quantized_layers"]["lm_head"] == {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}
    config = json.loads((target / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and config["text_config"]["tie_word_embeddings"] is False


def test_head_accuracy_is_measured_alone_and_in_the_engine(head_engine):
    report = json.loads((head_engine / "accuracy.json").read_text())
    head = report["lm_head"]
    assert (head["format"], head["scale"]) == ("fp8", "per_channel")
    assert head["weight_bytes"] < 0.6 * head["bf16_weight_bytes"]
    alone = head["alone"]
    assert alone["steps"] == report["summary"]["tokens"] and 0.0 <= alone["top1_agreement"] <= 1.0
    assert 0.0 < alone["mean_abs_logit_error"] <= alone["max_abs_logit_error"]  # the FP8 head moved the logits
    assert "cut after 7 decoded tokens" in report["summary"]["cer_scope"]


def test_quantized_head_engine_decodes_spec_equal_to_ar(head_engine):
    engine = load_engine(head_engine)
    assert isinstance(engine.target.lm_head, QuantLinear) and engine.target.lm_head.fmt == "fp8"
    assert engine.drafter.lm_head is engine.target.lm_head
    out = {mode: [t for ev in engine.generate(EXAMPLE, None, SamplingParams(max_tokens=10, mode=mode))
                  for t in ev.token_ids] for mode in ("spec", "ar")}
    assert len(out["ar"]) > 0 and out["spec"] == out["ar"]


def _greedy(target, drafter, prompt, tokens: int, block: int, policy: ExecutionPolicy) -> list[int]:
    """Greedy tokens from the runtime's own prefill and decode steps (``spec`` with a drafter, else ``ar``)."""
    length = prompt.input_ids.numel() + tokens + 2 * block
    tcache = TargetCache.allocate(target.text_config, 1, length, block, torch.float32)
    dcache = None
    if drafter is not None:
        c = drafter.config
        dcache = DrafterCache.allocate(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 1, length, torch.float32)
    out = [int(prefill(target, drafter, tcache, dcache, 0, prompt, policy=policy).argmax(-1))]
    zero = torch.zeros(1)
    params = SamplingTensors(zero, torch.ones(1), zero.long(), zero.long())
    slots = torch.zeros(1, dtype=torch.long)
    while len(out) < tokens:
        attn = int(tcache.kv_len[0]) + block
        step = decode_step(target, drafter, tcache, dcache, slots, torch.tensor([out[-1]]), params, attn, True,
                           policy)
        out += step.tokens[0, : int(step.accepted[0]) + 1].tolist()
    return out[:tokens]


@pytest.mark.parametrize("policy,rules", [(REFERENCE, RULES), (FP8_DECODE_GEMM, [])], ids=["reference", "interpreter"])
def test_tiny_model_with_fp8_head_keeps_spec_equal_to_ar(tmp_path, policy, rules):
    """A tied tiny target with an FP8 head (and FP8 layers on the references; with the head's FP8 decode GEMM in the
    interpreter, the head alone: the layers' is tested on its own); its drafter drafts from the head's first 48 rows,
    and the target's verify blocks get the logits its one-token steps get."""
    cfg = vlm_config(text_config(tie_word_embeddings=True, vocab_size=96))
    target = OCRiaForConditionalGeneration.from_pretrained(save_hf(hf_vlm(cfg, seed=3), tmp_path / "t"))
    write_drafter(tmp_path / "d", drafter_config(cfg["text_config"], draft_vocab_size=48), seed=4)
    drafter = DFlash2Drafter.from_pretrained(tmp_path / "d", target)
    embed = target.text.embed_tokens.weight.detach().clone()
    formats = quantize_in_place(target, _recipe({"format": "fp8", "scale": "per_channel"}, rules=rules))
    assert formats["lm_head"] == "fp8" and not target.text_config.tie_word_embeddings
    assert torch.equal(target.text.embed_tokens.weight, embed)  # the embeddings stay as they were
    drafter.bind(target.text.embed_tokens, target.lm_head)
    target.text.fuse_projections()
    drafter.fuse_projections()
    ids, grid = image_prompt((4, 4))
    prompt = PreparedPrompt(ids, pixels(grid, cfg["vision_config"], torch.Generator().manual_seed(5)), grid)
    with torch.no_grad():
        block = drafter.config.block_size
        ar, spec = (_greedy(target, d, prompt, 14, block, policy) for d in (None, drafter))
        hidden = torch.randn(1, 3, cfg["text_config"]["hidden_size"])
        draft_logits = drafter.head(hidden, policy)
    torch.testing.assert_close(draft_logits, target.lm_head(hidden, policy)[..., :48], rtol=0, atol=0)
    assert ar == spec
