"""bench/replay_ssm_bytes.py on CPU (Triton interpreter, tiny heads): the bytes kernel reads and writes what the
floor counts (checked through the values it leaves), the script writes its rows, and malformed options are refused."""

import json

import pytest
import torch
from bench_scripts import load_bench


def test_bytes_kernel_touches_every_floor_byte():
    mod = load_bench("replay_ssm_bytes")
    RB = mod.RB
    Hk, Hv, D, Tmax, B, T = 2, 4, 32, 16, 3, 5
    gen = torch.Generator().manual_seed(0)
    pending = torch.tensor([0, 3, 16, 7, 1])
    bufs, _ = RB.make_buffers(5, Hk, Hv, D, D, Tmax, 1, 1, torch.device("cpu"), gen, pending)
    inp, _ = RB.make_inputs(B, T, Hk, Hv, D, D, 1, torch.bfloat16, torch.device("cpu"), gen)
    slots = torch.tensor([4, 1, 2], dtype=torch.int32)
    before = {k: t.clone() for k, t in bufs.items()}
    o = mod.floor_bytes_kernel(**inp, **bufs, slot_ids=slots)
    for i, s in enumerate(slots.tolist()):
        n, ph = int(pending[s]), int(before["ring_phase"][s])
        g_tot = before["ring_g"][s, ph, :n].sum(0)  # [Hv]
        k_sum = before["ring_k"][s, ph, :n].sum(0)  # [Hk, D]
        want = before["state"][s] + g_tot[:, None, None] + k_sum.repeat_interleave(Hv // Hk, 0)[:, :, None]
        torch.testing.assert_close(bufs["state"][s], want)
        v = inp["v"][i].float()
        kq = (inp["k"][i].float() + inp["q"][i].float()).sum(-1).repeat_interleave(Hv // Hk, 1)  # [T, Hv]
        u_sum = before["ring_u"][s, ph, :n].sum(0)  # [Hv, D]
        torch.testing.assert_close(o[i].float(), v + kq[..., None] + u_sum, rtol=1e-2, atol=1e-2)  # bf16 output
        torch.testing.assert_close(bufs["ring_u"][s, 1 - ph, :T], v)
        torch.testing.assert_close(bufs["ring_k"][s, 1 - ph, :T], inp["k"][i].float())
        torch.testing.assert_close(bufs["ring_g"][s, 1 - ph, :T], inp["a"][i].float() + inp["b"][i].float())
    assert torch.equal(bufs["state"][[0, 3]], before["state"][[0, 3]])  # slots not in the batch are untouched


def test_script_writes_rows(tmp_path):
    out = tmp_path / "bytes.json"
    load_bench("replay_ssm_bytes").main(["--device", "cpu", "--heads", "2", "4", "32", "--rows", "2x3",
                                         "--rotate-mib", "0", "--tilings", "16x4x16x2", "--out", str(out)])  # fmt: skip
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["batch"], row["T"]) == (2, 3)
    assert all(row[f"{n}_us"] > 0 for n in ("ours", "bytes_kernel", "copy")) and row["tilings"]["16x4x16x2"] > 0


@pytest.mark.parametrize(
    ("option", "message"),
    [(["--tilings", "64x4x32"], "use BVxWARPSxCHUNKxSTAGES"), (["--tilings", "64x4xAx3"], "use BVxWARPSxCHUNKxSTAGES"),
     (["--rows", "8"], "use BATCHxT")],
)  # fmt: skip
def test_bad_tilings_or_rows_are_refused(tmp_path, option, message):
    with pytest.raises(SystemExit, match=message):
        load_bench("replay_ssm_bytes").main(["--device", "cpu", "--heads", "2", "4", "32", "--rows", "2x3",
                                             "--rotate-mib", "0", *option, "--out", str(tmp_path / "x.json")])
