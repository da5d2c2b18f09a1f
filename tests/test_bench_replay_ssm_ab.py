"""bench/replay_ssm_ab.py on CPU (Triton interpreter, tiny heads): every variant is checked against float64 and timed,
its settings apply to it alone, and a bad variant is refused before anything runs."""

import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
KERNEL = str(ROOT / "ocria" / "plugins" / "replay_ssm" / "kernel.py")


def _load():
    spec = importlib.util.spec_from_file_location("bench_replay_ssm_ab", ROOT / "bench" / "replay_ssm_ab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
        _load().parse_variant(spec)


def test_bad_rows_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="use BATCHxT"):
        _load().main(["--device", "cpu", "--rows", "2x3x4", "--variant", f"head={KERNEL}", "--out", str(tmp_path)])


def test_an_unknown_attribute_is_refused():
    ab = _load()
    with pytest.raises(SystemExit, match="has no attribute KEY_CHUNKS"):
        ab.load(ab.parse_variant(f"x={KERNEL}:KEY_CHUNKS=16"))
