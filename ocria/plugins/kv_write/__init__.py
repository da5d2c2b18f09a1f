"""The new tokens' k and v rows into their KV-cache slots in one launch."""

from ocria.plugins.kv_write.op import kv_write
from ocria.plugins.kv_write.reference import kv_write_reference

__all__ = ["kv_write", "kv_write_reference"]
