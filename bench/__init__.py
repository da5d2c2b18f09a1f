"""Benchmarks that are not ``ocria bench`` (end-to-end and serving live there): the plugin kernels' registry and
runner (``python -m bench.ops.run``) and the CPU count of the ops one decode step dispatches
(``python -m bench.op_count``)."""
