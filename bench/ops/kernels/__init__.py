"""The registered plugin ops, one module per plugin, each exporting ``BENCHES``: its ``OpBench`` entries."""
