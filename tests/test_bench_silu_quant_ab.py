"""bench/silu_quant_ab.py's options on CPU: malformed variants, unknown attributes, kernel files that do not import
and malformed rows are refused with a one-line message before any kernel runs (the A/B itself needs the GPU)."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from bench_scripts import load_bench

KERNEL = Path(__file__).parents[1] / "ocria" / "plugins" / "silu_quant" / "kernel.py"


def test_rows_parse_tokens_by_width():
    assert load_bench("silu_quant_ab").parse_rows(["1024x6144", "16x48"]) == [(1024, 6144), (16, 48)]


@pytest.mark.parametrize("spec", ["1024", "1024x100", "0x6144", "ax16"])
def test_bad_rows_are_refused(spec):
    with pytest.raises(SystemExit, match="use TOKENSxWIDTH"):
        load_bench("silu_quant_ab").parse_rows([spec])


@pytest.mark.parametrize(
    ("variants", "message"),
    [(["head"], "use name=path"), (["head=/no/such/kernel.py"], "no kernel file"),
     ([f"a={KERNEL}", f"a={KERNEL}"], "names must differ"),
     ([f"a={KERNEL}:NO_SUCH_SETTING=1"], "has no attribute NO_SUCH_SETTING")],
)  # fmt: skip
def test_bad_variants_are_refused(tmp_path, variants, message):
    argv = [a for v in variants for a in ("--variant", v)] + ["--out", str(tmp_path / "ab.json")]
    with pytest.raises(SystemExit, match=message):
        load_bench("silu_quant_ab").main(argv)


def test_a_kernel_file_that_does_not_import_is_refused(tmp_path):
    broken = tmp_path / "kernel.py"
    broken.write_text("def silu_mul_quant_triton(:\n")
    with pytest.raises(SystemExit, match="does not load: SyntaxError"):
        load_bench("silu_quant_ab").main(["--variant", f"x={broken}", "--out", str(tmp_path / "ab.json")])


def test_inexact_variants_are_timed_only_when_asked():
    ab = load_bench("silu_quant_ab")
    variants = [SimpleNamespace(name=n) for n in ("exact", "probe")]
    checks = {"exact": [{"mismatches": 0}], "probe": [{"mismatches": 0}, {"mismatches": 3}]}
    assert [v.name for v in ab.timed_variants(variants, checks, False)] == ["exact"]
    assert [v.name for v in ab.timed_variants(variants, checks, True)] == ["exact", "probe"]
