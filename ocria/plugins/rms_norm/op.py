"""``torch.library`` operators ``ocria::rms_norm``, ``ocria::add_rms_norm``, ``ocria::plain_rms_norm``,
``ocria::add_plain_rms_norm``, ``ocria::rms_norm_rope``, ``ocria::gated_rms_norm``, the FP8-output forms
``ocria::add_rms_norm_fp8`` and ``ocria::gated_rms_norm_fp8``, and the functions the model's norm layers call.
The execution policy picks the Triton kernel or the reference (``policy.uses``).
The kernel has no backward: under autograd (training) the reference runs."""

import torch
import triton
from torch import Tensor

from ocria.plugins import numerics as nx
from ocria.plugins.policy import AUTO, ExecutionPolicy, Launch
from ocria.plugins.rms_norm.kernel import MAX_WIDTH, rms_norm_fp8_triton, rms_norm_triton
from ocria.plugins.rms_norm.reference import (
    add_plain_rms_norm_reference,
    add_rms_norm_reference,
    gated_rms_norm_reference,
    plain_rms_norm_reference,
    rms_norm_reference,
    rms_norm_rope_reference,
)


@torch.library.custom_op("ocria::rms_norm", mutates_args=())
def _rms_norm_op(x: Tensor, weight: Tensor, eps: float, offset: float, launch: int) -> Tensor:
    return rms_norm_triton(x, weight, eps, offset, launch=Launch(launch))


@torch.library.custom_op("ocria::add_rms_norm", mutates_args=())
def _add_rms_norm_op(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float,
                     launch: int) -> tuple[Tensor, Tensor]:
    out_sum = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return out_sum, rms_norm_triton(x, weight, eps, offset, residual=residual, out_sum=out_sum, launch=Launch(launch))


@torch.library.custom_op("ocria::plain_rms_norm", mutates_args=())
def _plain_rms_norm_op(x: Tensor, weight: Tensor, eps: float, launch: int) -> Tensor:
    return rms_norm_triton(x, weight, eps, plain=True, launch=Launch(launch))


@torch.library.custom_op("ocria::add_plain_rms_norm", mutates_args=())
def _add_plain_rms_norm_op(x: Tensor, residual: Tensor, weight: Tensor, eps: float,
                           launch: int) -> tuple[Tensor, Tensor]:
    out_sum = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return out_sum, rms_norm_triton(x, weight, eps, residual=residual, out_sum=out_sum, plain=True,
                                    launch=Launch(launch))


@torch.library.custom_op("ocria::rms_norm_rope", mutates_args=())
def _rms_norm_rope_op(x: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, eps: float, offset: float,
                      plain: bool, launch: int) -> Tensor:
    return rms_norm_triton(x, weight, eps, offset, plain=plain, cos=cos, sin=sin, launch=Launch(launch))


@torch.library.custom_op("ocria::gated_rms_norm", mutates_args=())
def _gated_rms_norm_op(x: Tensor, z: Tensor, weight: Tensor, eps: float, launch: int) -> Tensor:
    return rms_norm_triton(x, weight, eps, z=z, launch=Launch(launch))


@torch.library.custom_op("ocria::add_rms_norm_fp8", mutates_args=())
def _add_rms_norm_fp8_op(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float, mode: str,
                         scale: Tensor | None, launch: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    out_sum = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y, q, tokens = rms_norm_fp8_triton(x, weight, eps, mode, scale, offset, residual=residual, out_sum=out_sum,
                                       launch=Launch(launch))
    return out_sum, y, q, _or_empty(tokens, x)


@torch.library.custom_op("ocria::gated_rms_norm_fp8", mutates_args=())
def _gated_rms_norm_fp8_op(x: Tensor, z: Tensor, weight: Tensor, eps: float, mode: str,
                           scale: Tensor | None, launch: int) -> tuple[Tensor, Tensor]:
    _, q, tokens = rms_norm_fp8_triton(x, weight, eps, mode, scale, z=z, launch=Launch(launch))
    return q, _or_empty(tokens, x)


def _or_empty(tokens: Tensor | None, like: Tensor) -> Tensor:
    return tokens if tokens is not None else torch.empty(0, dtype=torch.float32, device=like.device)


def _fp8_fake(x: Tensor, gated: bool, mode: str) -> tuple[Tensor, Tensor]:
    lead = x.shape[:-2] if gated else x.shape[:-1]
    q = x.new_empty(*lead, (x.shape[-2] if gated else 1) * x.shape[-1], dtype=torch.float8_e4m3fn)
    tokens = x.new_empty(*lead, 1, dtype=torch.float32) if mode == "fp8_dynamic" else \
        x.new_empty(0, dtype=torch.float32)
    return q, tokens


@_add_rms_norm_fp8_op.register_fake
def _(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float, mode: str,
      scale: Tensor | None, launch: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    q, tokens = _fp8_fake(x, False, mode)
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format), q, tokens)


