"""``torch.library`` operator ``ocria::kv_write`` (it mutates the caches) and the function attention layers
call; the execution policy picks the Triton kernel or the reference (``policy.uses``)."""

import torch
from torch import Tensor

from ocria.plugins.kv_write.kernel import kv_write_triton, supports
from ocria.plugins.kv_write.reference import kv_write_reference
from ocria.plugins.policy import AUTO, ExecutionPolicy, Launch


@torch.library.custom_op("ocria::kv_write", mutates_args=("k_cache", "v_cache"))
def _kv_write_op(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, rows: Tensor, pos: Tensor,
                 launch: int) -> None:
    kv_write_triton(k_cache, v_cache, k, v, rows, pos, launch=Launch(launch))


@_kv_write_op.register_fake
def _(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, rows: Tensor, pos: Tensor, launch: int) -> None:
    return None


def kv_write(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, rows: Tensor, pos: Tensor,
             policy: ExecutionPolicy = AUTO) -> None:
    """Write new keys and values into the caches, in place; see ``kv_write_reference``.

    Args:
        k_cache, v_cache: [S, Hkv, L, D] caches.
        k, v: [B, T, Hkv, D].
        rows: [B, T] long, each token's cache slot.
        pos: [B, T] long, each token's sequence index.
        policy: which implementation runs (``policy.uses``) and how its kernel launches.
    """
    if policy.uses("kv_write", k.device) and supports(k_cache, v_cache, k, v):
        torch.ops.ocria.kv_write(k_cache, v_cache, k, v, rows, pos, int(policy.launch))
    else:
        kv_write_reference(k_cache, v_cache, k, v, rows, pos)
