"""ocria-build engine / ocria run: round trip, tampering refused, build time, one-line errors."""

import json
import time
from pathlib import Path

import pytest
from PIL import Image

from ocria.builder.engine import build_engine
from ocria.builder.presets import SHIPPED, load_preset, shipped_checkpoints
from ocria.cli import build_main, main
from ocria.runtime import load_engine

EXAMPLES = Path(__file__).parent.parent / "examples"
EXAMPLE = EXAMPLES / "report.png"


@pytest.fixture(scope="module")
def engine_dir(mini_engine):
    return mini_engine


def test_default_build_is_fast_atomic_and_refuses_overwrite(tmp_path, capsys):
    t0 = time.perf_counter()
    assert build_main(["engine", "--out", str(tmp_path / "eng")]) == 0
    assert time.perf_counter() - t0 < 60
    manifest = json.loads((tmp_path / "eng" / "manifest.json").read_text())
    assert set(manifest["files"]) == {"target/config.json", "target/model.safetensors", "drafter/config.json",
                                      "drafter/model.safetensors", "tokenizer/tokenizer.json",
                                      "tokenizer/tokenizer_config.json", "tokenizer/preprocessor_config.json"}
    assert manifest["profile"]["block_size"] == 16 and manifest["recipe"] == "bf16"
    assert manifest["sources"]["target"]["files"]["model.safetensors"]["sha256"]
    assert [p.name for p in tmp_path.iterdir()] == ["eng"]  # no temporary left behind
    assert build_main(["engine", "--out", str(tmp_path / "eng")]) == 2
    assert "already exists (use --force" in capsys.readouterr().err
    assert build_main(["engine", "--out", str(tmp_path / "eng"), "--force"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eng"]


def test_build_is_deterministic(tmp_path, engine_dir):
    other = build_engine(tmp_path / "again", progress=False)
    a = json.loads((engine_dir / "manifest.json").read_text())["files"]
    b = json.loads((other / "manifest.json").read_text())["files"]
    assert a == b


def test_build_from_explicit_checkpoints(tmp_path, engine_dir):
    out = build_engine(tmp_path / "copy", target=engine_dir / "target", drafter=engine_dir / "drafter",
                       progress=False)
    assert (out / "drafter" / "model.safetensors").is_file()


def test_failed_build_leaves_nothing(tmp_path, capsys):
    assert build_main(["engine", "--out", str(tmp_path / "x"), "--target", str(tmp_path / "nope")]) == 2
    assert "config file not found" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("tamper", ["change", "truncate", "delete", "extra"])
def test_tampered_engine_refused(tmp_path, engine_dir, tamper):
    import shutil

    eng = Path(shutil.copytree(engine_dir, tmp_path / "eng"))
    victim = eng / "drafter" / "model.safetensors"
    if tamper == "change":
        data = bytearray(victim.read_bytes())
        data[-5] ^= 0xFF
        victim.write_bytes(bytes(data))
    elif tamper == "truncate":
        victim.write_bytes(victim.read_bytes()[:-64])
    elif tamper == "delete":
        victim.unlink()
    else:
        victim = eng / "target" / "notes.txt"
        victim.write_text("hi")
    with pytest.raises(Exception, match=str(victim.name)):
        load_engine(eng)


def test_run_json(engine_dir, capsys):
    assert main(["run", "--engine", str(engine_dir), "--image", str(EXAMPLE), "--max-tokens", "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"text", "token_ids", "num_steps", "acceptance_length", "tokens_per_s"}
    assert 1 <= len(out["token_ids"]) <= 6 and out["plugins"] == "reference" and out["batch_invariant"] is True
    policy = out["policy"]  # the execution policy the run used, each op's implementation on this device
    assert policy["kernels"] == "auto" and policy["batch_invariant"] is True and policy["disabled"] == []
    assert set(policy["kernel"].values()) == {"reference"} and "replay_ssm" in policy["kernel"]
    assert main(["run", "--engine", str(engine_dir), "--image", str(EXAMPLE), "--max-tokens", "6", "--json",
                 "--mode", "ar"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == out["token_ids"]


def test_shipped_weights_match_their_record(engine_dir):
    preset = load_preset("ocria-mini")
    record = json.loads((preset.assets / SHIPPED).read_text())
    assert shipped_checkpoints(preset) == (preset.assets / "target", preset.assets / "drafter")  # sha256 checked
    assert sum(e["bytes"] for e in record["files"].values()) <= 24 * 1000 * 1000
    assert record["training"]["stages"]["target"]["steps"] > 0 and record["training"]["results"]["docs"] > 0
    sources = json.loads((engine_dir / "manifest.json").read_text())["sources"]
    for name in ("target", "drafter"):
        for rel, entry in sources[name]["files"].items():
            assert record["files"][f"{name}/{rel}"] == entry  # the default engine is built from them


def test_default_engine_reads_the_examples(engine_dir, capsys):
    """The shipped trained pair on CPU reads every example exactly, and spec == ar."""
    for name in ("report", "checklist", "invoice_table"):
        truth = (EXAMPLES / f"{name}.md").read_text().rstrip("\n")
        outs = {}
        for mode in ("spec", "ar"):
            args = ["run", "--engine", str(engine_dir), "--image", str(EXAMPLES / f"{name}.png"), "--max-tokens",
                    "256", "--json", "--mode", mode]
            assert main(args) == 0
            outs[mode] = json.loads(capsys.readouterr().out)
        assert outs["spec"]["token_ids"] == outs["ar"]["token_ids"], name
        assert outs["spec"]["text"] == truth, name


def test_train_eval_measures_a_built_engine(engine_dir, tmp_path, capsys):
    """python -m ocria.train eval: CER, tau and spec == ar of any built engine, as JSON; a bad path is one line."""
    from ocria.train.__main__ import main as train_main

    out = tmp_path / "eval.json"
    args = ["eval", "--engine", str(engine_dir), "--docs", "2", "--max-tokens", "16", "--splits", "classic",
            "independent", "--out", str(out)]
    assert train_main(args) == 0
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and sorted(result["splits"]) == ["classic", "independent"]
    for split in result["splits"].values():
        assert split["docs"] == 2 and 0 <= split["cer_ar"]
        assert split["cer_ar"] == sum(split["edits_ar"]) / sum(split["chars"])  # per document, summed as the CER
        assert split["exact_docs_ar"] == split["edits_ar"].count(0)
        for setting in ("selector_on", "selector_off"):
            assert split[setting]["spec_equals_ar"] and split[setting]["docs_differing"] == 0
    capsys.readouterr()
    assert train_main(["eval", "--engine", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "none" in err and "Traceback" not in err


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    (tmp / "notimage.png").write_text("hello, I am text")
    (tmp / "empty.png").write_bytes(b"")
    Image.new("RGB", (1, 300), "white").save(tmp / "strip.png")
    Image.new("RGB", (4, 5000), "white").save(tmp / "thin.png")
    return {
        "missing": (["--image", str(tmp / "nope.png")], "image file not found"),
        "not_image": (["--image", str(tmp / "notimage.png")], "not a readable image"),
        "empty": (["--image", str(tmp / "empty.png")], "image is empty"),
        "strip": (["--image", str(tmp / "strip.png")], "aspect ratio 300 is over 200"),
        "max_tokens_0": (["--max-tokens", "0"], "max_tokens must be a positive integer"),
        "max_tokens_big": (["--max-tokens", "100000"], "beyond what fits"),
        "max_tokens_negative": (["--max-tokens", "-5"], "max_tokens must be a positive integer"),
        "temperature": (["--temperature", "-1"], "temperature must be a finite number >= 0"),
        "temperature_nan": (["--temperature", "nan"], "temperature must be a finite number >= 0"),
        "temperature_inf": (["--temperature", "inf"], "temperature must be a finite number >= 0"),
        "top_p_0": (["--top-p", "0"], "top_p must be in (0, 1]"),
        "top_p_big": (["--top-p", "1.5"], "top_p must be in (0, 1]"),
        "top_p_nan": (["--top-p", "nan"], "top_p must be in (0, 1]"),
        "top_k_negative": (["--top-k", "-1"], "top_k must be >= 0"),
        "seed_huge": (["--seed", str(2**64)], "seed must be a 64-bit integer"),
        "seed_very_negative": (["--seed", str(-(2**63) - 1)], "seed must be a 64-bit integer"),
        "empty_stop": (["--stop", ""], "stop strings must not be empty"),
        "memory_fraction": (["--gpu-memory-fraction", "0"], "gpu_memory_fraction must be in (0, 1]"),
        "memory_fraction_big": (["--gpu-memory-fraction", "1.5"], "gpu_memory_fraction must be in (0, 1]"),
        "device_tpu": (["--device", "tpu"], "device 'tpu': use cpu, cuda or cuda:N"),
        "device_garbage": (["--device", "cuda:x"], "device 'cuda:x': use cpu, cuda or cuda:N"),
        "thin": (["--image", str(tmp / "thin.png")], "a 4x5000 image cannot be read as a page"),
    }


def test_bad_input_one_line_errors(tmp_path, engine_dir, capsys):
    for name, (extra, message) in _bad_inputs(tmp_path).items():
        args = ["run", "--engine", str(engine_dir), "--image", str(EXAMPLE), *extra]
        assert main(args) == 2, name
        captured = capsys.readouterr()
        err = captured.err.strip()
        assert message in err and "\n" not in err and "Traceback" not in err, name
        assert captured.out == "", name


def test_extreme_seeds_run_and_agree(engine_dir, capsys):
    """Any 64-bit seed runs, and one bit pattern is one seed whichever way it is written (-1 == 2^64 - 1)."""
    outputs = []
    for seed in ("-1", str(2**64 - 1), str(2**63)):
        args = ["run", "--engine", str(engine_dir), "--image", str(EXAMPLE), "--json", "--temperature", "0.9",
                "--seed", seed, "--max-tokens", "6"]
        assert main(args) == 0
        outputs.append(json.loads(capsys.readouterr().out)["token_ids"])
    assert outputs[0] == outputs[1] and len(outputs[2]) == 6


def test_missing_engine(tmp_path, capsys):
    assert main(["run", "--engine", str(tmp_path / "none"), "--image", str(EXAMPLE)]) == 2
    assert "engine directory not found" in capsys.readouterr().err


def test_bad_calibration_set_refused_before_work(tmp_path, capsys):
    args = ["engine", "--out", str(tmp_path / "q"), "--recipe", "fp8", "--calib", str(tmp_path / "no-such-dir")]
    assert build_main(args) == 2
    assert "no-such-dir" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_slots_sized_from_free_gpu_memory(engine_dir):
    from ocria.models.cache import cache_bytes
    from ocria.runtime.engine import plan_batch_size

    engine = load_engine(engine_dir)
    per_slot = engine.slot_bytes()
    sched = engine.scheduler(max_batch_size=3)
    real = cache_bytes(sched.runner.tcache) + cache_bytes(sched.runner.dcache)
    assert per_slot > real / 3  # the caches of one slot, plus the step's logits
    gib = 1 << 30
    assert plan_batch_size(10 * gib, 16 * gib, 0.9, gib, 64) == 7  # 10 - 1.6 GiB fit 8 slots, one is spare
    assert plan_batch_size(100 * gib, 140 * gib, 0.9, gib, 64) == 64
    with pytest.raises(Exception, match="not enough GPU memory for one sequence"):
        plan_batch_size(gib, 16 * gib, 0.9, gib, 8)
    with pytest.raises(Exception, match="gpu_memory_fraction must be in"):
        plan_batch_size(gib, 16 * gib, 1.5, gib, 8)


def test_logit_gap_measures_greedy_margins_on_the_uncached_forward(engine_dir):
    """The evaluation's tie check: ``logit_gap`` reads one uncached forward, whose argmax is ar's token at
    every position (so a spec/ar divergence can be judged against it), and is None past either end."""
    import torch

    from ocria.runtime.engine import Engine
    from ocria.train.evaluate import logit_gap, transcribe

    engine = Engine(engine_dir, device="cpu")
    image = EXAMPLE.read_bytes()
    ar = transcribe(engine, [image], "ar", 5, 1)[0]["tokens"]
    prompt = engine.processor.prepare(image)
    for i, token in enumerate(ar):
        ids = torch.cat([prompt.input_ids, torch.tensor(ar[:i], dtype=torch.long)])[None]
        with torch.no_grad():
            logits = engine.target(ids, prompt.pixel_values, prompt.image_grid_thw)[0, -1]
        top2 = logits.topk(2)
        assert int(top2.indices[0]) == token
        margin = float(top2.values[0] - top2.values[1])
        assert logit_gap(engine.target, prompt, ar[:i], token, int(top2.indices[1])) == pytest.approx(margin)
        assert logit_gap(engine.target, prompt, ar[:i], token, token) == 0.0
    assert logit_gap(engine.target, prompt, ar, ar[0], None) is None
