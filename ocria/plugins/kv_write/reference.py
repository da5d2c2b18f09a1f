"""PyTorch reference: two indexed assignments (two ``index_put`` kernels on the GPU, for k and for v)."""

from torch import Tensor


def kv_write_reference(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, rows: Tensor, pos: Tensor) -> None:
    """k, v [B, T, Hkv, D] into caches [S, Hkv, L, D] at slot ``rows`` [B, T] and sequence index ``pos`` [B, T]."""
    k_cache[rows, :, pos] = k.to(k_cache.dtype)
    v_cache[rows, :, pos] = v.to(v_cache.dtype)
