"""Format cost tables: the decode GEMMs of a model, the default models per GPU architecture (Hopper keeps NVFP4 off
where FP8 is faster, Blackwell lets it through), ``ocria bench formats`` measuring one, the builder recording it in
the manifest, and the ``auto`` search narrowed per layer by it."""

import json

import pytest

import ocria.quant.build as qbuild
from ocria.builder.engine import build_engine
from ocria.builder.presets import load_preset
from ocria.cli import main
from ocria.errors import OcriaError
from ocria.models import OCRiaConfig
from ocria.quant.build import search_spaces
from ocria.quant.costs import CostSource, CostTable, decode_gemms, gemm_of

SIM = OCRiaConfig.from_dict(load_preset("ocria-1-sim").target).text
MINI = OCRiaConfig.from_dict(load_preset("ocria-mini").target).text


def test_decode_gemms_are_the_fused_gemms_of_a_step():
    gemms = {g.name: g for g in decode_gemms(SIM)}
    assert (gemms["linear_attn.in_proj_qkvz"].k, gemms["linear_attn.in_proj_qkvz"].n) == (2048, 2 * 2048 + 2 * 4096)
    assert (gemms["self_attn.qkv"].k, gemms["self_attn.qkv"].n) == (2048, 2 * 8 * 256 + 2 * 2 * 256)
    assert (gemms["mlp.gate_up"].n, gemms["mlp.down"].k, gemms["lm_head"].n) == (12288, 6144, 248320)
    layers = decode_gemms(SIM)
    assert gemm_of("model.language_model.layers.3.self_attn.k_proj", layers).name == "self_attn.qkv"
    assert gemm_of("model.language_model.layers.0.mlp.down_proj", layers).name == "mlp.down"
    assert gemm_of("lm_head", layers).name == "lm_head"
    assert gemm_of("model.language_model.layers.0.linear_attn.in_proj_a", layers) is None  # stays bf16


def test_default_models_keep_nvfp4_off_hopper_and_let_it_on_blackwell():
    gemms = decode_gemms(SIM)
    hopper, blackwell = CostTable.default("sm_90", gemms), CostTable.default("sm_100", gemms)
    assert hopper.source == CostSource.DEFAULT and "no measurement" in hopper.note
    for g in gemms:
        assert hopper.candidates(g.name, ("nvfp4", "fp8")) == ("fp8",)
        assert hopper.cost(g.name, "fp8") < hopper.cost(g.name, "nvfp4")
        assert blackwell.candidates(g.name, ("nvfp4", "fp8")) == ("nvfp4", "fp8")
    with pytest.raises(OcriaError, match="no default format cost model for GPU architecture 'sm_75'"):
        CostTable.default("sm_75", gemms)


def _table(us: dict) -> CostTable:
    shapes = {g.name: (g.k, g.n) for g in decode_gemms(MINI)}
    full = {name: us.get(name, {"bf16": [4.0, 4.0], "fp8": [3.0, 3.0], "nvfp4": [2.0, 2.0]}) for name in shapes}
    return CostTable("cpu", CostSource.MEASURED, "test", (1, 16), shapes, full)


def test_candidates_drop_formats_slower_than_any_with_more_bits():
    table = _table({"mlp.gate_up": {"bf16": [4.0, 4.0], "fp8": [3.0, 3.5], "nvfp4": [2.0, 5.0]},  # nvfp4 > fp8
                    "mlp.down": {"bf16": [2.0, 2.0], "fp8": [3.0, 3.0], "nvfp4": [1.0, 1.0]}})  # fp8 > bf16
    assert table.candidates("mlp.gate_up", ("nvfp4", "fp8")) == ("fp8",)
    assert table.candidates("mlp.down", ("nvfp4", "fp8")) == ("nvfp4",)  # not slower than bf16: kept
    assert table.candidates("mlp.down", ("fp8",)) == ()
    assert table.candidates("self_attn.qkv", ("nvfp4", "fp8")) == ("nvfp4", "fp8")
    assert table.candidates("not.timed", ("fp8",)) == ("fp8",)
    again = CostTable.from_json(json.loads(json.dumps(table.to_json())))
    assert again.us == table.us and again.shapes == table.shapes and again.source == CostSource.MEASURED


@pytest.mark.parametrize("raw,match", [({"format": "x"}, "not a format cost table"),
                                       ({"format": "ocria-format-costs/1", "arch": "sm_90"}, "malformed"),
                                       ({"format": "ocria-format-costs/1", "arch": "sm_90", "source": "measured",
                                         "rows": [1], "gemms": {"g": {"k": 16, "n": 16, "us": {"int4": [1.0]}}}},
                                        "g/int4")])
def test_bad_tables_are_refused_in_one_line(raw, match):
    with pytest.raises(OcriaError, match=match):
        CostTable.from_json(raw)