@_gated_rms_norm_fp8_op.register_fake
def _(x: Tensor, z: Tensor, weight: Tensor, eps: float, mode: str, scale: Tensor | None,
      launch: int) -> tuple[Tensor, Tensor]:
    return _fp8_fake(x, True, mode)


@_rms_norm_op.register_fake
def _(x: Tensor, weight: Tensor, eps: float, offset: float, launch: int) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@_add_rms_norm_op.register_fake
def _(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float, launch: int) -> tuple[Tensor, Tensor]:
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format))


@_plain_rms_norm_op.register_fake
def _(x: Tensor, weight: Tensor, eps: float, launch: int) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@_add_plain_rms_norm_op.register_fake
def _(x: Tensor, residual: Tensor, weight: Tensor, eps: float, launch: int) -> tuple[Tensor, Tensor]:
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format))


@_rms_norm_rope_op.register_fake
def _(x: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, eps: float, offset: float, plain: bool,
      launch: int) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@_gated_rms_norm_op.register_fake
def _(x: Tensor, z: Tensor, weight: Tensor, eps: float, launch: int) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _runs_kernel(x: Tensor, params: tuple[Tensor, ...], policy: ExecutionPolicy) -> bool:
    """Whether the norm kernel runs: the policy uses it and no input needs a gradient (the kernel has no backward)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, *params)):
        return False
    return policy.uses("rms_norm", x.device)


def rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0, policy: ExecutionPolicy = AUTO) -> Tensor:
    """``rms_norm(x) * (offset + weight)`` in fp32, in x's dtype; see ``reference.rms_norm_reference``.

    Args:
        x: [..., D].
        weight: [D].
        eps: the norm's epsilon.
        offset: 1 for Qwen3.5's zero-centred norm, 0 for a plain weight.
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        [..., D] in x's dtype.
    """
    if _runs_kernel(x, (weight,), policy):
        return torch.ops.ocria.rms_norm(x, weight, eps, offset, int(policy.launch))
    return rms_norm_reference(x, weight, eps, offset)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float = 0.0,
                 policy: ExecutionPolicy = AUTO) -> tuple[Tensor, Tensor]:
    """``(x + residual, rms_norm(x + residual))`` in one launch: the decoder's residual add fused into the
    next norm; see ``reference.add_rms_norm_reference``.

    Args:
        x: [..., D].
        weight: [D].
        eps: the norm's epsilon.
        residual: [..., D]; the kernel needs x's dtype (mixed dtypes run the reference).
        offset: as in ``rms_norm``.
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        (s, norm(s)) with ``s = x + residual``, each [..., D].
    """
    if x.dtype == residual.dtype and _runs_kernel(x, (residual, weight), policy):  # mixed: autocast's promotion
        return torch.ops.ocria.add_rms_norm(x, residual, weight, eps, offset, int(policy.launch))
    return add_rms_norm_reference(x, residual, weight, eps, offset)


def plain_rms_norm(x: Tensor, weight: Tensor, eps: float, policy: ExecutionPolicy = AUTO) -> Tensor:
    """Qwen3's plain norm ``w * norm(x).to(x dtype)`` (the DFlash drafter's); see
    ``reference.plain_rms_norm_reference``. A product of another dtype than x's (fp32 w on bf16 x): the reference.

    Args:
        x: [..., D].
        weight: [D].
        eps: the norm's epsilon.
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        [..., D] in the promoted dtype of x and weight.
    """
    if torch.promote_types(weight.dtype, x.dtype) == x.dtype and _runs_kernel(x, (weight,), policy):
        return torch.ops.ocria.plain_rms_norm(x, weight, eps, int(policy.launch))
    return plain_rms_norm_reference(x, weight, eps)


def add_plain_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float,
                       policy: ExecutionPolicy = AUTO) -> tuple[Tensor, Tensor]:
    """``(x + residual, plain_rms_norm(x + residual))`` in one launch (the drafter's residual add fused into its
    next norm); see ``reference.add_plain_rms_norm_reference``.

    Args:
        x: [..., D].
        weight: [D].
        eps: the norm's epsilon.
        residual: [..., D].
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        (s, plain_rms_norm(s)) with ``s = x + residual``, each [..., D].
    """
    if (x.dtype == residual.dtype and torch.promote_types(weight.dtype, x.dtype) == x.dtype
            and _runs_kernel(x, (residual, weight), policy)):
        return torch.ops.ocria.add_plain_rms_norm(x, residual, weight, eps, int(policy.launch))
    return add_plain_rms_norm_reference(x, residual, weight, eps)


def rms_norm_rope(x: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, eps: float, offset: float = 0.0,
                  plain: bool = False, policy: ExecutionPolicy = AUTO) -> Tensor:
    """An attention's q/k norm and its rotary embedding in one launch (eagerly ~10 kernels): x [..., H, D],
    cos, sin [..., R]; the norm is the plain chain (``plain``) or ``norm(x) * (offset + w)``. See
    ``reference.rms_norm_rope_reference``. Mixed dtypes (cos/sin or the plain product not in x's): the reference.

    Args:
        x: [..., H, D] queries or keys.
        weight: [D].
        cos, sin: [..., R] (R <= D: the first R channels rotate, the rest pass through), shared by the H heads.
        eps: the norm's epsilon.
        offset: as in ``rms_norm`` (ignored with ``plain``).
        plain: Qwen3's plain norm chain (the drafter's).
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        [..., H, D] in the norm's output dtype (x's wherever the kernel runs).
    """
    same = cos.dtype == x.dtype and sin.dtype == x.dtype
    if (same and (not plain or torch.promote_types(weight.dtype, x.dtype) == x.dtype)
            and _runs_kernel(x, (weight, cos, sin), policy)):
        return torch.ops.ocria.rms_norm_rope(x, weight, cos, sin, eps, offset, plain, int(policy.launch))
    return rms_norm_rope_reference(x, weight, cos, sin, eps, offset, plain)


def gated_rms_norm(x: Tensor, z: Tensor, weight: Tensor, eps: float, policy: ExecutionPolicy = AUTO) -> Tensor:
    """GDN output norm ``weight * norm(x) * silu(z)``; see ``reference.gated_rms_norm_reference``.

    Args:
        x: [..., H, D] the recurrence's output per value head.
        z: [..., H, D] the gate.
        weight: [D].
        eps: the norm's epsilon.
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        [..., H, D] in x's dtype.
    """
    if _runs_kernel(x, (z, weight), policy):
        return torch.ops.ocria.gated_rms_norm(x, z, weight, eps, int(policy.launch))
    return gated_rms_norm_reference(x, z, weight, eps)


def fp8_reference(y: Tensor, mode: str, scale: Tensor | None,
                  gated: bool = False) -> tuple[Tensor, Tensor | None]:
    """ModelOpt's FP8 quantization of a norm's output as the next linear layer's input: per tensor (``fp8_static``,
    with ``scale``) or per token (``fp8_dynamic``); the gated norm's y [..., H, D] is flattened to [..., H * D].

    Returns:
        (q float8_e4m3fn [..., K], per-token fp32 scales [..., 1] for ``fp8_dynamic`` else None).
    """
    rows = y.reshape(*y.shape[:-2], -1) if gated else y
    if mode == "fp8_static":
        return nx.quantize_fp8(rows, scale), None
    if mode == "fp8_dynamic":
        return nx.quantize_fp8_per_token(rows)
    raise ValueError(f"unknown FP8 input mode {mode!r}; expected fp8_static or fp8_dynamic")


def add_rms_norm_fp8(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float, mode: str,
                     scale: Tensor | None = None,
                     policy: ExecutionPolicy = AUTO) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """``(s, y, q, token_scales)``: ``add_rms_norm``'s (s, y) and ``fp8_reference(y, mode, scale)`` from one launch
    (the decoder's input norm feeding FP8 projections: no separate activation quantization).

    Args:
        x, residual: [..., D].
        weight: [D].
        eps, offset: as in ``rms_norm``.
        mode: ``fp8_static`` (with ``scale``) or ``fp8_dynamic``.
        scale: fp32 per-tensor scale of ``fp8_static``.
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        (s [..., D], y [..., D], q float8_e4m3fn [..., D], per-token scales fp32 [..., 1] or None).
    """
    if x.dtype == residual.dtype and _runs_kernel(x, (residual, weight), policy):
        s, y, q, tokens = torch.ops.ocria.add_rms_norm_fp8(x, residual, weight, eps, offset, mode, scale,
                                                           int(policy.launch))
        return s, y, q, tokens if mode == "fp8_dynamic" else None
    s, y = add_rms_norm_reference(x, residual, weight, eps, offset)
    return (s, y, *fp8_reference(y, mode, scale))


def gated_rms_norm_fp8(x: Tensor, z: Tensor, weight: Tensor, eps: float, mode: str, scale: Tensor | None = None,
                       policy: ExecutionPolicy = AUTO) -> tuple[Tensor, Tensor | None]:
    """``fp8_reference(gated_rms_norm(x, z), mode, scale, gated=True)`` for x [..., H, D] from one launch (the GDN
    output norm feeding an FP8 ``out_proj``). The kernel takes a power-of-two H whose rows fit one tile; others
    run the reference.

    Args:
        x, z: [..., H, D].
        weight: [D].
        eps: the norm's epsilon.
        mode: ``fp8_static`` (with ``scale``) or ``fp8_dynamic``.
        scale: fp32 per-tensor scale of ``fp8_static``.
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        (q float8_e4m3fn [..., H * D], per-token scales fp32 [..., 1] or None).
    """
    heads = x.shape[-2]
    if (heads & (heads - 1) == 0 and heads * triton.next_power_of_2(x.shape[-1]) <= MAX_WIDTH
            and _runs_kernel(x, (z, weight), policy)):
        q, tokens = torch.ops.ocria.gated_rms_norm_fp8(x, z, weight, eps, mode, scale, int(policy.launch))
        return q, tokens if mode == "fp8_dynamic" else None
    return fp8_reference(gated_rms_norm_reference(x, z, weight, eps), mode, scale, gated=True)
