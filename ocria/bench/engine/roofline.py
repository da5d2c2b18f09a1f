"""The bytes roofline of a decode step: what it must move, and the fraction of the copy-bandwidth floor it reaches."""

from __future__ import annotations

from ocria.bench.engine.config import Mode
from ocria.bench.engine.decode import RunRow
from ocria.bench.engine.models import Models


def param_bytes(module) -> int:
    """Bytes of a module's weights at their stored size: quantized linears keep theirs as buffers, and
    views (fused projections, gate/up halves of a fused GEMM) count their storage once."""
    storages = {}
    for t in [*module.parameters(), *module.buffers()]:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def step_bytes(target, drafter, rows: int, kv_len: int, spec: bool) -> int:
    """Bytes a decode step must move: weights once (tied head counted once, embeddings gathered),
    each GDN state read + written once per row, each row's attention KV read once."""
    from ocria.models.config import LINEAR

    cfg = target.text_config
    text = param_bytes(target.text) - param_bytes(target.text.embed_tokens)
    weights = text + param_bytes(target.lm_head)
    if spec:  # the drafter reads the head again (its first draft_vocab_size rows when set)
        vd = drafter.config.draft_vocab_size or cfg.vocab_size
        weights += param_bytes(drafter) + param_bytes(target.lm_head) * vd // cfg.vocab_size
    n_lin = cfg.layer_types.count(LINEAR)
    state = n_lin * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4 * 2
    n_full = cfg.num_hidden_layers - n_lin
    elem = next(target.parameters()).element_size()
    kv = n_full * 2 * cfg.num_key_value_heads * cfg.head_dim * kv_len * elem
    return weights + rows * (state + kv)


def add_roofline(row: RunRow, models: Models, mode: Mode, bandwidth: float | None) -> None:
    """The bytes a step must move and, with a measured copy bandwidth (CUDA), its time floor and the fraction of
    it the step reaches."""
    row.step_bytes = step_bytes(models.target, models.drafter, row.batch, row.kv_len_end, mode.spec)
    if bandwidth is not None:
        row.floor_ms = row.step_bytes / bandwidth * 1e3
        row.roofline_fraction = row.floor_ms / row.step_ms

