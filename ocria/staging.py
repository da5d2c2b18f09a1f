"""Directories written whole or not at all: everything goes into a temporary directory beside the destination,
which is renamed into place only when it is complete."""

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """Yield a temporary directory beside ``out``; when the block ends normally it becomes ``out`` (an existing
    ``out`` is moved aside first and removed after the rename), when it raises it is removed and ``out`` is left as
    it was. Never a half-written ``out``.

    Args:
        out: the directory to write; its parent is created if missing.
    Yields:
        The temporary directory to fill.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
