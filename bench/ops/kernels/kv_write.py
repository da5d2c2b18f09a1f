"""The KV-cache write (``ocria::kv_write``): the new tokens' k and v (views of the fused qkv projection) into their
cache slots in one launch, against the two indexed assignments of the reference.

Floor: k and v read, the same bytes written into the caches. Check: the caches bit for bit."""

import torch

from bench.ops.presets import drafter_config, text_config
from bench.ops.registry import BITS, Floor, Inputs, OpBench, Shape, Variant, shape
from bench.ops.switches import current
from ocria.plugins.kv_write import kv_write, kv_write_reference

LENGTH = 4096  # cache positions per slot


def kv_shapes() -> tuple[Shape, ...]:
    """Both presets' target and drafter KV heads at batch 1 and 32 x 16 tokens, and a CPU shape."""
    shapes = []
    for label in ("mini", "sim"):
        for model, cfg in (("target", text_config(label)), ("drafter", drafter_config(label))):
            shapes += [shape(f"{label}_{model}_b{b}", B=b, T=16, H=cfg["num_key_value_heads"], D=cfg["head_dim"],
                             L=LENGTH) for b in (1, 32)]
    return (shape("cpu_b2", cpu=True, B=2, T=3, H=2, D=32, L=16), *shapes)


def kv_inputs(s: Shape, device: torch.device, g: torch.Generator) -> Inputs:
    """k, v [B, T, H, D] bf16 as views of one fused [B, T, 3 H D] output, caches [B + 2, H, L, D], each row's T
    positions at a random start in its slot."""
    B, T, H, D, L = (s[n] for n in ("B", "T", "H", "D", "L"))
    fused = torch.randn(B, T, 3 * H * D, generator=g, device=device).to(torch.bfloat16)
    k, v = (fused[..., i * H * D:(i + 1) * H * D].unflatten(-1, (H, D)) for i in (1, 2))
    slots = torch.randperm(B + 2, generator=g, device=device)[:B]
    start = torch.randint(0, L - T + 1, (B, 1), generator=g, device=device)
    pos = start + torch.arange(T, device=device)
    return {"k_cache": torch.randn(B + 2, H, L, D, generator=g, device=device).to(torch.bfloat16),
            "v_cache": torch.randn(B + 2, H, L, D, generator=g, device=device).to(torch.bfloat16),
            "k": k, "v": v, "rows": slots[:, None].expand_as(pos), "pos": pos}


def kv_floor(s: Shape) -> Floor:
    tokens = s["B"] * s["T"]
    return Floor(2 * 2 * tokens * s["H"] * s["D"] * 2 + 2 * tokens * 8, 0)


def _write(fn, i: Inputs) -> tuple[torch.Tensor, ...]:
    fn(i["k_cache"], i["v_cache"], i["k"], i["v"], i["rows"], i["pos"])
    return i["k_cache"], i["v_cache"]


BENCHES = (
    OpBench(name="kv_write", shapes=kv_shapes(), inputs=kv_inputs, floor=kv_floor,
            reference=lambda i: _write(kv_write_reference, i),
            variants={"kernel": Variant(lambda i: _write(lambda *a: kv_write(*a, policy=current()), i))},
            check=BITS, mutates=True),
)
