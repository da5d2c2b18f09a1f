"""Serving: a real Triton Inference Server model repository, launcher and gRPC client for ocria engines.

Command entry points (wired by ocria.cli): ``ocria-build triton-repo``, ``ocria serve``, ``ocria client``.
"""

from ocria.serving.commands import (
    add_client_args,
    add_serve_args,
    add_triton_repo_args,
    cmd_client,
    cmd_serve,
    cmd_triton_repo,
)

__all__ = ["add_client_args", "add_serve_args", "add_triton_repo_args", "cmd_client", "cmd_serve",
           "cmd_triton_repo"]
