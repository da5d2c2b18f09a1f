"""Attention of a few new queries per row over each row's slot of a KV cache, read in place."""

from ocria.plugins.decode_attention.op import decode_attention

__all__ = ["decode_attention"]
