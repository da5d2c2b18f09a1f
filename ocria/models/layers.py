"""Small building blocks shared by the target and the drafter: norms, SwiGLU MLP, rotary embeddings."""

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ocria.plugins.decode_gemm import decode_gemm, decode_gemm_norm
from ocria.plugins.gemm_prologue import Prologue, prologue_gemm
from ocria.plugins.policy import ExecutionPolicy
from ocria.plugins.rms_norm import (
    add_plain_rms_norm,
    add_rms_norm,
    add_rms_norm_fp8,
    gated_rms_norm,
    gated_rms_norm_fp8,
    plain_rms_norm,
    rms_norm,
    rms_norm_rope,
)
from ocria.plugins.rms_norm.reference import apply_rotary  # noqa: F401  (the models' rotary, used by vision and training)
from ocria.plugins.silu_quant import quantize_act, silu_mul_quant


class ZeroCenteredRMSNorm(nn.Module):
    """Qwen3.5's RMSNorm: ``norm(x) * (1 + w)`` computed in fp32, weight initialised to zero."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor, policy: ExecutionPolicy) -> Tensor:
        return rms_norm(x, self.weight, self.eps, 1.0, policy=policy)

    def add(self, x: Tensor, residual: Tensor | None, policy: ExecutionPolicy) -> tuple[Tensor, Tensor]:
        """``(x + residual, norm(x + residual))``, one launch with the kernel (residual None: ``(x, norm(x))``)."""
        if residual is None:
            return x, self(x, policy)
        return add_rms_norm(x, residual, self.weight, self.eps, 1.0, policy=policy)

    def add_fp8(self, x: Tensor, residual: Tensor | None, mode: str, scale: Tensor | None,
                policy: ExecutionPolicy) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """``add`` and the FP8 quantization of the norm (``mode``: fp8_static with ``scale``, or fp8_dynamic) for
        the FP8 layers that read it: (sum, norm, E4M3 norm, per-token scales or None), one launch with the kernel."""
        if residual is None:  # no add to fuse: the norm, then its FP8 bytes in one more launch
            return (x, y := self(x, policy), *quantize_act(y, mode, scale, policy=policy))
        return add_rms_norm_fp8(x, residual, self.weight, self.eps, 1.0, mode, scale, policy=policy)

    def rope(self, x: Tensor, cos: Tensor, sin: Tensor, policy: ExecutionPolicy) -> Tensor:
        """An attention's q/k norm then its rotary embedding, x [B, T, H, D], cos/sin [B, T, R]: one launch
        with the kernel, ``apply_rotary(norm(x), ...)`` bit for bit otherwise."""
        return rms_norm_rope(x, self.weight, cos, sin, self.eps, 1.0, policy=policy)


class RMSNorm(nn.Module):
    """Plain (Qwen3-style) RMSNorm ``w * norm(x)``, used by the DFlash drafter: through the plugin (one
    launch, the same rounding chain), with the residual add or the rotary embedding that follows it fused."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, policy: ExecutionPolicy) -> Tensor:
        return plain_rms_norm(x, self.weight, self.eps, policy=policy)

    def add(self, x: Tensor, residual: Tensor | None, policy: ExecutionPolicy) -> tuple[Tensor, Tensor]:
        """``(x + residual, norm(x + residual))``, one launch with the kernel (residual None: ``(x, norm(x))``)."""
        if residual is None:
            return x, self(x, policy)
        return add_plain_rms_norm(x, residual, self.weight, self.eps, policy=policy)

    def rope(self, x: Tensor, cos: Tensor, sin: Tensor, policy: ExecutionPolicy) -> Tensor:
        """``apply_rotary(norm(x), cos[:, :, None], sin[:, :, None])`` for x [B, T, H, D], cos, sin [B, T, D]."""
        return rms_norm_rope(x, self.weight, cos, sin, self.eps, plain=True, policy=policy)


