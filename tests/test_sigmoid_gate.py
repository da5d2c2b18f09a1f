"""Output-gate plugin: the one-launch Triton kernel (CPU interpreter) against ``o * sigmoid(gate)`` for the
layouts attention produces (gate a strided view of the q projection, o a transposed attention output)."""

import pytest
import torch

from ocria.errors import OcriaError
from ocria.plugins.policy import ALL_KERNELS
from ocria.plugins.sigmoid_gate import sigmoid_gate, sigmoid_gate_reference
from ocria.plugins.sigmoid_gate.kernel import sigmoid_gate_triton


def _case(dtype: torch.dtype, B=2, T=3, H=4, D=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, T, H, 2 * D, generator=g) * 4).to(dtype)
    _, gate = q.chunk(2, dim=-1)  # strided along heads and tokens, as the layer splits its q projection
    o = torch.randn(B, H, T, D, generator=g).to(dtype).transpose(1, 2)  # [B, T, H, D] view of the attention output
    return o, gate


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[a.dtype]
    return int((a.view(bits).long() - b.view(bits).long()).abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_kernel_matches_the_reference(dtype):
    o, gate = _case(dtype)
    got = sigmoid_gate(o, gate, policy=ALL_KERNELS)
    want = sigmoid_gate_reference(o, gate)
    assert got.shape == want.shape == (2, 3, 4 * 40) and got.dtype == dtype
    # exp differs by an ulp between numpy (the interpreter) and PyTorch's CPU kernels; the chain is the same
    assert _ulps(got, want) <= (1 if dtype != torch.float32 else 4)


def test_special_values_follow_the_reference():
    o, gate = _case(torch.bfloat16, B=1, T=1, H=1, D=8)
    gate[0, 0, 0, :] = torch.tensor([0.0, -0.0, 100.0, -100.0, float("inf"), -float("inf"), float("nan"), 1e-30])
    got = sigmoid_gate(o, gate, policy=ALL_KERNELS)
    want = sigmoid_gate_reference(o, gate)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~got.isnan()], want[~want.isnan()])


def test_mismatched_inputs_are_refused_by_the_kernel_and_run_the_reference():
    o, gate = _case(torch.float32)
    g64 = gate.double()
    with pytest.raises(OcriaError, match="sigmoid_gate kernel"):
        sigmoid_gate_triton(o, g64)
    assert torch.equal(sigmoid_gate(o, g64, policy=ALL_KERNELS), sigmoid_gate_reference(o, g64))
