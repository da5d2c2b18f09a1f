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


def _gpus(value: str) -> tuple[int, ...]:
    """``--gpus 0,1,...``: distinct CUDA device indices."""
    try:
        gpus = tuple(int(g) for g in value.split(","))
    except ValueError:
        gpus = ()
    if not gpus or min(gpus) < 0 or len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"expected distinct GPU indices like 0,1, got {value!r}")
    return gpus


def check_gpus(gpus: tuple[int, ...]) -> None:
    """Refuse ``--gpus`` naming a GPU this machine does not have (before any server starts)."""
    import torch

    count = torch.cuda.device_count()
    listed = ",".join(map(str, gpus))
    if count == 0:
        raise OcriaError(f"--gpus {listed}: this machine has no CUDA GPU; serve on CPU without --gpus")
    if max(gpus) >= count:
        raise OcriaError(f"--gpus {listed}: this machine has {count} CUDA GPU(s), indices 0 to {count - 1}")


def add_triton_repo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True, help="engine directory (from ocria-build engine)")
    p.add_argument("--out", required=True, help="model repository directory to write")
    p.add_argument("--instances", type=_instances, default="auto",
                   help="preprocessing instances, each a process decoding images (default auto: a quarter of the "
                        "CPU cores, 1 to 8; the engine is one loop)")
    p.add_argument("--max-batch", type=int, help="max batch size (default: the engine profile's)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="where the engine model runs")
    p.add_argument("--gpus", type=_gpus, default=(),
                   help="one engine instance on each of these GPUs, e.g. 0,1 (implies --device gpu)")
    p.add_argument("--backend", choices=("ocria", "tensorrt-llm"), default="ocria",
                   help="ocria: our Python-backend models; tensorrt-llm: TensorRT-LLM's llmapi model (--out then "
                        "holds models/, the Triton repository, and engine/, mounted at --mount)")
    p.add_argument("--trtllm-models", type=Path, metavar="DIR",
                   help="tensorrt-llm: the all_models directory of the TensorRT-LLM Triton container, whose "
                        "llmapi/tensorrt_llm/1/model.py and helpers.py are copied into the repository")
    p.add_argument("--mount", metavar="PATH",
                   help="tensorrt-llm: where engine/ is mounted in the container (default /engines/<engine name>)")
    p.add_argument("--force", action="store_true", help="replace an existing repository")


def cmd_triton_repo(args: argparse.Namespace) -> int:
    require("tritonclient.grpc", "serve", "ocria-build triton-repo (it checks configs with Triton's own parser)")
    if args.backend == "tensorrt-llm":
        return _trtllm_repo(args)
    from ocria.serving.repo import RepoOptions, validate_repo, write_repo

    opts = RepoOptions(Path(args.engine), args.instances, args.max_batch, "gpu" if args.gpus else args.device,
                       gpus=args.gpus)
    out = write_repo(args.out, opts, args.force)
    for name, cfg in validate_repo(out).items():
        kind = "ensemble" if cfg.platform == "ensemble" else cfg.backend
        decoupled = " decoupled" if cfg.model_transaction_policy.decoupled else ""
        print(f"  {name:<15} {kind}{decoupled} max_batch_size={cfg.max_batch_size}")
    print(f"model repository written to {out} (configs parsed by Triton's ModelConfig, no placeholders left)")
    return 0


def _trtllm_repo(args: argparse.Namespace) -> int:
    from ocria.serving.trtllm_repo import TrtllmRepoOptions, validate_trtllm_repo, write_trtllm_repo

    if args.gpus or args.device != "cpu" or args.instances != _instances("auto"):
        raise OcriaError("--instances, --device and --gpus are for --backend ocria: TensorRT-LLM's llmapi model "
                         "runs one instance and places the model on the GPUs itself")
    opts = TrtllmRepoOptions(Path(args.engine), args.trtllm_models, args.mount, args.max_batch)
    out = write_trtllm_repo(args.out, opts, args.force)
    model = validate_trtllm_repo(out)["model"]
    print(f"TensorRT-LLM deployment written to {out}: models/ is the Triton repository (llmapi model tensorrt_llm); "
          f"mount engine/ at {model.rsplit('/', 1)[0]}")
    return 0


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True, help="engine directory (from ocria-build engine)")
    p.add_argument("--repo", help="model repository (written here if missing; default: a temporary one)")
    p.add_argument("--frontend", choices=("triton", "dynamo"), default="triton",
                   help="triton: Triton Inference Server (gRPC/HTTP, one machine); dynamo: NVIDIA Dynamo's "
                        "OpenAI-compatible frontend (/v1/chat/completions on --http-port) routing over --workers "
                        "ocria workers (pip install 'ocria[dynamo]', see the README)")
    p.add_argument("--workers", type=int, help="dynamo: ocria workers to start (default: one per --gpus, else 1)")
    p.add_argument("--gpus", type=_gpus, default=(),
                   help="GPUs to serve on, e.g. 0,1 (implies --device gpu): triton runs one engine instance on "
                        "each, dynamo one worker on each")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--http-port", type=int, default=8000, help="HTTP port (dynamo: the OpenAI endpoint's)")
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="where the engine model runs")
    p.add_argument("--instances", type=_instances, default="auto",
                   help="preprocessing instances (default auto: a quarter of the CPU cores, 1 to 8)")
    p.add_argument("--max-batch", type=int, help="max batch size (default: the engine profile's)")
    p.add_argument("--log-file", help="tritonserver log (default: a temporary file, tail shown on failure); "
                                       "dynamo: a directory for the frontend's and each worker's log")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for the models to load")
    p.add_argument("--tritonserver", help="tritonserver binary to run (default: the one bundled in nvidia-pytriton, "
                   "else PATH's or /opt/tritonserver's)")
    p.add_argument("--stub-numpy", type=Path,
                   help="directory holding NumPy < 2 for the server's Python stub (tritonserver 2.51, the one in "
                        "nvidia-pytriton, corrupts tensors under NumPy 2; default: installed once into "
                        "~/.cache/ocria when this environment has NumPy 2)")


