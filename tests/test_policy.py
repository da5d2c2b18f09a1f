"""The execution policy (ocria/plugins/policy.py): built from ``--plugins`` and the ``OCRIA_*`` variables, checked
by name, and what it tells the ops (``uses``) and their launchers (``launch``)."""

import json
from dataclasses import replace

import pytest
import torch

from ocria.errors import OcriaError
from ocria.plugins.policy import (
    ALL_KERNELS,
    AUTO,
    KERNEL_NAMES,
    REFERENCE,
    ExecutionPolicy,
    KernelMode,
    Launch,
)

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def test_defaults_run_the_kernels_on_cuda_only():
    policy = ExecutionPolicy.from_env(environ={})
    assert policy == AUTO and policy.batch_invariant and not policy.pdl and not policy.invariant_rows
    assert policy.uses("decode_gemm", CUDA) and not policy.uses("decode_gemm", CPU)
    assert not REFERENCE.uses("decode_gemm", CUDA) and not REFERENCE.runs_kernels(CUDA)
    assert AUTO.runs_kernels(CUDA) and not AUTO.runs_kernels(CPU) and ALL_KERNELS.runs_kernels(CPU)


def test_one_kernel_can_be_set_aside_by_name():
    policy = ExecutionPolicy.from_env(environ={"OCRIA_DISABLE_KERNELS": "rms_norm, decode_attention"})
    assert policy.disabled == {"rms_norm", "decode_attention"}
    assert not policy.uses("rms_norm", CUDA) and not policy.uses("decode_attention", CUDA)
    assert policy.uses("replay_ssm", CUDA)
    on = ExecutionPolicy.from_env("on", environ={"OCRIA_DISABLE_KERNELS": "rms_norm"})
    assert on.kernels is KernelMode.ON and not on.uses("rms_norm", CPU) and on.uses("decode_gemm", CPU)
    with pytest.raises(OcriaError, match="OCRIA_DISABLE_KERNELS: unknown kernel 'rms_nrom'"):
        ExecutionPolicy.from_env(environ={"OCRIA_DISABLE_KERNELS": "rms_nrom"})
    with pytest.raises(OcriaError, match="unknown disabled kernel 'rms_nrom'"):
        ExecutionPolicy(disabled=frozenset({"rms_nrom"}))


def test_opt_in_kernels_run_only_when_enabled_by_name():
    assert not AUTO.uses("decode_gemm_norm", CUDA) and not AUTO.uses("gemm_prologue", CUDA)
    assert ALL_KERNELS.uses("decode_gemm_norm", CPU)  # on: opt-in ones too
    enabled = ExecutionPolicy.from_env(environ={"OCRIA_ENABLE_KERNELS": "decode_gemm_norm"})
    assert enabled.uses("decode_gemm_norm", CUDA) and not enabled.uses("gemm_prologue", CUDA)
    both = {"OCRIA_ENABLE_KERNELS": "decode_gemm_norm", "OCRIA_DISABLE_KERNELS": "decode_gemm_norm"}
    assert not ExecutionPolicy.from_env(environ=both).uses("decode_gemm_norm", CUDA)  # set aside wins
    with pytest.raises(OcriaError, match="OCRIA_ENABLE_KERNELS: unknown kernel 'rms_norm'"):
        ExecutionPolicy.from_env(environ={"OCRIA_ENABLE_KERNELS": "rms_norm"})  # only opt-in kernels are named


def test_bad_values_are_refused_by_name(monkeypatch):
    with pytest.raises(OcriaError, match="OCRIA_BATCH_INVARIANT='yes': use 1 or 0"):
        ExecutionPolicy.from_env(environ={"OCRIA_BATCH_INVARIANT": "yes"})
    with pytest.raises(OcriaError, match="OCRIA_PDL='2'"):
        ExecutionPolicy.from_env(environ={"OCRIA_PDL": "2"})
    with pytest.raises(OcriaError, match="plugins 'fast': use one of auto, on, off"):
        ExecutionPolicy.from_env("fast", environ={})
    with pytest.raises(ValueError, match="unknown kernel"):
        AUTO.uses("flash_attention", CUDA)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(OcriaError, match="needs CUDA, or CPU with TRITON_INTERPRET=1"):
        ALL_KERNELS.uses("decode_gemm", CPU)


def test_decode_steps_get_batch_invariant_launches():
    step = AUTO.for_steps()
    assert step.invariant_rows and Launch.INVARIANT in step.launch and Launch.INVARIANT not in AUTO.launch
    off = ExecutionPolicy.from_env(environ={"OCRIA_BATCH_INVARIANT": "0"})
    assert not off.batch_invariant and not off.for_steps().invariant_rows
    assert Launch.INVARIANT not in off.for_steps().launch


def test_launch_flags_carry_pdl_and_the_code_paths():
    assert AUTO.launch == Launch.NVFP4_PTX | Launch.NVFP4_GEMV | Launch.REPLAY_SSM_WS
    assert Launch.PDL in ExecutionPolicy.from_env(environ={"OCRIA_PDL": "1"}).launch
    flags = replace(AUTO, disabled=frozenset({"nvfp4_ptx", "replay_ssm_ws"})).launch
    assert flags == Launch.NVFP4_GEMV and Launch(int(flags)) == flags  # operators take it as one int
    # PTX dequantization is a default path: disabling it by name (the way back to integer unpacking) parses, and it
    # cannot be named as opt-in
    assert Launch.NVFP4_PTX not in ExecutionPolicy.from_env(environ={"OCRIA_DISABLE_KERNELS": "nvfp4_ptx"}).launch
    with pytest.raises(OcriaError, match="unknown kernel 'nvfp4_ptx'"):
        ExecutionPolicy.from_env(environ={"OCRIA_ENABLE_KERNELS": "nvfp4_ptx"})


def test_describe_names_every_op_and_is_json():
    policy = ExecutionPolicy.from_env(environ={"OCRIA_DISABLE_KERNELS": "kv_write", "OCRIA_PDL": "1"})
    described = json.loads(json.dumps(policy.describe(CUDA)))
    assert described["kernels"] == "auto" and described["disabled"] == ["kv_write"] and described["pdl"] is True
    assert described["kernel"]["kv_write"] == "reference" and described["kernel"]["decode_gemm"] == "triton"
    assert described["kernel"]["gemm_prologue"] == "reference"  # opt-in
    assert set(described["kernel"]) == set(KERNEL_NAMES) - {"nvfp4_ptx", "nvfp4_gemv", "replay_ssm_ws"}
    assert set(REFERENCE.describe(CUDA)["kernel"].values()) == {"reference"}