class GatedRMSNorm(nn.Module):
    """GDN output norm: ``w * norm(x) * silu(z)`` per value head (plain weight, not zero-centred)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, z: Tensor, policy: ExecutionPolicy) -> Tensor:
        return gated_rms_norm(x, z, self.weight, self.eps, policy=policy)

    def fp8(self, x: Tensor, z: Tensor, mode: str, scale: Tensor | None,
            policy: ExecutionPolicy) -> tuple[Tensor, Tensor | None]:
        """The norm of x [..., H, D] as the FP8 input of the layer after it: (E4M3 [..., H * D], per-token scales or
        None), one launch with the kernel."""
        return gated_rms_norm_fp8(x, z, self.weight, self.eps, mode, scale, policy=policy)


GATE_UP = ("gate_proj", "up_proj")  # the MLP's input projections, fused into one GEMM for inference


def fuse_linears(module: nn.Module, names: tuple[str, ...]) -> None:
    """Let ``project`` run the named bias-free linears of ``module`` (same input) as one GEMM.

    The weights are concatenated once and the original parameters become views into the fused
    tensor, so memory is not duplicated and checkpoints keep their HF names. Every trailing run of the
    names (``k_proj, v_proj`` of ``q_proj, k_proj, v_proj``) is a fused group too, a view of the tail.
    When quantized executors are among them, each run of neighbours that can share one GEMM (equal
    ``fusion_key``: bf16 linears, or quantized ones of one format and activation scale) becomes one
    (``_fuse_runs``).
    """
    if names in module.__dict__.get("_fused", {}) or names in module.__dict__.get("_runs", {}):
        return  # fused already
    linears = [getattr(module, n) for n in names]
    if not all(type(lin) is nn.Linear and lin.bias is None for lin in linears):
        _fuse_runs(module, names, linears)
        return
    fused = _stack(linears)
    offset, groups = 0, module.__dict__.setdefault("_fused", {})
    sizes = [lin.out_features for lin in linears]
    for i, lin in enumerate(linears):
        groups[names[i:]] = (fused[offset:], sizes[i:])
        offset += lin.out_features


def _stack(linears: list[nn.Linear]) -> Tensor:
    """The linears' weights concatenated along the output dim; each linear's weight becomes a view into it."""
    fused, offset = torch.cat([lin.weight.detach() for lin in linears]), 0
    for lin in linears:
        lin.weight = nn.Parameter(fused[offset:offset + lin.out_features], requires_grad=False)
        offset += lin.out_features
    return fused


def _fusion_key(linear: nn.Module) -> tuple | None:
    if type(linear) is nn.Linear:
        return ("bf16",) if linear.bias is None else None
    return getattr(linear, "fusion_key", None)


def _fuse_runs(module: nn.Module, names: tuple[str, ...], linears: list[nn.Module]) -> None:
    """Group consecutive linears with one ``fusion_key`` into one executor each: a stacked bf16 weight, or the
    quantized class's ``fuse`` (the originals become row views of it). ``project`` then runs one GEMM per run."""
    runs, start = [], 0
    keys = [_fusion_key(lin) for lin in linears]
    for i in range(1, len(names) + 1):
        if i == len(names) or keys[i] is None or keys[i] != keys[start]:
            runs.append(range(start, i))
            start = i
    if all(len(run) == 1 for run in runs):
        return
    groups = []
    for run in runs:
        members = [linears[i] for i in run]
        sizes = [lin.out_features for lin in members]
        if len(run) == 1:
            groups.append((members[0], sizes))
        elif keys[run.start] == ("bf16",):
            groups.append((_stack(members), sizes))
        else:
            fused, views = type(members[0]).fuse(members, name="+".join(names[i] for i in run))
            for i, view in zip(run, views, strict=True):
                setattr(module, names[i], view)
            groups.append((fused, sizes))
    module.__dict__.setdefault("_runs", {})[names] = groups


def fused_group(module: nn.Module, names: tuple[str, ...]) -> tuple[Tensor, list[int]] | None:
    """(stacked weight, output sizes) of the named linears when ``fuse_linears`` prepared them."""
    return module.__dict__.get("_fused", {}).get(names)


