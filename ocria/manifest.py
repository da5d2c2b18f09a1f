"""Engine manifest: a sha256 for every file, written by the builder and verified at load time, and the build
profile it records (``EngineProfile``)."""

import hashlib
import json
from dataclasses import dataclass, fields
from pathlib import Path

from ocria.errors import OcriaError

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class EngineProfile:
    """The limits an engine was built for (the manifest's ``profile``; the defaults apply to a missing key)."""

    max_batch_size: int = 8  # sequence slots, before the device's memory caps them (``plan_batch_size``)
    max_seq_len: int = 2048  # prompt + generated tokens of one sequence
    prefill_chunk: int = 512  # prompt tokens per prefill forward
    max_image_pixels: int = 1 << 20  # the processor's pixel budget per page

    @classmethod
    def from_manifest(cls, manifest: dict) -> "EngineProfile":
        """Args:
            manifest: an engine's ``manifest.json`` content (``{}`` when unverified).

        Returns:
            The profile, every field converted to ``int``.
        """
        profile = manifest.get("profile", {})
        return cls(**{f.name: int(profile.get(f.name, f.default)) for f in fields(cls)})


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_table(root: Path) -> dict[str, dict]:
    """{relative path: {sha256, bytes}} for every file under root except the manifest itself."""
    return {
        str(p.relative_to(root)): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST
    }


def read_manifest(root: Path) -> dict:
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise OcriaError(f"{root}: not an ocria engine (no {MANIFEST})")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise OcriaError(f"{path}: corrupt manifest ({e})") from None


def verify_files(root: Path, files: dict[str, dict], what: str) -> None:
    """Check every listed file's size and sha256 under ``root``; ``what`` names the list in errors."""
    for rel, entry in files.items():
        path = root / rel
        if not path.is_file():
            raise OcriaError(f"{path}: file listed in the {what} is missing")
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise OcriaError(f"{path}: size {size} bytes differs from the {what}'s {entry['bytes']} (truncated?)")
        if sha256_file(path) != entry["sha256"]:
            raise OcriaError(f"{path}: sha256 differs from the {what} (file changed)")


def verify_engine(root: Path) -> dict:
    """Check every listed file's size and sha256; refuse missing, truncated, changed or extra files."""
    root = Path(root)
    manifest = read_manifest(root)
    files = manifest.get("files", {})
    verify_files(root, files, "engine manifest")
    extra = sorted(set(file_table_names(root)) - set(files))
    if extra:
        raise OcriaError(f"{root / extra[0]}: file is not listed in the engine manifest")
    return manifest


def file_table_names(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != MANIFEST]
