"""The prologue GEMM (``ocria::prologue_gemm``, Triton interpreter on CPU): the SiLU-multiply, sigmoid gate and gated
RMSNorm computed in a decode GEMM's K loop, with the FP8 quantization of their output. Each gives the bits of its
exact math (the op as the model rounds it, fp32 products, one rounding), which are the bits of the unfused plugin
chain (the op's own kernel, then the decode GEMM); rows stay batch invariant; views are read in place; the models'
decode steps take it."""

import os
import subprocess
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere in this process

import pytest
import torch
from tiny_models import hf_vlm, save_hf, vlm_config

import ocria.models.layers as layers
from ocria.errors import OcriaError
from ocria.models import OCRiaForConditionalGeneration, TargetCache
from ocria.plugins import numerics as nx
from ocria.plugins.decode_gemm.kernel import decode_gemm_fp8_triton, decode_gemm_triton
from ocria.plugins.gemm_prologue import Prologue, prologue_gemm, prologue_gemm_reference
from ocria.plugins.gemm_prologue.kernel import prologue_gemm_triton
from ocria.plugins.policy import ALL_KERNELS, ExecutionPolicy
from ocria.plugins.rms_norm.kernel import rms_norm_fp8_triton, rms_norm_triton
from ocria.plugins.sigmoid_gate.kernel import sigmoid_gate_triton
from ocria.plugins.silu_quant.kernel import quantize_act_triton, silu_mul_quant_triton
from ocria.quant.direct import quantize_in_place
from ocria.quant.recipe import load_recipe

MODES = ("bf16", "fp8_static", "fp8_dynamic")
CONFIGS = {"default": None,
           "split_k2_swap": {"block_n": 16, "block_k": 32, "num_warps": 4, "num_stages": 2, "swap": True,
                             "split_k": 2}}


def _inputs(kind: Prologue, B=2, T=3, H=4, D=32, N=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(B, T, H, D, generator=g) * 2).to(torch.bfloat16)
    b = (torch.randn(B, T, H, D, generator=g) * 2).to(torch.bfloat16)
    if kind == Prologue.SILU_MUL:  # gate and up: the halves of one fused gate/up output
        gate_up = torch.cat([a.flatten(-2), b.flatten(-2)], -1)
        a, b = (t.unsqueeze(-2) for t in gate_up.chunk(2, -1))
    norm_w = (1 + 0.1 * torch.randn(D, generator=g)).to(torch.bfloat16)
    w = (torch.randn(N, H * D, generator=g) * 0.05).to(torch.bfloat16)
    return a, b, norm_w, w


def _weight(w: torch.Tensor, mode: str, per_col: bool = False):
    if mode == "bf16":
        return w, None, None
    ws = w.float().abs().amax(1) / 448 if per_col else w.float().abs().amax() / 448
    q = nx.e4m3_encode(w.float() / (ws[:, None] if per_col else ws)).view(torch.float8_e4m3fn)
    return q, ws, torch.tensor(0.03) if mode == "fp8_static" else None


def _unfused(kind, a, b, norm_w, w, mode, x_scale, w_scale):
    """The op's own kernel, then the decode GEMM: what a decode step ran before."""
    if kind == Prologue.SILU_MUL:
        h, s = silu_mul_quant_triton(torch.cat([a, b], -1).flatten(-2), mode, x_scale)
    elif kind == Prologue.SIGMOID_GATE:
        h = sigmoid_gate_triton(a, b)
        h, s = (h, None) if mode == "bf16" else quantize_act_triton(h, mode, x_scale)
    elif mode == "bf16":
        h, s = rms_norm_triton(a, norm_w, 1e-6, z=b).flatten(-2), None
    else:
        _, h, s = rms_norm_fp8_triton(a, norm_w, 1e-6, mode, x_scale, z=b)
    if mode == "bf16":
        return decode_gemm_triton(h, w)
    return decode_gemm_fp8_triton(h, w, s if s is not None else x_scale, w_scale)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(Prologue), ids=lambda k: k.name.lower())
def test_kernel_gives_the_bits_of_its_math_and_of_the_unfused_chain(kind, mode):
    a, b, norm_w, w = _inputs(kind)
    w, w_scale, x_scale = _weight(w, mode, per_col=kind == Prologue.GATED_NORM)
    got = prologue_gemm_triton(kind, a, b, w, norm_w, 1e-6, mode, x_scale, w_scale)
    assert got.dtype == torch.bfloat16 and got.shape == (2, 3, 48)
    assert torch.equal(got, prologue_gemm_reference(kind, a, b, w, norm_w, 1e-6, mode, x_scale, w_scale))
    assert torch.equal(got, _unfused(kind, a, b, norm_w, w, mode, x_scale, w_scale).reshape(got.shape))


