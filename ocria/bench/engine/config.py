"""``ocria bench engine``'s flags and the checked run settings they become (``BenchConfig``, ``Mode``).

Defining the flags imports nothing heavy: ``add_args`` runs whenever an ``ocria`` parser is built.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ocria.errors import OcriaError

if TYPE_CHECKING:
    from ocria.plugins.policy import ExecutionPolicy

DEFAULT_BATCHES = (1, 8, 32, 64)
DEFAULT_MODES = ("ar", "oracle", "tau=8", "spec")
DEFAULT_TOKENS = 48
DEFAULT_OUT = "ocria_bench_engine.json"
DEFAULT_HF_BATCHES = (1, 8)  # on CUDA; none on CPU unless asked for
PREFILL_CHUNK = 1024


@dataclass(frozen=True)
class Mode:
    """A decode mode: ``ar``, ``spec`` (the drafter as is), ``oracle`` (every draft right) or ``tau=X``."""

    name: str
    tau: float | None = None

    @property
    def spec(self) -> bool:
        """Drafts and verifies (every mode but ``ar``)."""
        return self.name != "ar"

    @property
    def forced(self) -> bool:
        """Drafts come from an oracle table instead of the drafter's proposals."""
        return self.name == "oracle" or self.tau is not None

    def nominal(self, block: int) -> float | None:
        """The mode's acceptance length by construction (None for ``spec``: whatever the drafter gets)."""
        if self.name == "ar":
            return 1.0
        if self.name == "oracle":
            return float(block)
        return self.tau


def parse_mode(text: str) -> Mode:
    """``ar``, ``spec``, ``oracle`` or ``tau=X`` (X >= 1, a mean acceptance length); OcriaError otherwise."""
    if text in ("ar", "spec", "oracle"):
        return Mode(text)
    if text.startswith("tau="):
        try:
            tau = float(text[4:])
        except ValueError:
            tau = math.nan
        if not math.isfinite(tau) or tau < 1:
            raise OcriaError(f"--modes {text!r}: tau=X needs a number X >= 1 (a mean acceptance length, e.g. tau=8)")
        return Mode(text, tau)
    raise OcriaError(f"--modes {text!r}: expected ar, spec, oracle or tau=X")