def project(module: nn.Module, x: Tensor, names: tuple[str, ...], policy: ExecutionPolicy,
            fp8_input: tuple[nn.Module, Tensor, Tensor | None] | None = None) -> tuple[Tensor, ...]:
    """Apply the named linears of ``module`` to x (one GEMM when ``fuse_linears`` prepared them). ``fp8_input``
    (executor, E4M3 x, per-token scales) hands that run's executor x already quantized (``fp8_consumer``)."""
    fused = fused_group(module, names)
    runs = module.__dict__.get("_runs", {}).get(names)
    if runs is not None:
        outs = []
        for executor, sizes in runs:
            if fp8_input is not None and executor is fp8_input[0]:
                y = executor.forward_fp8(fp8_input[1], fp8_input[2], x.dtype, policy)
            elif isinstance(executor, Tensor):
                y = decode_gemm(x, executor, policy=policy)
            else:
                y = dense(executor, x, policy)
            outs.extend(y.split(sizes, dim=-1))
        return tuple(outs)
    if fused is None:
        return tuple(dense(getattr(module, n), x, policy) for n in names)
    weight, sizes = fused
    return decode_gemm(x, weight, policy=policy).split(sizes, dim=-1)


def norm_gemm(norm: "ZeroCenteredRMSNorm", x: Tensor, residual: Tensor | None, module: nn.Module,
              names: tuple[str, ...], policy: ExecutionPolicy) -> tuple[Tensor, Tensor] | None:
    """``(s, norm(s) @ W.T)`` with ``s = x + residual`` and W the named linears of ``module`` fused, in one
    launch (``ocria::decode_gemm_norm``: a decode or verify step); None when that kernel does not apply."""
    fused = fused_group(module, names)
    if fused is None:
        return None
    out = decode_gemm_norm(x, residual, norm.weight, norm.eps, fused[0], policy=policy)
    return None if out is None else (out[1], out[0])


def norm_project(norm: "ZeroCenteredRMSNorm", x: Tensor, residual: Tensor | None, module: nn.Module,
                 names: tuple[str, ...], policy: ExecutionPolicy) -> tuple[Tensor, tuple[Tensor, ...]]:
    """``(s, projections of norm(s))`` with ``s = x + residual``: the norm folded into the GEMM when
    ``norm_gemm`` applies, else ``norm.add`` then ``project``; when a run of the projections quantizes its input to
    FP8 (``fp8_consumer``), ``norm.add_fp8`` writes that input in the norm's launch."""
    fused = norm_gemm(norm, x, residual, module, names, policy)
    if fused is None:
        consumer = fp8_consumer(module.__dict__.get("_runs", {}).get(names, []))
        if consumer is not None:  # the norm's launch also writes the FP8 input of that run
            s, h, q, token_scales = norm.add_fp8(x, residual, *consumer.input_quant, policy)
            return s, project(module, h, names, policy, (consumer, q, token_scales))
        s, h = norm.add(x, residual, policy)
        return s, project(module, h, names, policy)
    s, y = fused
    return s, y.split(fused_group(module, names)[1], dim=-1)


def fp8_consumer(runs: list) -> nn.Module | None:
    """The first executor of ``_fuse_runs``' runs that quantizes its input to FP8 (``input_quant``), if any."""
    return next((ex for ex, _ in runs if getattr(ex, "input_quant", None) is not None), None)


def norm_mlp(norm: "ZeroCenteredRMSNorm", x: Tensor, residual: Tensor | None, mlp: nn.Module,
             policy: ExecutionPolicy) -> tuple[Tensor, Tensor]:
    """``(s, mlp(norm(s)))`` with ``s = x + residual``: the norm folded into a ``SwiGLU``'s fused gate/up GEMM
    when ``norm_gemm`` applies, else ``norm.add`` then the MLP (any MLP module, quantized ones too)."""
    fused = norm_gemm(norm, x, residual, mlp, GATE_UP, policy)
    if fused is None:
        s, h = norm.add(x, residual, policy)
        return s, mlp(h, policy)
    s, gate_up = fused
    return s, mlp.silu_down(gate_up, policy)


