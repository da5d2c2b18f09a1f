"""``ocria bench``: offline engine benchmarks (``engine``) and a load generator against a running server (``serve``).

Every benchmark writes one JSON result (with ``result_header``) and a plot beside it (``write_result``).
"""
