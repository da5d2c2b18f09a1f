"""Decode attention (``ocria::decode_attention``): a few new queries per row over the row's slot of the KV cache,
read in place, split over chunks of the context, against the reference (gather, GQA repeat, masked
``F.scaled_dot_product_attention``) and the one-chunk kernel.

Floor: K and V of each row's context once per KV head, q in, the output out. Check: within float tolerance of the
reference (tests/test_decode_attention.py, bf16)."""

from functools import partial

import torch

from bench.ops.presets import drafter_config, text_config
from bench.ops.registry import Floor, Inputs, OpBench, Shape, Tolerance, Variant, leading_rows, shape
from bench.ops.switches import current
from ocria.plugins.decode_attention import decode_attention
from ocria.plugins.decode_attention.kernel import decode_attention_triton
from ocria.plugins.decode_attention.reference import decode_attention_reference


def attention_shapes() -> tuple[Shape, ...]:
    """Per preset: the target at T = 1 (decode) and 16 (causal verify), the drafter's bidirectional 16-token block,
    batch 1 and 32, 300 and 4096 keys; a CPU shape over 40 keys (two 32-key chunks)."""
    shapes = []
    for label in ("mini", "sim"):
        t, d = text_config(label), drafter_config(label)
        models = (("target_ar", t, 1, 1), ("target_verify", t, 16, 1), ("drafter_block", d, 16, 0))
        shapes += [shape(f"{label}_{name}_b{b}_ctx{ctx}", B=b, T=T, H=cfg["num_attention_heads"],
                         Hkv=cfg["num_key_value_heads"], D=cfg["head_dim"], ctx=ctx, causal=causal)
                   for name, cfg, T, causal in models for b in (1, 32) for ctx in (300, 4096)]
    return (shape("cpu_b2", cpu=True, B=2, T=3, H=4, Hkv=2, D=32, ctx=40, causal=1), *shapes)


def attention_inputs(s: Shape, device: torch.device, g: torch.Generator) -> Inputs:
    """q [B, H, T, D] bf16 (a transposed view, as the layers pass it), caches [B + 1, Hkv, ctx, D] bf16, each row's
    slot and the position of its first new token (ctx - T: the context full)."""
    B, T, H, Hkv, D, ctx = (s[n] for n in ("B", "T", "H", "Hkv", "D", "ctx"))
    return {"q": torch.randn(B, T, H, D, generator=g, device=device).to(torch.bfloat16).transpose(1, 2),
            "k_cache": torch.randn(B + 1, Hkv, ctx, D, generator=g, device=device).to(torch.bfloat16),
            "v_cache": torch.randn(B + 1, Hkv, ctx, D, generator=g, device=device).to(torch.bfloat16),
            "slots": torch.randperm(B + 1, generator=g, device=device)[:B],
            "start": torch.full((B,), ctx - T, dtype=torch.int32, device=device)}


def attention_floor(s: Shape) -> Floor:
    B, T, H, Hkv, D, ctx = (s[n] for n in ("B", "T", "H", "Hkv", "D", "ctx"))
    return Floor(B * (2 * Hkv * ctx * D * 2 + 2 * 2 * T * H * D), 4 * B * H * T * ctx * D)


def _call(fn, causal: bool, i: Inputs, **kwargs) -> tuple[torch.Tensor]:
    D, ctx = i["q"].shape[-1], i["k_cache"].shape[2]
    return (fn(i["q"], i["k_cache"], i["v_cache"], i["slots"], i["start"], ctx, D**-0.5, causal, **kwargs),)


def _op(causal: bool) -> OpBench:
    name = "decode_attention" if causal else "decode_attention_block"
    shapes = tuple(s for s in attention_shapes() if s["causal"] == int(causal))
    if not causal:
        shapes = (shape("cpu_b2", cpu=True, B=2, T=3, H=4, Hkv=2, D=32, ctx=40, causal=0), *shapes)
    return OpBench(
        name=name, shapes=shapes, inputs=attention_inputs, floor=attention_floor,
        reference=partial(_call, decode_attention_reference, causal),
        variants={"kernel": Variant(lambda i: _call(decode_attention, causal, i, policy=current())),
                  "one_chunk": Variant(partial(_call, decode_attention_triton, causal, num_splits=1))},
        check=Tolerance("rel", 2e-2, "bf16 (tests/test_decode_attention.py)"),
        rows=lambda i, r: leading_rows(i, r, ("q", "slots", "start")))


BENCHES = (_op(True), _op(False))
