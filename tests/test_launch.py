"""The PDL launch switch (ocria/plugins/launch.py): opt-in, Hopper-or-newer CUDA only, never in the interpreter."""

import torch

from ocria.plugins import launch
from ocria.plugins.decode_gemm import decode_gemm


def test_pdl_is_opt_in_and_needs_hopper(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(launch, "capability", lambda index: (9, 0))
    monkeypatch.delenv(launch.PDL_ENV, raising=False)
    assert launch.pdl_args(cuda) == {"PDL": False, "launch_pdl": False}
    monkeypatch.setenv(launch.PDL_ENV, "1")
    assert launch.pdl_args(cuda) == {"PDL": True, "launch_pdl": True}
    assert not launch.pdl_launch(torch.device("cpu"))
    monkeypatch.setattr(launch, "capability", lambda index: (8, 9))  # Ada: no griddepcontrol
    assert not launch.pdl_launch(cuda)


def test_kernels_ignore_pdl_in_the_interpreter(monkeypatch):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(32, 64, generator=g).to(torch.bfloat16)
    want = decode_gemm(x, w, use_kernel=True)
    monkeypatch.setenv(launch.PDL_ENV, "1")
    assert torch.equal(decode_gemm(x, w, use_kernel=True), want)


def test_always_pdl_needs_hopper_but_not_the_switch(monkeypatch):
    """The ReplaySSM verify launch beside its prep kernel: PDL on every Hopper, whatever OCRIA_PDL says."""
    cuda = torch.device("cuda")
    monkeypatch.delenv(launch.PDL_ENV, raising=False)
    monkeypatch.setattr(launch, "capability", lambda index: (9, 0))
    assert launch.pdl_args(cuda, always=True) == {"PDL": True, "launch_pdl": True}
    assert launch.pdl_args(cuda, always=False) == {"PDL": False, "launch_pdl": False}
    assert launch.pdl_args(torch.device("cpu"), always=True) == {"PDL": False, "launch_pdl": False}
    monkeypatch.setattr(launch, "capability", lambda index: (8, 9))
    assert launch.pdl_args(cuda, always=True) == {"PDL": False, "launch_pdl": False}