@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("mode", ("bf16", "fp8_dynamic"))
def test_rows_are_batch_invariant_beyond_16_rows_and_split_k(cfg, mode):
    """A row alone, inside a 16-row verify block or among 40 rows (several row tiles) gets the same bits."""
    a, b, norm_w, w = _inputs(Prologue.SIGMOID_GATE, B=5, T=8, seed=1)
    w, w_scale, x_scale = _weight(w, mode)
    run = lambda x, y: prologue_gemm_triton(Prologue.SIGMOID_GATE, x, y, w, None, 0.0, mode, x_scale, w_scale,  # noqa: E731
                                            config=CONFIGS[cfg])
    full = run(a, b)
    want = prologue_gemm_reference(Prologue.SIGMOID_GATE, a, b, w, None, 0.0, mode, x_scale, w_scale)
    assert torch.equal(full, want)
    assert torch.equal(run(a[2:4], b[2:4]), full[2:4])
    assert torch.equal(run(a[3:4, 5:6], b[3:4, 5:6]), full[3:4, 5:6])


def test_views_are_read_in_place():
    """The attention's output [B, H, T, D] transposed and its gate, a strided half of q_proj's output."""
    g = torch.Generator().manual_seed(2)
    o = torch.randn(2, 4, 3, 32, generator=g).to(torch.bfloat16).transpose(1, 2)  # [B, T, H, D], not contiguous
    q = torch.randn(2, 3, 4, 64, generator=g).to(torch.bfloat16)
    gate = q.chunk(2, dim=-1)[1]
    w = (torch.randn(48, 128, generator=g) * 0.05).to(torch.bfloat16)
    got = prologue_gemm_triton(Prologue.SIGMOID_GATE, o, gate, w)
    assert torch.equal(got, prologue_gemm_reference(Prologue.SIGMOID_GATE, o.contiguous(), gate.contiguous(), w))


def test_op_takes_what_the_kernel_takes_and_returns_none_otherwise():
    a, b, norm_w, w = _inputs(Prologue.GATED_NORM)
    out = prologue_gemm(Prologue.GATED_NORM, a, b, w, norm_w, 1e-6, policy=ALL_KERNELS)
    assert torch.equal(out, prologue_gemm_triton(Prologue.GATED_NORM, a, b, w, norm_w, 1e-6))
    assert prologue_gemm(Prologue.GATED_NORM, a, b, w, norm_w, 1e-6) is None  # CPU default: the reference chain
    assert prologue_gemm(Prologue.GATED_NORM, a, b, w, norm_w.float(), 1e-6, policy=ALL_KERNELS) is None
    assert prologue_gemm(Prologue.GATED_NORM, a, b, w[:40], norm_w, 1e-6, policy=ALL_KERNELS) is None  # N % 16
    big_a, big_b = (t.repeat(3, 3, 1, 1) for t in (a, b))  # 54 rows: a verify block of several sequences only
    assert prologue_gemm(Prologue.GATED_NORM, big_a, big_b, w, norm_w, 1e-6, policy=ALL_KERNELS) is None
    step = ALL_KERNELS.for_steps()
    assert prologue_gemm(Prologue.GATED_NORM, big_a, big_b, w, norm_w, 1e-6, policy=step) is not None
    cuda = torch.device("cuda")
    auto = ExecutionPolicy.from_env(environ={})  # opt-in until a GPU timing shows it pays
    assert not auto.uses("gemm_prologue", cuda) and auto.uses("decode_gemm", cuda)
    assert ExecutionPolicy.from_env(environ={"OCRIA_ENABLE_KERNELS": "gemm_prologue"}).uses("gemm_prologue", cuda)
    disabled = {"OCRIA_ENABLE_KERNELS": "gemm_prologue", "OCRIA_DISABLE_KERNELS": "gemm_prologue"}
    assert not ExecutionPolicy.from_env(environ=disabled).uses("gemm_prologue", cuda)  # disabling wins
    with pytest.raises(OcriaError, match="power of two"):
        prologue_gemm_triton(Prologue.GATED_NORM, a[..., :24], b[..., :24], w[:, :96], norm_w[:24], 1e-6)
    fake = torch.ops.ocria.prologue_gemm.default(a.to("meta"), b.to("meta"), w.to("meta"), None, 0.0, 2, "bf16",
                                                 None, None, 0)
    assert fake.shape == (2, 3, 48) and fake.dtype == torch.bfloat16


