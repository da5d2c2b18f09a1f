"""``torch.library`` operator ``ocria::kv_write`` (it mutates the caches) and the function attention layers
call, with the plugins' switch (None: the Triton kernel on CUDA, the reference elsewhere)."""

import torch
from torch import Tensor

from ocria.plugins.kv_write.kernel import kv_write_triton, supports
from ocria.plugins.kv_write.reference import kv_write_reference
from ocria.plugins.switch import kernel_enabled


@torch.library.custom_op("ocria::kv_write", mutates_args=("k_cache", "v_cache"))
def _kv_write_op(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, rows: Tensor, pos: Tensor) -> None:
    kv_write_triton(k_cache, v_cache, k, v, rows, pos)


@_kv_write_op.register_fake
def _(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, rows: Tensor, pos: Tensor) -> None:
    return None


def kv_write(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, rows: Tensor, pos: Tensor,
             use_kernel: bool | None = None) -> None:
    """Write new keys and values into the caches, in place; see ``kv_write_reference``.

    Args:
        k_cache, v_cache: [S, Hkv, L, D] caches.
        k, v: [B, T, Hkv, D].
        rows: [B, T] long, each token's cache slot.
        pos: [B, T] long, each token's sequence index.
        use_kernel: None picks by ``kernel_enabled`` (the kernel on CUDA unless switched off); True / False force
            the kernel / the reference.
    """
    if kernel_enabled(k.device, use_kernel, "kv_write") and supports(k_cache, v_cache, k, v):
        torch.ops.ocria.kv_write(k_cache, v_cache, k, v, rows, pos)
    else:
        kv_write_reference(k_cache, v_cache, k, v, rows, pos)
