"""The kernel-benchmark registry and runner (``bench.ops``) on CPU: every registered op's kernel variants pass their
check at the op's tiny shape in Triton's interpreter, a wrong variant is reported as failed and never timed, rows
stay batch invariant, and the CLI writes the shared result header and refuses an unknown op in one line."""

import json
from dataclasses import replace

import pytest

from bench.ops import run
from bench.ops.registry import Variant, all_ops

OPS = all_ops()


@pytest.mark.parametrize("name", list(OPS))
def test_every_op_passes_its_check_at_its_cpu_shape(name):
    op = OPS[name]
    shapes = [s for s in op.shapes if s.cpu]
    assert shapes and "kernel" in op.variants and op.baseline in ("reference", *op.variants)
    rows = run.run_op(op, shapes, None, "cpu")
    cpu_variants = {n for n, v in op.variants.items() if not v.cuda_only}
    assert {r.variant for r in rows} == {"reference", *cpu_variants}
    assert all(r.ok and r.us is None and r.floor_bytes > 0 for r in rows), [r for r in rows if not r.ok]


def test_a_wrong_variant_is_reported_failed_and_not_timed():
    op = OPS["decode_gemm"]
    wrong = replace(op, variants={**op.variants, "wrong": Variant(lambda i: (op.reference(i)[0] * 1.5,))})
    timed = []

    def timer(call, copies):
        timed.append(call)
        return 1.0

    rows = {r.variant: r for r in run.run_op(wrong, [op.shape("cpu_m3")], ["kernel", "wrong"], "cpu", 1e9, timer)}
    assert not rows["wrong"].ok and rows["wrong"].us is None and "rel" in rows["wrong"].reason
    assert rows["kernel"].ok and rows["kernel"].us == 1.0 and rows["kernel"].over_baseline == 1.0
    assert wrong.variants["wrong"].call not in timed and len(timed) == 2  # the reference and the kernel


def test_a_variant_that_raises_is_a_failed_row():
    op = OPS["sigmoid_gate"]

    def broken(i):
        raise RuntimeError("no such tile")

    rows = run.run_op(replace(op, variants={"kernel": Variant(broken)}), [op.shape("cpu_b2")], None, "cpu")
    assert [r.ok for r in rows] == [True, False] and "no such tile" in rows[1].reason


def test_invariance_on_cpu(tmp_path, capsys):
    out = tmp_path / "inv.json"
    assert run.main(["--device", "cpu", "--invariance", "--op", "decode_gemm", "silu_quant_nvfp4", "--out",
                     str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["ok"] and {r["op"] for r in result["invariance"]} == {"decode_gemm", "silu_quant_nvfp4"}
    assert all(r["ok"] for r in result["invariance"])


def test_the_cli_writes_the_shared_header(tmp_path, capsys):
    out = tmp_path / "ops.json"
    assert run.main(["--device", "cpu", "--op", "kv_write", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["benchmark"] == "ops" and {"command", "git", "time", "device", "torch"} <= set(result)
    assert [r["variant"] for r in result["rows"]] == ["reference", "kernel"] and result["ok"]
    assert "kv_write" in capsys.readouterr().out


def test_an_unknown_op_is_one_line_and_exit_2(capsys):
    assert run.main(["--device", "cpu", "--op", "no_such_op"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown op 'no_such_op'" in err


def test_floors_count_the_weight_once():
    op = OPS["decode_gemm"]
    s = op.shape("sim_lm_head_m1")
    assert op.floor(s).bytes == 2 * 248320 * 2048 + 2 * (2048 + 248320)