@dataclass(frozen=True)
class BenchConfig:
    """Every setting of a run, checked (``config_from_args``) before anything heavy happens."""

    engine: Path | None
    preset: str | None
    image: Path | None
    batches: tuple[int, ...]
    modes: tuple[Mode, ...]
    tokens: int
    device: str  # "cpu" or "cuda[:N]"
    recipe: str | None
    policy: ExecutionPolicy  # how the plugin ops run (--plugins and the OCRIA_* variables)
    fuse: bool
    draft_vocab: int | None
    fp32_check: int
    hf: tuple[int, ...]
    profile: bool
    out: Path

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def spec_modes(self) -> bool:
        return any(m.spec for m in self.modes)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", help="engine directory to benchmark (from ocria-build engine)")
    p.add_argument("--preset", help="random weights of this model preset instead (e.g. ocria-1-sim, ocria-mini)")
    p.add_argument("--image", help="document image every row prefills (default: the package's long synthetic page, "
                                   "shrunk to fit the engine's image limit)")
    p.add_argument("--batch", type=int, nargs="+", default=list(DEFAULT_BATCHES),
                   help="batch sizes: rows decoding the same prompt together")
    p.add_argument("--modes", nargs="+", default=list(DEFAULT_MODES),
                   help="ar, spec (the drafter as is), oracle (every draft right), tau=X (forced mean acceptance X); "
                        "ar runs first at each batch size, the others are checked against it")
    p.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, help="tokens generated per row and mode")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when there is one); "
                                                    "CPU times eager steps, CUDA graph-captured ones")
    p.add_argument("--recipe", help="with --preset: quantize the target's weights with this fixed-rule recipe, "
                                    "without calibration (an engine carries its own)")
    p.add_argument("--plugins", choices=("auto", "on", "off"), default="auto",
                   help="Triton plugin kernels: auto = on CUDA only; on = every kernel, opt-in ones too "
                        "(CPU: Triton's interpreter); off = reference implementations")
    p.add_argument("--no-fuse", action="store_true", help="with --preset: keep projections as separate GEMMs")
    p.add_argument("--draft-vocab", type=int,
                   help="the drafter's draft_vocab_size instead of its own (0: every id), for A/B runs")
    p.add_argument("--fp32-check", type=int, default=8,
                   help="rows of the fp32 spec == ar check of a CUDA (bf16) run; 0: off")
    p.add_argument("--hf", type=int, nargs="*",
                   help="HF transformers generate baseline batch sizes (default: 1 8 on CUDA, none on CPU)")
    p.add_argument("--profile", action="store_true",
                   help="CUDA: list every kernel of one eager ar and one eager oracle step at batch 1")
    p.add_argument("--out", default=DEFAULT_OUT, help="result JSON; the plot is written beside it (.png)")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The run's settings from the command line; a one-line OcriaError for any bad flag, before models load."""
    from ocria.plugins.policy import ExecutionPolicy

    engine, preset = args.engine, args.preset
    if engine is not None and preset is not None:
        raise OcriaError("--engine and --preset both name a model: give one")
    if engine is None and preset is None:
        raise OcriaError("name the model: --engine DIR (a built engine) or --preset NAME (random weights, "
                         "e.g. ocria-1-sim)")
    if engine is not None and not Path(engine).is_dir():
        raise OcriaError(f"--engine {engine}: engine directory not found")
    if engine is not None and args.recipe not in (None, "bf16"):
        raise OcriaError("--recipe applies to --preset; an engine is benchmarked with the recipe it was built with")
    if engine is not None and args.no_fuse:
        raise OcriaError("--no-fuse applies to --preset; an engine's projections are always fused")
    if args.image is not None and not Path(args.image).is_file():
        raise OcriaError(f"--image {args.image}: no such file")
    batches = _positive_ints("--batch", args.batch)
    hf = _positive_ints("--hf", args.hf or [])
    modes = tuple(parse_mode(m) for m in args.modes)
    _unique("--modes", [m.name for m in modes])
    if args.tokens < 1:
        raise OcriaError(f"--tokens {args.tokens}: must be at least 1")
    if args.fp32_check < 0:
        raise OcriaError(f"--fp32-check {args.fp32_check}: must be 0 (off) or a number of rows")
    out = Path(args.out)
    if out.suffix != ".json":
        raise OcriaError(f"--out {args.out}: must end in .json (the plot goes beside it as .png)")
    device = resolve_device(args.device)
    if args.profile and not device.startswith("cuda"):
        raise OcriaError("--profile lists CUDA kernels: it needs --device cuda")
    cuda = device.startswith("cuda")
    return BenchConfig(
        engine=Path(engine) if engine is not None else None, preset=preset,
        image=Path(args.image) if args.image is not None else None, batches=batches,
        modes=tuple(sorted(modes, key=lambda m: m.spec)),  # ar first (a stable sort keeps the rest in order)
        tokens=args.tokens, device=device, recipe=args.recipe if args.recipe not in (None, "bf16") else None,
        policy=ExecutionPolicy.from_env(args.plugins), fuse=not args.no_fuse,
        draft_vocab=args.draft_vocab, fp32_check=args.fp32_check if cuda else 0,
        hf=hf if args.hf is not None else (DEFAULT_HF_BATCHES if cuda else ()), profile=args.profile, out=out)


def _positive_ints(flag: str, values: list[int]) -> tuple[int, ...]:
    for v in values:
        if v < 1:
            raise OcriaError(f"{flag} {v}: batch sizes must be at least 1")
    _unique(flag, values)
    return tuple(values)


def _unique(flag: str, values: list) -> None:
    seen = set()
    for v in values:
        if v in seen:
            raise OcriaError(f"{flag} lists {v} twice")
        seen.add(v)


def resolve_device(name: str) -> str:
    """``auto`` -> cuda when a GPU is visible, else cpu; otherwise as ``ocria.device.resolve_device``."""
    import torch

    from ocria.device import resolve_device as checked

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(checked(name))

