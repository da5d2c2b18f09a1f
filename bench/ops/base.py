"""``--base REV``: the same selection run at another git revision, for a before/after table on one machine.

The revision is checked out into a temporary worktree and run in a subprocess with this harness (``bench``) on its
path ahead of the revision's code (``ocria``), so both sides are measured the same way; the worktree is removed
after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "bench"


def run_at_revision(rev: str, argv: list[str]) -> dict:
    """The result dict of ``python -m bench.ops.run *argv`` with the plugins of revision ``rev``.

    Args:
        rev: anything ``git worktree add`` takes (a commit, a branch, ``HEAD~1``).
        argv: the runner's arguments without ``--base`` and ``--out``.
    Returns:
        The result JSON the subprocess wrote (``rows`` with the medians).
    """
    with tempfile.TemporaryDirectory(prefix="ocria-base-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), rev], cwd=REPO, check=True,
                       capture_output=True, text=True)
        try:
            (Path(tmp) / "bench").symlink_to(HARNESS, target_is_directory=True)
            out = Path(tmp) / "base.json"
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
            # cwd = tmp: its ``bench`` (this harness) comes first on sys.path, the revision's ``ocria`` next
            run = subprocess.run([sys.executable, "-m", "bench.ops.run", *argv, "--out", str(out)], cwd=tmp, env=env,
                                 capture_output=True, text=True)
            if not out.is_file():
                raise RuntimeError(f"the runner at {rev} wrote no result (exit {run.returncode}): "
                                   f"{run.stderr.strip()[-2000:]}")
            return json.loads(out.read_text())
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
            subprocess.run(["git", "worktree", "prune"], cwd=REPO, capture_output=True)
