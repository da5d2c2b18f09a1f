"""bench/replay_ssm_ab.py on CPU (Triton interpreter, tiny heads): every variant is checked against float64 and timed,
its settings apply to it alone, a bad variant is refused before anything runs, and with a check timeout a variant
whose check fails or hangs is recorded and left out of the timing."""

import json
import os
import sys

import pytest
from bench_scripts import load_bench

from ocria.plugins.replay_ssm import kernel

KERNEL = kernel.__file__


def _load():
    return load_bench("replay_ssm_ab")


def _variants():
    """bench/kernel_variants.py, which parses and loads the A/B's variants."""
    return load_bench("kernel_variants")


def test_variants_are_checked_timed_and_keep_their_settings_to_themselves(tmp_path, monkeypatch):
    ab = _load()
    monkeypatch.delenv("OCRIA_PDL", raising=False)
    out = tmp_path / "ab.json"
    ab.main(["--device", "cpu", "--heads", "2", "4", "32", "--rows", "2x3", "--rounds", "1", "--check-batches", "2",
             "--rotate-mib", "0", "--variant", f"head={KERNEL}",
             "--variant", f"chunk16={KERNEL}:KEY_CHUNK=16;env.OCRIA_PDL=1", "--out", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    assert [v["name"] for v in result["variants"]] == ["head", "chunk16"]
    assert result["variants"][1]["attrs"] == {"KEY_CHUNK": 16} and result["variants"][1]["env"] == {"OCRIA_PDL": "1"}
    assert [(r["variant"], r["batch"], r["T"]) for r in result["rows"]] == [("head", 2, 3), ("chunk16", 2, 3)]
    for name in ("head", "chunk16"):
        errors = result["correctness"][name]["2"]
        assert errors["float32"]["output"] < 1e-5 and errors["bfloat16"]["output"] < 1e-2
    assert "OCRIA_PDL" not in os.environ  # the variant's environment was put back
    assert kernel.KEY_CHUNK == 32  # and its attribute went to its own copy of the kernel module


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("head", "use name=path"),
        ("head=/no/such/kernel.py", "no kernel file"),
        (f"x={KERNEL}:KEY_CHUNK", "not KEY=value"),
    ],
)
def test_bad_variant_specs_are_refused(spec, message):
    with pytest.raises(SystemExit, match=message):
        _variants().parse_variant(spec)


@pytest.mark.parametrize(
    ("option", "message"), [(["--rows", "2x3x4"], "use BATCHxT"), (["--rounds", "0"], "at least 1")]
)
def test_bad_rows_or_rounds_are_refused(tmp_path, option, message):
    with pytest.raises(SystemExit, match=message):
        _load().main(["--device", "cpu", *option, "--variant", f"head={KERNEL}", "--out", str(tmp_path)])


def test_an_unknown_attribute_or_a_broken_kernel_file_is_refused(tmp_path):
    kv = _variants()
    with pytest.raises(SystemExit, match="has no attribute KEY_CHUNKS"):
        kv.load(kv.parse_variant(f"x={KERNEL}:KEY_CHUNKS=16"))
    broken = tmp_path / "kernel.py"
    broken.write_text("def replay_verify_kernel(:\n")
    with pytest.raises(SystemExit, match="does not load: SyntaxError"):
        kv.load(kv.parse_variant(f"x={broken}"))


def test_a_child_that_hangs_is_killed_and_one_that_fails_says_why():
    ab = _load()
    assert ab.run_child([sys.executable, "-c", "pass"], 60) is None
    assert ab.run_child([sys.executable, "-c", "raise SystemExit('no kernel here')"], 60) == "no kernel here"
    assert ab.run_child([sys.executable, "-c", "import time; time.sleep(60)"], 1) == "no result within 1 s (killed)"


def _failing_kernel(tmp_path):
    """A copy of the kernel file whose verify launch raises, as a broken variant's would."""
    path = tmp_path / "boom.py"
    broken = "\n\ndef replay_verify_kernel(*args, **kwargs):\n    raise RuntimeError('boom')\n"
    path.write_text(open(KERNEL).read() + broken)
    return path


def test_with_a_check_timeout_a_failing_variant_is_recorded_and_left_out_of_the_timing(tmp_path):
    out = tmp_path / "ab.json"
    _load().main(["--device", "cpu", "--heads", "2", "4", "32", "--rows", "2x3", "--rounds", "1", "--check-batches",
                  "2", "--rotate-mib", "0", "--check-timeout", "120", "--variant", f"head={KERNEL}",
                  "--variant", f"boom={_failing_kernel(tmp_path)}", "--out", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    assert result["correctness"]["boom"] == {"failed": "RuntimeError: boom"}
    assert result["correctness"]["head"]["2"]["bfloat16"]["output"] < 1e-2  # checked in its own process
    assert [r["variant"] for r in result["rows"]] == ["head"]


def test_when_no_variant_passes_its_check_nothing_is_timed(tmp_path):
    out = tmp_path / "ab.json"
    with pytest.raises(SystemExit, match="no variant passed its check"):
        _load().main(["--device", "cpu", "--heads", "2", "4", "32", "--rows", "2x3", "--check-batches", "2",
                      "--check-timeout", "120", "--variant", f"boom={_failing_kernel(tmp_path)}", "--out", str(out)])
    assert json.loads(out.read_text())["correctness"] == {"boom": {"failed": "RuntimeError: boom"}}


def test_a_negative_check_timeout_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="--check-timeout -1"):
        _load().main(["--device", "cpu", "--check-timeout", "-1", "--variant", f"head={KERNEL}",
                      "--out", str(tmp_path)])
