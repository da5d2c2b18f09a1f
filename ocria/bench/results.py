"""One shape for every benchmark result: a header saying what ran where, the JSON written whole or not at all, and
a plot beside it (PNG, same stem)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ocria.errors import OcriaError


def result_header(kind: str) -> dict:
    """What every result file starts with: the benchmark, the command line, the code revision, the host, the
    device and the library versions it ran with."""
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else \
        f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    return {
        "benchmark": kind,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "git": _git_revision(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def _git_revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def write_json(result: dict, path: str | Path) -> Path:
    """Write ``result`` to ``path`` through a temporary file and a rename: never half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_result(result: dict, path: str | Path, plot: Callable[[dict, object], None] | None = None) -> Path:
    """The JSON at ``path`` and, given ``plot(result, figure)``, its plot at ``path`` with suffix ``.png``."""
    path = write_json(result, path)
    if plot is not None:
        save_plot(result, path.with_suffix(".png"), plot)
    return path


def save_plot(result: dict, path: Path, plot: Callable[[dict, object], None]) -> None:
    """Draw ``plot(result, figure)`` on a new matplotlib figure and save it as PNG (temporary file + rename)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise OcriaError("plots need matplotlib: pip install 'ocria[bench]'") from None
    fig = plt.figure(figsize=(10, 4.5))
    try:
        plot(result, fig)
        fig.tight_layout()
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
        os.close(fd)
        try:
            fig.savefig(tmp, dpi=110)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    finally:
        plt.close(fig)
