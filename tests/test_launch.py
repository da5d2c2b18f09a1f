"""PDL launches (ocria/plugins/launch.py): the execution policy's ``pdl`` asks for them, on Hopper-or-newer CUDA only,
never in the interpreter."""

from dataclasses import replace

import torch

from ocria.plugins import launch
from ocria.plugins.decode_gemm import decode_gemm
from ocria.plugins.policy import ALL_KERNELS, AUTO, ExecutionPolicy, Launch


def test_pdl_is_opt_in_and_needs_hopper(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(launch, "capability", lambda index: (9, 0))
    assert Launch.PDL not in AUTO.launch
    assert launch.pdl_args(cuda, AUTO.launch) == {"PDL": False, "launch_pdl": False}
    pdl = ExecutionPolicy.from_env(environ={"OCRIA_PDL": "1"}).launch
    assert launch.pdl_args(cuda, pdl) == {"PDL": True, "launch_pdl": True}
    assert launch.pdl_args(torch.device("cpu"), pdl) == {"PDL": False, "launch_pdl": False}
    monkeypatch.setattr(launch, "capability", lambda index: (8, 9))  # Ada: no griddepcontrol
    assert launch.pdl_args(cuda, pdl) == {"PDL": False, "launch_pdl": False}


def test_kernels_ignore_pdl_in_the_interpreter():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(32, 64, generator=g).to(torch.bfloat16)
    want = decode_gemm(x, w, policy=ALL_KERNELS)
    assert torch.equal(decode_gemm(x, w, policy=replace(ALL_KERNELS, pdl=True)), want)


def test_always_pdl_needs_hopper_but_not_the_policy(monkeypatch):
    """The ReplaySSM verify launch beside its prep kernel: PDL on every Hopper, whatever the policy's ``pdl``."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(launch, "capability", lambda index: (9, 0))
    assert launch.pdl_args(cuda, Launch.NONE, always=True) == {"PDL": True, "launch_pdl": True}
    assert launch.pdl_args(cuda, Launch.NONE, always=False) == {"PDL": False, "launch_pdl": False}
    assert launch.pdl_args(torch.device("cpu"), Launch.NONE, always=True) == {"PDL": False, "launch_pdl": False}
    monkeypatch.setattr(launch, "capability", lambda index: (8, 9))
    assert launch.pdl_args(cuda, Launch.NONE, always=True) == {"PDL": False, "launch_pdl": False}
