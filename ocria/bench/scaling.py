"""``ocria bench scaling``: serving throughput on one GPU against several, on both serving paths.

For each frontend it serves the engine twice and drives both with ``ocria bench serve`` at the same concurrencies:

- ``triton``: ``ocria serve --gpus G0`` against ``ocria serve --gpus G0,G1,...`` (an engine instance per GPU);
- ``dynamo``: one Dynamo frontend with one worker against one with a worker per GPU.

Without ``--gpus`` (a CPU machine) it compares one Dynamo worker with two on the CPU, and runs the Triton path with
its one CPU engine instance only. Each deployment's own result (and plot) is written beside ``scaling.json``, which
holds per frontend and concurrency the requests/s of both, their ratio, errors and each engine instance's share of
the requests, checked against the targets (``SCALING_TARGET`` times the requests/s from 64 streams up, every
instance at least ``MIN_SHARE`` of them, no errors).

    ocria bench scaling --engine engines/ocria-mini --gpus 0,1 --concurrency 8 32 64 128 --out bench-scaling
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ocria.bench import serve
from ocria.bench.results import result_header, write_result
from ocria.bench.serve.summary import format_shares, shares
from ocria.errors import OcriaError
from ocria.serving.process import ServeProcess
from ocria.serving.tritonserver import free_port

SCALING_TARGET = 1.8  # requests/s of N GPUs over one, from TARGET_FROM_STREAMS concurrent streams up (2 GPUs)
TARGET_FROM_STREAMS = 64
MIN_SHARE = 0.4  # each of two engine instances serves at least this share of the requests


@dataclass(frozen=True)
class Deployment:
    """One way of serving the engine: a frontend and its engine instances (GPUs, or CPU workers)."""

    frontend: str  # triton | dynamo
    gpus: tuple[int, ...]  # empty: the CPU
    instances: int  # engine instances: one per GPU, or CPU workers

    @property
    def name(self) -> str:
        where = "gpu" + "-".join(map(str, self.gpus)) if self.gpus else "cpu"
        return f"{self.frontend}_{where}_x{self.instances}"


def plan(frontends: list[str], gpus: tuple[int, ...]) -> list[Deployment]:
    """Each frontend's single-instance deployment and its scaled one.

    Args:
        frontends: ``triton`` and/or ``dynamo``.
        gpus: the GPUs to scale over (at least 2 for a comparison); empty on a CPU machine.
    Returns:
        The deployments, the baseline of each frontend first.
    """
    out = []
    for frontend in frontends:
        if gpus:
            out.append(Deployment(frontend, gpus[:1], 1))
            if len(gpus) > 1:
                out.append(Deployment(frontend, gpus, len(gpus)))
        else:  # CPU: Triton runs one engine instance there; Dynamo can run two workers
            out += [Deployment(frontend, (), 1)] + ([Deployment(frontend, (), 2)] if frontend == "dynamo" else [])
    return out


def serve_command(dep: Deployment, engine: Path, ports: dict[str, int], extra: list[str]) -> list[str]:
    """The ``ocria serve`` arguments of a deployment."""
    cmd = ["--engine", str(engine), "--device",
           "gpu" if dep.gpus else "cpu", "--http-port", str(ports["http"])]
    if dep.gpus:
        cmd += ["--gpus", ",".join(map(str, dep.gpus))]
    if dep.frontend == "dynamo":
        return cmd + ["--frontend", "dynamo", "--workers", str(dep.instances)] + extra
    return cmd + ["--grpc-port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"])] + extra


def bench_command(dep: Deployment, ports: dict[str, int], args: argparse.Namespace, out: Path) -> list[str]:
    """The ``ocria bench serve`` arguments (after ``bench serve``) that drive a deployment."""
    if dep.frontend == "dynamo":
        target = ["--backend", "openai", "--url", f"http://127.0.0.1:{ports['http']}"]
    else:
        target = ["--url", f"127.0.0.1:{ports['grpc']}", "--metrics-url",
                  f"http://127.0.0.1:{ports['metrics']}/metrics"]
    cmd = [*target, "--concurrency", *map(str, args.concurrency), "--duration",
           str(args.duration), "--warmup", str(args.warmup), "--out", str(out)]
    if args.images:
        cmd += ["--images", str(args.images)]
    if args.max_tokens:
        cmd += ["--max-tokens", str(args.max_tokens)]
    return cmd


def instance_shares(point: dict) -> dict[str, float] | None:
    """Each engine instance's share of a point's requests: the server's per-instance counts (Triton), else the
    replies' (Dynamo workers); None when neither says."""
    return shares(point.get("served_by") or (point.get("server") or {}).get("finished_by_instance"))


