"""Serving: a real Triton Inference Server model repository, launcher and gRPC client for ocria engines.

Command entry points (``ocria.serving.commands``, wired by ocria.cli): ``ocria-build triton-repo``,
``ocria serve``, ``ocria client``.
"""

ENSEMBLE = "ocria"  # the client-facing model
ENGINE = "ocria_engine"  # the decoupled engine model (postprocessing sends it cancellations)