@pytest.mark.parametrize("recipe", ["bf16", "fp8"])
def test_decode_steps_run_it_after_every_layer_with_the_unfused_bits(tmp_path, monkeypatch, recipe):
    """A bf16 tiny target (and its FP8 form, per-token activation scales) in one-token and three-token verify
    steps: o_proj, the GDN out_proj and every down_proj take the prologue GEMM, and the hidden states are the bits
    of the steps that run the ops apart."""
    target = OCRiaForConditionalGeneration.from_pretrained(save_hf(hf_vlm(vlm_config()), tmp_path), torch.bfloat16)
    if recipe != "bf16":
        quantize_in_place(target, load_recipe(recipe))
    target.text.fuse_projections()
    cfg, real, calls = target.text_config, layers.prologue_gemm, []

    def taken(*args, **kwargs):
        y = real(*args, **kwargs)
        calls.append(y is not None)
        return y

    def steps(prologue) -> list[torch.Tensor]:
        monkeypatch.setattr(layers, "prologue_gemm", prologue)
        cache, slots = TargetCache.allocate(cfg, 1, 16, 4, torch.bfloat16), torch.zeros(1, dtype=torch.long)
        g, out = torch.Generator().manual_seed(3), []
        with torch.no_grad():
            for T in (1, 3):
                embeds = torch.randn(1, T, cfg.hidden_size, generator=g).to(torch.bfloat16)
                pos = (cache.kv_len[slots].long()[:, None] + torch.arange(T)).expand(3, 1, T)
                out.append(target.forward_cached(embeds, pos, cache, slots, "verify", attn_len=8,
                                                 policy=ALL_KERNELS.for_steps())[0])
                cache.commit(slots, torch.tensor([T]))
        return out

    fused = steps(taken)
    assert calls == [True] * 2 * cfg.num_hidden_layers * 2  # two per layer (its mixer's output GEMM, down_proj)
    apart = steps(lambda *args, **kwargs: None)
    assert all(torch.equal(f, a) for f, a in zip(fused, apart, strict=True))


# The kernel compiled for sm_90a at ocria-1-sim's shapes (GDN out_proj, attention o_proj, MLP down), in each op's
# widest variants (four row tiles, per-token FP8): registers and spills, one line per build.
_COMPILE_FOR_HOPPER = """
from bench.ops.ptxas import compile_sm90
from ocria.plugins.gemm_prologue.kernel import _prologue_gemm_kernel, prologue_config
for pro, k, d in ((3, 4096, 128), (2, 2048, 256), (1, 6144, 6144)):
    cfg = prologue_config(2048, k)
    for xq, rt in ((0, 4), (1, 4), (2, 1)):
        types = {n: "i32" for n in _prologue_gemm_kernel.arg_names}
        types.update(a_ptr="*i16", b_ptr="*i16", nw_ptr="*i16", w_ptr="*fp8e4nv" if xq else "*bf16", o_ptr="*bf16",
                     ws_ptr="*fp32", count_ptr="*i32", sx_ptr="*fp32", sw_ptr="*fp32", eps="fp32")
        consts = dict(PRO=pro, XQ=xq, D=d, SW_COLS=False, ON_GPU=True, SWAP=cfg["swap"], SPLIT_K=cfg["split_k"],
                      ROW_TILES=rt, BLOCK_M=16, BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], PDL=True)
        r = compile_sm90(_prologue_gemm_kernel, types, consts, cfg["num_warps"], 3,
                         divisible_by_16=("a_ptr", "b_ptr", "w_ptr", "o_ptr", "N", "K", "K_SPLIT", "stride_wn"))
        print(pro, xq, rt, r["registers"], r["spill_store_bytes"])
"""


def test_kernel_compiles_for_hopper_without_spills():
    """The interpreter runs the kernel as Python: it cannot see what only Triton's code generator rejects (a helper's
    returns of different types; the norm's reshape compiled for another op's head size), nor spills."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _COMPILE_FOR_HOPPER], cwd=Path(__file__).parents[1], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    builds = [tuple(map(int, line.split())) for line in run.stdout.splitlines()]
    assert len(builds) == 9 and all(spills == 0 and regs <= 255 for *_, regs, spills in builds), builds