def cmd_serve(args: argparse.Namespace) -> int:
    if args.gpus:
        check_gpus(args.gpus)
        args.device = "gpu"
    if args.frontend == "dynamo":
        return _serve_dynamo(args)
    if args.workers is not None:
        raise OcriaError("--workers is for --frontend dynamo; Triton runs one engine instance per --gpus entry")
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
            write_repo(repo, RepoOptions(Path(args.engine), args.instances, args.max_batch, args.device,
                                         gpus=args.gpus))
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


def _serve_dynamo(args: argparse.Namespace) -> int:
    from ocria.serving.dynamo_launch import DynamoDeployment, DynamoOptions
    from ocria.serving.dynamo_worker import require_dynamo

    require_dynamo("ocria serve --frontend dynamo")

    workers = args.workers if args.workers is not None else len(args.gpus) or 1
    deployment = DynamoDeployment(DynamoOptions(Path(args.engine), workers, args.gpus, args.device, args.host,
                                                args.http_port, args.max_batch,
                                                Path(args.log_file) if args.log_file else None))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        deployment.start()
        print(f"starting the Dynamo frontend (pid {deployment.frontend.proc.pid}) and {workers} ocria worker(s) "
              f"(pids {' '.join(str(w.proc.pid) for w in deployment.workers)}) ...", flush=True)
        deployment.wait_ready(args.ready_timeout)
        print(f"ready: OpenAI chat completions at {deployment.url}/v1/chat/completions  model '{ENSEMBLE}'  "
              f"{workers} worker(s)\n"
              f"  try: ocria bench serve --backend openai --url {deployment.url} ...\n"
              "  Ctrl-C (SIGINT) or SIGTERM stops the frontend and the workers", flush=True)
        reported: set[str] = set()
        while not stop.wait(1.0):
            deployment.check_frontend()
            dead = deployment.dead_workers()
            for w in dead:
                if w.name not in reported:
                    reported.add(w.name)
                    deployment.deregister(w)
                    print(f"{w.name} exited (code {w.proc.returncode}); the frontend routes to the others",
                          file=sys.stderr, flush=True)
            if len(dead) == len(deployment.workers):
                print("every worker has exited; stopping", file=sys.stderr, flush=True)
                return 1
        print("stopping the Dynamo frontend and workers ...", flush=True)
    finally:
        deployment.stop()
    print("Dynamo deployment stopped")
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