def test_search_spaces_narrow_each_layer_to_its_gemms_candidates():
    from ocria.quant.modelopt_cfg import preset

    table = _table({"mlp.gate_up": {"bf16": [4.0, 4.0], "fp8": [3.0, 3.0], "nvfp4": [9.0, 9.0]},
                    "mlp.down": {"bf16": [2.0, 2.0], "fp8": [3.0, 3.0], "nvfp4": [9.0, 9.0]}})
    layers = [f"model.language_model.layers.{i}.{s}" for i in (1, 2)
              for s in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "self_attn.q_proj")]
    spaces, kept, allowed = search_spaces(layers, ["nvfp4", "fp8"], table, decode_gemms(MINI))
    assert allowed == {"self_attn.qkv": ["nvfp4", "fp8"], "mlp.gate_up": ["fp8"], "mlp.down": []}
    assert kept == [n for n in layers if n.endswith("down_proj")]
    assert spaces == [{"module_name_patterns": [n for n in layers if n.endswith(("gate_proj", "up_proj"))],
                       "quantization_formats": [preset("fp8")]}]


def test_bench_formats_measures_a_table_the_builder_records(tmp_path, capsys):
    out = tmp_path / "costs.json"
    assert main(["bench", "formats", "--preset", "ocria-mini", "--device", "cpu", "--rows", "1", "4",
                 "--gemms", "mlp.down", "lm_head", "--out", str(out)]) == 0
    table = CostTable.load(out)
    assert table.source == CostSource.MEASURED and table.arch == "cpu" and table.rows == (1, 4)
    assert set(table.us) == {"mlp.down", "lm_head"} and all(len(v) == 2 and min(v) > 0
                                                            for t in table.us.values() for v in t.values())
    assert table.extra["header"]["benchmark"] == "formats"
    engine = build_engine(tmp_path / "e", progress=False, format_costs=out)
    recorded = json.loads((engine / "manifest.json").read_text())["format_costs"]
    assert recorded == json.loads(out.read_text())
    default = build_engine(tmp_path / "d", progress=False, target_arch="sm_100")
    recorded = json.loads((default / "manifest.json").read_text())["format_costs"]
    assert (recorded["source"], recorded["arch"]) == ("default", "sm_100")
    assert main(["bench", "formats", "--preset", "ocria-mini", "--formats", "fp8", "--out", str(out)]) == 2
    assert "with bf16" in capsys.readouterr().err


def test_builder_refuses_a_table_of_other_shapes_or_two_sources(tmp_path):
    sim = CostTable.default("sm_90", decode_gemms(SIM))
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(sim.to_json()))
    with pytest.raises(OcriaError, match="measure it for this model"):
        build_engine(tmp_path / "e", progress=False, format_costs=path)
    with pytest.raises(OcriaError, match="both name"):
        build_engine(tmp_path / "e", progress=False, format_costs=path, target_arch="sm_90")
    with pytest.raises(OcriaError, match="--gpu-arch sm_80"):
        build_engine(tmp_path / "e", progress=False, target_arch="sm_80")


def test_auto_build_keeps_bf16_where_the_table_says_quantizing_is_slower(tmp_path, monkeypatch):
    monkeypatch.setattr(qbuild, "HELDOUT_DOCS", 1)
    monkeypatch.setattr(qbuild, "HELDOUT_DECODE_STEPS", 2)
    monkeypatch.setattr(qbuild, "CALIB_DECODE_STEPS", 1)
    table = _table({"mlp.down": {"bf16": [2.0, 2.0], "fp8": [3.0, 3.0], "nvfp4": [9.0, 9.0]}})
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(table.to_json()))
    recipe = tmp_path / "auto.yaml"
    recipe.write_text("name: a\nrules:\n  - {match: 'model.language_model.layers.*', format: fp8}\n"
                      "auto: {effective_bits: 8.0, formats: [fp8]}\n")
    engine = build_engine(tmp_path / "e", recipe=str(recipe), calib="synthetic:1", progress=False, format_costs=path)
    report = json.loads((engine / "accuracy.json").read_text())
    downs = {n: f for n, f in report["layer_formats"].items() if n.endswith("mlp.down_proj")}
    assert downs and set(downs.values()) == {"bf16"}
    assert report["auto"]["candidates"]["mlp.down"] == [] and report["auto"]["kept_bf16_by_costs"] == len(downs)
    assert report["auto"]["costs"] == {"arch": "cpu", "source": "measured", "device": "test"}
    assert "fp8" in report["layer_formats"].values()


def test_auto_build_with_nothing_worth_searching_still_quantizes_the_head(tmp_path, monkeypatch):
    monkeypatch.setattr(qbuild, "HELDOUT_DOCS", 1)
    monkeypatch.setattr(qbuild, "HELDOUT_DECODE_STEPS", 2)
    monkeypatch.setattr(qbuild, "CALIB_DECODE_STEPS", 1)
    slow = {"bf16": [2.0, 2.0], "fp8": [3.0, 3.0], "nvfp4": [9.0, 9.0]}
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(_table({g.name: slow for g in decode_gemms(MINI)}).to_json()))
    recipe = tmp_path / "auto.yaml"
    recipe.write_text("name: a\nrules:\n  - {match: 'model.language_model.layers.*', format: fp8}\n"
                      "auto: {effective_bits: 8.0, formats: [fp8]}\nlm_head: {format: fp8, scale: per_tensor}\n")
    engine = build_engine(tmp_path / "e", recipe=str(recipe), calib="synthetic:1", progress=False, format_costs=path)
    report = json.loads((engine / "accuracy.json").read_text())
    assert set(report["layer_formats"].values()) == {"bf16"} and report["auto"]["searched_layers"] == 0
    assert report["lm_head"]["format"] == "fp8" and report["lm_head"]["alone"]["steps"] > 0
