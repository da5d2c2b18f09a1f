"""Kernel benchmarks of the plugin ops: one registry (``registry``: each op's shapes, bytes floor, reference and
variants, ``kernels/`` one file per plugin) and one runner (``run``) that checks, times and compares them."""