def prologue_dense(linear: nn.Module, kind: Prologue, a: Tensor, b: Tensor, policy: ExecutionPolicy,
                   norm: "GatedRMSNorm | None" = None) -> Tensor | None:
    """``linear(op(a, b))`` for a, b [B, T, H, D] in one launch (``ocria::prologue_gemm``: the op ``kind`` in the
    GEMM's K loop) when ``linear`` is a bias-free bf16 ``nn.Linear`` or an FP8 layer (``input_quant``: the op's output
    quantized in the same place) and the kernel takes the call; None otherwise, and the caller runs the op, then the
    layer. ``norm``: the gated RMSNorm of ``Prologue.GATED_NORM``."""
    if getattr(linear, "bias", None) is not None:
        return None
    if type(linear) is nn.Linear:
        x_mode, x_scale, w_scale = "bf16", None, None
    elif getattr(linear, "input_quant", None) is not None:
        (x_mode, x_scale), w_scale = linear.input_quant, linear.weight_scale
    else:
        return None
    norm_weight, eps = (norm.weight, norm.eps) if norm is not None else (None, 0.0)
    return prologue_gemm(kind, a, b, linear.weight, norm_weight, eps, x_mode, x_scale, w_scale, policy)


def gate_up_halves(gate_up: Tensor) -> tuple[Tensor, Tensor]:
    """A fused gate/up output [..., 2I] as the SiLU-multiply prologue's inputs: gate and up [..., 1, I] (views)."""
    return tuple(t.unsqueeze(-2) for t in gate_up.chunk(2, dim=-1))


class PolicyLinear(nn.Module):
    """A linear executor whose ``forward(x, policy, out_fp32=False)`` takes the execution policy (the quantized
    layers of ``ocria.models.quantized``)."""


def dense(linear: nn.Module, x: Tensor, policy: ExecutionPolicy) -> Tensor:
    """``linear(x)``; a plain bf16 ``nn.Linear`` of a decode or verify step (<= 16 rows) runs as the
    one-launch decode GEMM (``ocria::decode_gemm``), ``PolicyLinear`` executors under ``policy``, any other module
    in a linear's place (ModelOpt's calibration wrappers) as itself."""
    if type(linear) is nn.Linear:
        return decode_gemm(x, linear.weight, linear.bias, policy=policy)
    if isinstance(linear, PolicyLinear):
        return linear(x, policy)
    return linear(x)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with HF parameter names."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor, policy: ExecutionPolicy) -> Tensor:
        fused = fused_group(self, GATE_UP)
        if fused is None:
            gate, up = project(self, x, GATE_UP, policy)
            return dense(self.down_proj, F.silu(gate) * up, policy)
        return self.silu_down(decode_gemm(x, fused[0], policy=policy), policy)

    def silu_down(self, gate_up: Tensor, policy: ExecutionPolicy) -> Tensor:
        """Inference, after the one gate/up GEMM: SiLU-multiply (the two roundings of ``F.silu(gate) * up``) in
        down_proj's K loop (``prologue_dense``), else in one pass of its own, then down_proj."""
        y = prologue_dense(self.down_proj, Prologue.SILU_MUL, *gate_up_halves(gate_up), policy)
        if y is not None:
            return y
        h, _ = silu_mul_quant(gate_up, "bf16", policy=policy)
        return dense(self.down_proj, h, policy)


@lru_cache(maxsize=64)
def inverse_frequencies(dim: int, theta: float, device: str = "cpu") -> Tensor:
    """RoPE inverse frequencies, cached per device so a captured CUDA graph never copies from the host."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))


def mrope_cos_sin(positions: Tensor, inv_freq: Tensor, mrope_section: list[int], dtype: torch.dtype):
    """Interleaved multimodal RoPE. positions [3, ...] (temporal, height, width) -> cos, sin [..., rot_dim].

    Frequency i takes the temporal position, except i = 1 mod 3 (height) and i = 2 mod 3 (width)
    inside the first ``3 * mrope_section[1|2]`` frequencies, as in Qwen3.5.
    """
    freqs = positions[..., None].float() * inv_freq
    mixed = freqs[0].clone()
    for axis in (1, 2):
        idx = slice(axis, mrope_section[axis] * 3, 3)
        mixed[..., idx] = freqs[axis][..., idx]
    emb = torch.cat((mixed, mixed), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope_cos_sin(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype):
    """Plain 1D RoPE over the full head dim. positions [...] -> cos, sin [..., head_dim]."""
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)
