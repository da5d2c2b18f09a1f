"""Training switch: run every GDN layer's no-cache / prefill recurrence through the chunked,
differentiable form (``ocria.models.gdn_chunked``) at any length, then restore the default."""

from collections.abc import Iterator
from contextlib import contextmanager

from ocria.models import gdn as gdn_module
from ocria.models.gdn_chunked import DEFAULT_CHUNK, chunk_gated_delta_rule

__all__ = ["DEFAULT_CHUNK", "chunk_gated_delta_rule", "chunked_gdn"]


@contextmanager
def chunked_gdn(chunk: int = DEFAULT_CHUNK) -> Iterator[None]:
    """Run every GDN layer's no-cache / prefill recurrence through the chunked form (training), then
    restore the sequential one. Cached ``verify`` steps (ReplaySSM) are not affected."""
    sequential = gdn_module.gated_delta_rule

    def rule(q, k, v, g, beta, state):
        return chunk_gated_delta_rule(q, k, v, g, beta, state, chunk)

    gdn_module.gated_delta_rule = rule
    try:
        yield
    finally:
        gdn_module.gated_delta_rule = sequential