def compare(frontend: str, base: dict, scaled: dict, instances: int) -> list[dict]:
    """Per concurrency: both deployments' requests/s, their ratio, errors and the scaled one's instance shares, with
    the targets' verdict (checked where they apply: two instances, from ``TARGET_FROM_STREAMS`` streams up).

    Args:
        frontend: the frontend both ran behind.
        base: the single-instance deployment's ``ocria bench serve`` result.
        scaled: the scaled deployment's.
        instances: the scaled deployment's engine instances.
    Returns:
        One row per concurrency both measured.
    """
    rows = []
    scaled_points = {p["concurrency"]: p for p in scaled["points"]}
    for b in base["points"]:
        s = scaled_points.get(b["concurrency"])
        if s is None:
            continue
        ratio = s["requests_per_s"] / b["requests_per_s"] if b["requests_per_s"] else None
        fractions = instance_shares(s)
        row = {"frontend": frontend, "concurrency": b["concurrency"], "instances": instances,
               "requests_per_s": [b["requests_per_s"], s["requests_per_s"]],
               "output_tokens_per_s": [b["output_tokens_per_s"], s["output_tokens_per_s"]],
               "ratio": ratio, "errors": [b["errors"], s["errors"]], "shares": fractions}
        if b["concurrency"] is not None and b["concurrency"] >= TARGET_FROM_STREAMS:
            row["meets_ratio"] = ratio is not None and ratio >= SCALING_TARGET * instances / 2
        row["meets_shares"] = fractions is not None and len(fractions) == instances and min(fractions.values()) >= (
            MIN_SHARE * 2 / instances)
        row["no_errors"] = b["errors"] == 0 and s["errors"] == 0
        rows.append(row)
    return rows


def format_rows(rows: list[dict]) -> str:
    """The comparison as a table."""
    head = f"{'frontend':>9}{'streams':>8}{'req/s 1':>9}{'req/s N':>9}{'ratio':>7}{'errors':>8}  shares"
    lines = [head]
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        errors = "/".join(map(str, r["errors"]))
        lines.append(f"{r['frontend']:>9}{r['concurrency']:>8}{r['requests_per_s'][0]:>9.1f}"
                     f"{r['requests_per_s'][1]:>9.1f}{ratio:>7}{errors:>8}  {format_shares(r['shares'])}")
    return "\n".join(lines)


def plot(result: dict, fig) -> None:
    """Requests/s against concurrent streams, a line per deployment."""
    ax = fig.add_subplot(1, 1, 1)
    for dep in result["deployments"]:
        points = result["points"][dep["name"]]
        ax.plot([p["concurrency"] for p in points], [p["requests_per_s"] for p in points], "o-", label=dep["name"])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("requests/s")
    ax.set_title(f"scaling over GPUs {result['gpus'] or 'none (CPU workers)'}")
    ax.legend()


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True, type=Path, help="engine directory (from ocria-build engine)")
    p.add_argument("--gpus", default="", help="GPUs to scale over, e.g. 0,1 (default: none, a CPU comparison)")
    p.add_argument("--frontends", nargs="+", choices=("triton", "dynamo"), default=["triton", "dynamo"])
    p.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 64, 128], metavar="N")
    p.add_argument("--duration", type=float, default=10.0, help="counted seconds per point (default: 10)")
    p.add_argument("--warmup", type=float, default=3.0, help="uncounted seconds before each point (default: 3)")
    p.add_argument("--images", type=Path, help="directory of document images (default: bench serve's)")
    p.add_argument("--max-tokens", type=int, help="each request's max_tokens")
    p.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for each deployment")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for every ocria serve (repeatable, e.g. --serve-arg=--stub-numpy=DIR)")
    p.add_argument("--out", type=Path, default=Path("bench-scaling"), help="directory for the results")


def _gpus(text: str) -> tuple[int, ...]:
    try:
        gpus = tuple(int(g) for g in text.split(",") if g.strip())
    except ValueError:
        raise OcriaError(f"--gpus {text!r}: give GPU indices separated by commas, e.g. 0,1") from None
    if len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus):
        raise OcriaError(f"--gpus {text!r}: GPU indices must be distinct and >= 0")
    return gpus


def run(args: argparse.Namespace) -> int:
    bench_parser = argparse.ArgumentParser(prog="ocria bench serve")
    serve.add_args(bench_parser)
    if not (args.engine / "manifest.json").is_file():
        raise OcriaError(f"{args.engine}: not an engine directory (no manifest.json); build one with ocria-build "
                         "engine")
    gpus = _gpus(args.gpus)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    deps = plan(args.frontends, gpus)
    for dep in deps:
        ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
        print(f"== {dep.name}: starting", flush=True)
        served = ServeProcess(serve_command(dep, args.engine, ports, args.serve_arg), args.ready_timeout)
        try:
            out = args.out / f"{dep.name}.json"
            if serve.run(bench_parser.parse_args(bench_command(dep, ports, args, out))) != 0:
                raise OcriaError(f"ocria bench serve failed against {dep.name}")
            results[dep.name] = json.loads(out.read_text())
        finally:
            served.stop()
    rows = []
    for frontend in args.frontends:
        mine = [d for d in deps if d.frontend == frontend]
        if len(mine) == 2:
            rows += compare(frontend, results[mine[0].name], results[mine[1].name], mine[1].instances)
    summary = {**result_header("scaling"), "engine": str(args.engine), "gpus": list(gpus),
               "deployments": [asdict(d) | {"name": d.name, "result": f"{d.name}.json"} for d in deps],
               "targets": {"ratio": SCALING_TARGET, "from_streams": TARGET_FROM_STREAMS, "min_share": MIN_SHARE},
               "comparison": rows,
               "points": {name: [{k: p[k] for k in ("concurrency", "requests_per_s", "errors")} for p in r["points"]]
                          for name, r in results.items()}}
    write_result(summary, args.out / "scaling.json", plot)
    print(format_rows(rows) if rows else "no frontend had two deployments to compare")
    print(f"results in {args.out}")
    return 0
