"""Execute one linear layer stored in ModelOpt's unified HF format (bf16, FP8 or NVFP4).

Tensors per layer (``<prefix>.weight`` etc.):

- bf16: ``weight`` [N, K] (any float dtype), optional ``bias``.
- fp8: ``weight`` float8_e4m3fn [N, K], ``weight_scale`` fp32 scalar (amax / 448; a per-output-
  channel [N] vector after ``concat`` of layers with different scales), ``input_scale`` fp32
  scalar (static activation scale; absent -> dynamic per-token activation scales).
- nvfp4: ``weight`` uint8 [N, K/2] (two E2M1 per byte, low nibble = even input index),
  ``weight_scale`` float8_e4m3fn [N, K/16], ``weight_scale_2`` fp32 scalar, ``input_scale``.

Execution: FP8 weights x FP8 activations on CUDA GPUs with FP8 tensor cores (compute capability
>= 8.9): up to 16 rows (decode and verify steps) through ``ocria::decode_gemm_fp8``, whose 16-row tiles
fit them where cuBLAS's 128-row tiles do not, more through ``torch._scaled_mm``; NVFP4 weight-only
(bf16 activations, the exported ``input_scale`` is not used) through the Triton ``ocria::nvfp4_gemm``
on CUDA, since Hopper has no FP4 tensor cores; everywhere else the weight is dequantized to the compute
dtype once (cached) and FP8 activations are quantized and dequantized with the same rounding as on the GPU.

The execution policy (``forward``'s and ``mlp_forward``'s argument) picks the Triton kernels (activation
quantization, fused SiLU-quant, NVFP4 GEMM) or the PyTorch references, as for every plugin op.

An LM head (``fp32_logits``) is called with ``out_fp32=True``: its sums come back in fp32, not rounded to bf16
(bf16 logits make ties that flip greedy tokens), and ``rows(n)`` is the head's first n vocabulary rows (the
drafter's ``draft_vocab_size``) as a view.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ocria.errors import CheckpointError
from ocria.models.layers import PolicyLinear, gate_up_halves, prologue_dense
from ocria.models.quantized.formats import FORMATS, Format
from ocria.plugins import numerics as nx
from ocria.plugins.decode_gemm import decode_gemm_fp8
from ocria.plugins.fp4_gemm import nvfp4_gemm
from ocria.plugins.gemm_prologue import Prologue
from ocria.plugins.policy import AUTO, ExecutionPolicy
from ocria.plugins.silu_quant import quantize_act, silu_mul_quant


def fp8_tensor_cores(device: torch.device) -> bool:
    """True on CUDA devices with FP8 tensor cores (sm_89 Ada, sm_90 Hopper and newer)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def detect_format(tensors: dict[str, Tensor], prefix: str = "") -> Format:
    """``bf16`` / ``fp8`` / ``nvfp4`` from the dtype of ``<prefix>weight``."""
    weight = tensors.get(prefix + "weight")
    if weight is None:
        raise CheckpointError(f"linear layer {prefix!r} has no weight tensor")
    if weight.dtype == torch.float8_e4m3fn:
        return Format.FP8
    if weight.dtype == torch.uint8:
        return Format.NVFP4
    if weight.is_floating_point():
        return Format.BF16
    raise CheckpointError(f"{prefix}weight has dtype {weight.dtype}, not bf16, float8_e4m3fn or uint8")


