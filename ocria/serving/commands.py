"""``ocria-build triton-repo``, ``ocria serve`` and ``ocria client`` (wired into ocria.cli)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

from ocria.deps import require
from ocria.errors import OcriaError
from ocria.serving import ENSEMBLE


def _instances(value: str) -> int:
    """``--instances``: a positive count, or ``auto`` = a quarter of the CPU cores (1 to 8)."""
    if value == "auto":
        return max(1, min(8, (os.cpu_count() or 1) // 4))
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {value!r}")
    return n


def add_triton_repo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True, help="engine directory (from ocria-build engine)")
    p.add_argument("--out", required=True, help="model repository directory to write")
    p.add_argument("--instances", type=_instances, default="auto",
                   help="preprocessing instances, each a process decoding images (default auto: a quarter of the "
                        "CPU cores, 1 to 8; the engine is one loop)")
    p.add_argument("--max-batch", type=int, help="max batch size (default: the engine profile's)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="where the engine model runs")
    p.add_argument("--backend", choices=("ocria", "tensorrt-llm"), default="ocria",
                   help="ocria: our Python-backend models; tensorrt-llm: TensorRT-LLM's llmapi model")
    p.add_argument("--force", action="store_true", help="replace an existing repository")


def cmd_triton_repo(args: argparse.Namespace) -> int:
    require("tritonclient.grpc", "serve", "ocria-build triton-repo (it checks configs with Triton's own parser)")
    from ocria.serving.repo import RepoOptions, validate_repo, write_repo

    opts = RepoOptions(Path(args.engine), args.instances, args.max_batch, args.device, args.backend)
    out = write_repo(args.out, opts, args.force)
    for name, cfg in validate_repo(out, args.backend).items():
        kind = "ensemble" if cfg.platform == "ensemble" else cfg.backend
        decoupled = " decoupled" if cfg.model_transaction_policy.decoupled else ""
        print(f"  {name:<15} {kind}{decoupled} max_batch_size={cfg.max_batch_size}")
    print(f"model repository written to {out} (configs parsed by Triton's ModelConfig, no placeholders left)")
    return 0


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True, help="engine directory (from ocria-build engine)")
    p.add_argument("--repo", help="model repository (written here if missing; default: a temporary one)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="where the engine model runs")
    p.add_argument("--instances", type=_instances, default="auto",
                   help="preprocessing instances (default auto: a quarter of the CPU cores, 1 to 8)")
    p.add_argument("--max-batch", type=int, help="max batch size (default: the engine profile's)")
    p.add_argument("--log-file", help="tritonserver log (default: a temporary file, tail shown on failure)")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for the models to load")
    p.add_argument("--tritonserver", help="tritonserver binary to run (default: the one bundled in nvidia-pytriton, "
                   "else PATH's or /opt/tritonserver's)")
    p.add_argument("--stub-numpy", type=Path,
                   help="directory holding NumPy < 2 for the server's Python stub (tritonserver 2.51, the one in "
                        "nvidia-pytriton, corrupts tensors under NumPy 2; default: installed once into "
                        "~/.cache/ocria when this environment has NumPy 2)")


def cmd_serve(args: argparse.Namespace) -> int:
    require("tritonclient.grpc", "serve", "ocria serve")
    if args.tritonserver is None:
        require("pytriton", "serve", "ocria serve (without --tritonserver, it runs the server of nvidia-pytriton)")
    from ocria.serving.repo import RepoOptions, validate_repo, write_repo
    from ocria.serving.tritonserver import Ports, TritonServer

    with tempfile.TemporaryDirectory(prefix="ocria-serve-") as tmp:
        repo = Path(args.repo) if args.repo else Path(tmp) / "repo"
        if repo.exists():
            _check_repo_engine(validate_repo(repo), Path(args.engine), repo)
        else:
            write_repo(repo, RepoOptions(Path(args.engine), args.instances, args.max_batch, args.device))
            print(f"model repository written to {repo}", flush=True)
        server = TritonServer(repo, Ports(args.grpc_port, args.http_port, args.metrics_port), args.host,
                              Path(args.log_file) if args.log_file else None,
                              binary=Path(args.tritonserver) if args.tritonserver else None,
                              stub_numpy=args.stub_numpy)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        server.start()
        try:
            print(f"starting tritonserver (pid {server.proc.pid}) ...", flush=True)
            server.wait_ready(args.ready_timeout)
            print(f"ready: gRPC {server.grpc_url}  HTTP {server.http_url}  metrics {server.metrics_url}\n"
                  f"  model '{ENSEMBLE}'; try: ocria client --url {server.grpc_url} --image IMAGE --stream\n"
                  "  Ctrl-C (SIGINT) or SIGTERM stops the server", flush=True)
            while not stop.wait(1.0):
                if server.proc.poll() is not None:
                    raise OcriaError(f"tritonserver exited (code {server.proc.returncode}):\n{server.log_tail()}")
                if not _model_ready(server.http_url, ENSEMBLE):
                    print(f"model '{ENSEMBLE}' is no longer ready (engine loop died?); stopping:\n"
                          f"{server.log_tail(20)}", file=sys.stderr, flush=True)
                    return 1
            print("stopping tritonserver ...", flush=True)
        finally:
            rc = server.stop()
        print(f"tritonserver stopped (exit code {rc})")
    return 0


def _check_repo_engine(configs: dict, engine: Path, repo: Path) -> None:
    served = configs["ocria_engine"].parameters["engine_dir"].string_value
    if Path(served) != engine.resolve():
        raise OcriaError(f"{repo} serves {served}, not {engine}: rebuild it with ocria-build triton-repo --force")


def _model_ready(http_url: str, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"{http_url}/v2/models/{model}/ready", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def add_client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="127.0.0.1:8001", help="server gRPC address HOST:PORT")
    p.add_argument("--image", required=True, help="document image file")
    p.add_argument("--prompt", help="instruction (default: the engine's OCR prompt)")
    p.add_argument("--stream", action="store_true", help="print text as it is generated")
    p.add_argument("--json", action="store_true", help="print one JSON object with text and perf metrics")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each response")


def cmd_client(args: argparse.Namespace) -> int:
    require("tritonclient.grpc", "serve", "ocria client")
    from ocria.serving.client import Client

    image = Path(args.image)
    if not image.is_file():
        raise OcriaError(f"{image}: image file not found")
    kwargs = dict(prompt=args.prompt, stream=args.stream, max_tokens=args.max_tokens,
                  temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                  stop_words=tuple(args.stop), return_perf_metrics=args.json)
    client = Client(args.url, args.timeout)
    parts, ids, last = [], [], None
    try:
        for chunk in client.generate(image.read_bytes(), **kwargs):
            parts.append(chunk.text)
            ids += chunk.token_ids
            last = chunk
            if not args.json:
                print(chunk.text, end="", flush=True)
    except OcriaError:
        if parts and not args.json:
            print(flush=True)  # end the partial text's line before the error message
        raise
    if args.json:
        print(json.dumps({"text": "".join(parts), "token_ids": ids, "finish_reason": last.finish_reason, **last.perf}))
    else:
        print()
    return 0
