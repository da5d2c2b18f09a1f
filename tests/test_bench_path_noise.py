"""bench/path_noise.py --layers on the shipped bf16 engine (CPU): the ar path (T=1 steps) and the verify path
(block-wide steps) of the same teacher-forced answer part only by fp32 rounding, in every decoder layer."""

from bench_scripts import load_bench

from ocria.builder.engine import build_engine


def test_layer_noise_of_the_bf16_engine_is_fp32_rounding(tmp_path):
    path_noise = load_bench("path_noise")
    engine = build_engine(tmp_path / "engine", progress=False)
    (row,) = path_noise.layer_noise(str(engine), "cpu", [0])
    names = [layer["module"] for layer in row["layers"]]
    assert row["verify_width"] == 16 and row["tokens"] >= 16 and row["tokens"] % 16 == 0
    assert "layer 0" in names and "layer 0 linear_attn" in names and "layer 3 self_attn" in names
    assert all(layer["relative"] < 1e-5 for layer in row["layers"]), row["layers"]
    gates = path_noise.gate_noise("cpu")
    assert gates["tokens"] == 16 and gates["max_relative_diff"] < 1e-6  # at most an ulp or two apart