class QuantLinear(PolicyLinear):
    """``y = x W^T (+ b)`` for one exported layer; build with ``from_tensors``."""

    fp32_logits = True  # as an LM head: ``forward(x, policy, out_fp32=True)`` gives unrounded fp32 sums

    def __init__(self, fmt: str, weight: Tensor, bias: Tensor | None = None, weight_scale: Tensor | None = None,
                 weight_scale_2: Tensor | None = None, input_scale: Tensor | None = None, name: str = "linear"):
        super().__init__()
        if fmt not in FORMATS:
            raise CheckpointError(f"{name}: unknown linear format {fmt!r}; expected one of {FORMATS}")
        self.fmt, self.name = Format(fmt), name
        self.out_features = weight.shape[0]
        self.in_features = weight.shape[1] * (2 if fmt == "nvfp4" else 1)
        self._check(weight, weight_scale, weight_scale_2)
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)
        self.register_buffer("weight_scale", None if weight_scale is None else self._scale(weight_scale, fmt))
        self.register_buffer("weight_scale_2", None if weight_scale_2 is None else weight_scale_2.float().reshape(()))
        self.register_buffer("input_scale", None if input_scale is None else input_scale.float().reshape(()))
        self._dequantized: Tensor | None = None
        self._row_scale: Tensor | None = None
        self._rows: QuantLinear | None = None

    @staticmethod
    def _scale(s: Tensor, fmt: str) -> Tensor:
        if fmt == "nvfp4":
            return s
        return s.float().reshape(()) if s.numel() == 1 else s.float().reshape(-1)

    def _check(self, weight: Tensor, ws: Tensor | None, ws2: Tensor | None) -> None:
        n, k = self.out_features, self.in_features
        if self.fmt == "fp8" and (ws is None or ws.numel() not in (1, n)):
            raise CheckpointError(f"{self.name}: FP8 weight needs a scalar or [{n}] weight_scale")
        if self.fmt == "nvfp4":
            if k % nx.NVFP4_BLOCK:
                raise CheckpointError(f"{self.name}: NVFP4 input dim {k} is not a multiple of 16")
            if ws is None or tuple(ws.shape) != (n, k // nx.NVFP4_BLOCK) or ws.dtype != torch.float8_e4m3fn:
                raise CheckpointError(f"{self.name}: NVFP4 weight_scale must be float8_e4m3fn [{n}, {k // 16}]")
            if ws2 is None or ws2.numel() != 1:
                raise CheckpointError(f"{self.name}: NVFP4 weight needs a scalar weight_scale_2")

    @classmethod
    def from_tensors(cls, tensors: dict[str, Tensor], prefix: str = "") -> "QuantLinear":
        """Build from a state dict holding ``<prefix>weight`` and, by format, its scales."""
        fmt = detect_format(tensors, prefix)
        return cls(fmt, tensors[prefix + "weight"], tensors.get(prefix + "bias"), tensors.get(prefix + "weight_scale"),
                   tensors.get(prefix + "weight_scale_2"), tensors.get(prefix + "input_scale"),
                   name=prefix.rstrip(".") or "linear")

    @classmethod
    def concat(cls, layers: list["QuantLinear"], name: str = "fused") -> "QuantLinear":
        """Stack layers that share an input (gate/up, q/k/v) along the output dim into one GEMM.

        FP8 layers with different weight scales get a per-output-channel scale vector; NVFP4 layers
        must share ``weight_scale_2`` (ModelOpt's export unifies it for such groups)."""
        fmt = layers[0].fmt
        if any(lay.fmt != fmt for lay in layers):
            raise CheckpointError(f"{name}: cannot fuse layers of formats {[lay.fmt for lay in layers]}")
        weight = torch.cat([lay.weight for lay in layers])
        biases = [lay.bias for lay in layers]
        bias = None if all(b is None for b in biases) else torch.cat(
            [b if b is not None else lay.weight.new_zeros(lay.out_features, dtype=torch.bfloat16)
             for b, lay in zip(biases, layers, strict=True)])
        ws = ws2 = None
        if fmt == "fp8":
            scales = [lay.weight_scale for lay in layers]
            if all(s.numel() == 1 and torch.equal(s, scales[0]) for s in scales):
                ws = scales[0]
            else:
                ws = torch.cat([s.expand(lay.out_features) for s, lay in zip(scales, layers, strict=True)])
        elif fmt == "nvfp4":
            if any(not torch.equal(lay.weight_scale_2, layers[0].weight_scale_2) for lay in layers):
                raise CheckpointError(f"{name}: NVFP4 layers to fuse have different weight_scale_2")
            ws, ws2 = torch.cat([lay.weight_scale for lay in layers]), layers[0].weight_scale_2
        in_scales = [lay.input_scale for lay in layers]
        input_scale = None if any(s is None for s in in_scales) else torch.stack(in_scales).max()
        return cls(fmt, weight, bias, ws, ws2, input_scale, name=name)

    @classmethod
    def fuse(cls, layers: list["QuantLinear"], name: str = "fused") -> tuple["QuantLinear", list["QuantLinear"]]:
        """``concat(layers)`` and each layer again as a view of its rows of the fused weight (and NVFP4 block
        scales), so the originals stay reachable under their names without a second copy of the weights."""
        fused, views, start = cls.concat(layers, name=name), [], 0
        for lay in layers:
            stop = start + lay.out_features
            ws = fused.weight_scale[start:stop] if lay.fmt == "nvfp4" else lay.weight_scale
            views.append(cls(lay.fmt, fused.weight[start:stop], lay.bias, ws, lay.weight_scale_2, lay.input_scale,
                             name=lay.name))
            start = stop
        return fused, views

    def rows(self, n: int) -> "QuantLinear":
        """The layer's first ``n`` outputs as a layer of its own: views of the weight and its per-row scales (made
        once per ``n``). Formats with per-row scales only (bf16, fp8)."""
        if self.fmt == "nvfp4":
            raise CheckpointError(f"{self.name}: rows of an NVFP4 layer are not supported")
        if not 0 < n <= self.out_features:
            raise CheckpointError(f"{self.name}: rows({n}) of a layer with {self.out_features} outputs")
        if self._rows is None or self._rows.out_features != n or self._rows.weight.device != self.weight.device:
            ws = self.weight_scale
            ws = ws[:n] if ws is not None and ws.dim() == 1 else ws
            self._rows = QuantLinear(self.fmt, self.weight[:n], None if self.bias is None else self.bias[:n], ws,
                                     None, self.input_scale, name=f"{self.name}[:{n}]")
        return self._rows

    @property
    def fusion_key(self) -> tuple | None:
        """Layers with equal keys that share an input can run as one ``concat`` GEMM with the same numerics:
        the same format, no bias, and the same activation quantization (FP8: one static input scale, or
        per-token scales, which depend on the input alone; NVFP4: one global weight scale). None: not fusable."""
        if self.bias is not None or self.fmt == "bf16":
            return None
        if self.fmt == "fp8":
            return ("fp8", None if self.input_scale is None else self.input_scale.item())
        return ("nvfp4", self.weight_scale_2.item())

    @property
    def input_quant(self) -> tuple[str, Tensor | None] | None:
        """(mode, static scale) of the FP8 quantization this layer applies to its input, for a producer that can
        write the FP8 input itself (a norm) and call ``forward_fp8``; None for bf16 and NVFP4 (bf16 inputs)."""
        return (self.act_mode, self.input_scale) if self.fmt == "fp8" else None

    @property
    def act_mode(self) -> str:
        """How the input is quantized: ``bf16`` (none), ``fp8_static`` or ``fp8_dynamic``."""
        if self.fmt != "fp8":
            return "bf16"
        return "fp8_static" if self.input_scale is not None else "fp8_dynamic"

    def dequantized_weight(self, dtype: torch.dtype) -> Tensor:
        """The weight in ``dtype`` [N, K] (bf16: the tensor itself)."""
        if self.fmt == "bf16":
            return self.weight.to(dtype)
        if self.fmt == "fp8":
            scale = self.weight_scale if self.weight_scale.dim() == 0 else self.weight_scale[:, None]
            return nx.dequantize_fp8(self.weight, scale, dtype)
        return nx.dequantize_nvfp4(self.weight, self.weight_scale, self.weight_scale_2, dtype)

    def _cached_weight(self, dtype: torch.dtype) -> Tensor:
        if self._dequantized is None or self._dequantized.dtype != dtype \
                or self._dequantized.device != self.weight.device:
            self._dequantized = self.dequantized_weight(dtype)
        return self._dequantized

    def _row_weight_scale(self) -> Tensor:
        """The weight scales as the [1, N] row ``_scaled_mm`` takes with per-token activation scales, made
        once: expanding a per-tensor scale and copying it on every call was one more kernel per layer."""
        if self._row_scale is None or self._row_scale.device != self.weight_scale.device:
            self._row_scale = self.weight_scale.float().expand(self.out_features).reshape(1, -1).contiguous()
        return self._row_scale

    def forward(self, x: Tensor, policy: ExecutionPolicy = AUTO, out_fp32: bool = False) -> Tensor:
        """``x W^T (+ b)`` in x's dtype; ``out_fp32``: in fp32, the FP8 GEMM's sums not rounded (an LM head)."""
        out_dtype = torch.float32 if out_fp32 else x.dtype
        if self.fmt == "bf16":
            y = F.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
            return y.to(out_dtype)
        if self.fmt == "fp8":
            if fp8_tensor_cores(x.device):
                q, s = quantize_act(x, self.act_mode, self.input_scale, policy=policy)
                return self.forward_fp8(q, s, out_dtype, policy)
            return self._emulate_fp8(x, out_dtype, policy)
        if policy.uses("nvfp4_gemm", x.device):
            y = nvfp4_gemm(x.to(torch.bfloat16), self.weight, self.weight_scale, self.weight_scale_2,
                           policy=policy).to(out_dtype)
        else:
            y = F.linear(x, self._cached_weight(x.dtype)).to(out_dtype)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def forward_fp8(self, q: Tensor, token_scales: Tensor | None, out_dtype: torch.dtype = torch.bfloat16,
                    policy: ExecutionPolicy = AUTO) -> Tensor:
        """FP8 GEMM on an already quantized input ``q`` (static ``input_scale``, or per-token
        ``token_scales`` [..., 1]): ``(q * s_x) @ (W * s_w)^T`` accumulated in fp32, rounded to ``out_dtype``
        (fp32: the sums themselves)."""
        if self.fmt != "fp8":
            raise CheckpointError(f"{self.name}: forward_fp8 on a {self.fmt} layer")
        x_scale = token_scales if token_scales is not None else self.input_scale
        tensor_cores = fp8_tensor_cores(q.device)
        y = None
        if q.device.type != "cuda" or tensor_cores:  # decode steps: one decode-GEMM launch (None: it does not fit)
            y = decode_gemm_fp8(q, self.weight, x_scale, self.weight_scale, policy=policy,
                                out_fp32=out_dtype == torch.float32)
        if y is not None:
            y = y.to(out_dtype)
        elif not tensor_cores:
            y = F.linear(nx.dequantize_fp8(q, x_scale, out_dtype), self._cached_weight(out_dtype))
        else:
            q2 = q.reshape(-1, q.shape[-1])
            if token_scales is not None or self.weight_scale.dim() == 1:  # row-wise scales
                sa = x_scale.reshape(-1, 1) if token_scales is not None else x_scale.expand(q2.shape[0], 1)
                sb = self._row_weight_scale()
            else:
                sa, sb = self.input_scale, self.weight_scale
            y = torch._scaled_mm(q2, self.weight.t(), scale_a=sa.contiguous(), scale_b=sb, out_dtype=out_dtype)
            y = y.reshape(*q.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def _emulate_fp8(self, x: Tensor, out_dtype: torch.dtype, policy: ExecutionPolicy) -> Tensor:
        if self.act_mode == "fp8_static":
            q, s = nx.quantize_fp8(x, self.input_scale), None
        else:
            q, s = nx.quantize_fp8_per_token(x)
        return self.forward_fp8(q, s, out_dtype, policy)


def mlp_forward(x: Tensor, gate_up: QuantLinear, down: nn.Module, policy: ExecutionPolicy = AUTO) -> Tensor:
    """``down(silu(gate) * up)`` with ``gate_up`` = ``QuantLinear.concat([gate_proj, up_proj])``.

    An FP8 ``down_proj`` computes the SiLU-multiply and its FP8 input in its own GEMM's launch
    (``ocria::prologue_gemm``) where that kernel takes the call, else takes its FP8 input straight from the fused
    ``ocria::silu_mul_quant`` kernel (no bf16 activation round trip); other formats, and a down_proj that scales its
    input first (AWQ's ``PreScaledLinear``), get the fused bf16 activation."""
    gu = gate_up(x, policy)
    if getattr(down, "fmt", None) == "fp8":
        y = prologue_dense(down, Prologue.SILU_MUL, *gate_up_halves(gu), policy)
        if y is not None:
            return y
        q, s = silu_mul_quant(gu, down.act_mode, down.input_scale, policy=policy)
        return down.forward_fp8(q, s, x.dtype, policy)
    h, _ = silu_mul_quant(gu, "bf16", policy=policy)
    return down(h, policy)
