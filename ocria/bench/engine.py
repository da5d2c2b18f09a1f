"""``ocria bench engine``: end-to-end decode throughput of an engine, ``ar`` against the speculative modes.

    ocria bench engine --engine engines/ocria-mini --batch 1 8 --modes ar spec tau=8 --out bench/engine.json
    ocria bench engine --preset ocria-1-sim --device cuda --batch 1 8 32 64 --out engine_h200.json

The model is a built engine directory (``--engine``: its target, drafter and processor) or the random weights of a
preset (``--preset``, optionally quantized with ``--recipe`` and no calibration: the bytes and kernels of a step
are those of an engine built with that recipe). For each batch size every row prefills the same document prompt,
then decode steps are timed: on CUDA, graph-captured steps (one graph launch and one asynchronous readback per step)
timed with CUDA events; on CPU, eager steps timed with the wall clock.

Modes: ``ar`` decodes one token per step; ``spec`` uses the drafter as is; ``oracle`` forces every draft to be the
target's own continuation; ``tau=X`` forces the first k ~ Binomial(B-1, (X-1)/(B-1)) drafts right and the rest wrong
(uniforms fixed per row and position, so a run is a function of its table). The drafter always runs; in the forced
modes its selector head runs too but does not cut the drafts sent to verification. ``ar`` runs first at each batch
size: the other modes are checked against its tokens and the forced modes start from them.

The forced modes read an oracle table of wanted tokens. ``ar``'s greedy tokens seed it, but in reduced precision the
ar path (T=1 steps) and the verify path (T=block steps) differ by rounding, a near-tie flips and every later draft
would be rejected. So before timing, a forced mode runs un-timed passes on the same batch and block schedule and
takes the tokens it emitted as the new table until a pass emits exactly the table (every block fully accepted): a
fixed point of the verify path itself. Each pass extends the agreed prefix by at least one token (the verify outputs
up to the first disagreement repeat), so the cap (every token a pass can emit, + 2) is never the reason to stop; the
passes are reported. Passes run one block past the timed run and agree on every token the timed run emits in each
row (fast rows of ``tau=X`` run far past ``--tokens``) plus a block, so its last drafts read agreed positions too.
Each forced run records its passes and ``table_source``: ``ar`` when the passes only extended ar's table past its
end, ``fixed_point`` when they rewrote a token the timed run reads (``table_first_rewrite``: the first one).

Checks, each failing the run (exit status 1): the timed tokens of a forced mode equal its table (exact: same
computation, same schedule); every spec-family run equals ``ar`` token for token, a first divergence accepted only
where the two tokens' logit gap is under twice the measured ar/verify path noise (a floating-point tie), and
reported; on CUDA (bf16 runs), an fp32 run of oracle and tau=8 against ar. On CPU the runs are fp32 already.
Also: launches per step (profiler), host time per step, fraction of the bytes roofline (CUDA; null on CPU), an HF
transformers ``generate`` baseline, ``--profile`` (CUDA): every kernel of one eager ar and one eager oracle step at
batch 1, the oracle step split into drafter and target verify + commit.

This module's top-level imports stay light (``add_args`` runs whenever an ``ocria`` parser is built): torch and the
models are imported by the functions that use them.
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocria.bench.results import result_header, write_json, write_result
from ocria.errors import OcriaError

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from ocria.models import DFlash2Drafter, DrafterCache, OCRiaForConditionalGeneration, TargetCache
    from ocria.runtime.processor import PreparedPrompt, Processor

DEFAULT_BATCHES = (1, 8, 32, 64)
DEFAULT_MODES = ("ar", "oracle", "tau=8", "spec")
DEFAULT_TOKENS = 48
DEFAULT_OUT = "ocria_bench_engine.json"
DEFAULT_HF_BATCHES = (1, 8)  # on CUDA; none on CPU unless asked for
PAGE_SEED = 7  # the default document: this seed's long synthetic page
PREFILL_CHUNK = 1024
FP32_TAU = 8.0  # the fp32 check's forced-acceptance mode (with oracle), capped at the block size


# ----------------------------------------------------------------------------------------------------------------
# Configuration


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
    plugins: bool | None  # None: kernels on CUDA, reference elsewhere
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
        plugins={"auto": None, "on": True, "off": False}[args.plugins], fuse=not args.no_fuse,
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


# ----------------------------------------------------------------------------------------------------------------
# Models and prompt


@dataclass
class Models:
    """What a run benchmarks: target and drafter on one device, and the processor that makes the prompt."""

    target: OCRiaForConditionalGeneration
    drafter: DFlash2Drafter | None
    processor: Processor
    dtype: torch.dtype
    device: torch.device
    quantized_layers: dict[str, int]  # format -> layers (empty: unquantized)
    fused: bool
    max_pixels: int | None  # the processor's image limit
    recipe: str | None  # the quantization recipe (an engine's from its manifest)

    @property
    def block(self) -> int:
        return self.drafter.config.block_size if self.drafter is not None else 1


def load_models(cfg: BenchConfig, dtype: torch.dtype, plain: bool = False) -> Models:
    """The engine's models (``--engine``) or the preset's random ones; ``plain``: a preset's without the recipe
    and the projection fusion (the fp32 check's reference)."""
    models = _engine_models(cfg, dtype) if cfg.engine is not None else _preset_models(cfg, dtype, plain)
    if models.drafter is not None:
        set_draft_vocab(models.drafter, cfg.draft_vocab)
    return models


def _engine_models(cfg: BenchConfig, dtype: torch.dtype) -> Models:
    from ocria.runtime import load_engine

    engine = load_engine(cfg.engine, device=cfg.device, dtype=dtype, use_plugins=cfg.plugins, use_graphs=False)
    quant = _quantized_layers(engine.target)
    return Models(engine.target, engine.drafter, engine.processor, engine.dtype, engine.device, quant, True,
                  engine.processor.max_pixels, engine.manifest.get("recipe"))


def _preset_models(cfg: BenchConfig, dtype: torch.dtype, plain: bool) -> Models:
    import torch

    from ocria.builder.presets import load_preset, random_models
    from ocria.runtime.processor import Processor

    preset = load_preset(cfg.preset)
    recipe = None
    if cfg.recipe is not None and not plain:
        from ocria.quant.recipe import load_recipe

        recipe = load_recipe(cfg.recipe)  # a bad recipe fails before the weights are made
        if recipe.auto is not None:
            raise OcriaError(f"--recipe {cfg.recipe}: it searches formats with calibration data; "
                             "benchmark a built engine of it (--engine) or name a fixed-rule recipe")
    target, drafter = random_models(preset, cfg.device, dtype)
    formats = {}
    if recipe is not None:
        from ocria.quant.direct import quantize_in_place

        formats = quantize_in_place(target, recipe)
        drafter.bind(target.text.embed_tokens, target.lm_head)  # the recipe's FP8 head, if any, replaced the bound one
    target.set_plugins(cfg.plugins)
    fuse = cfg.fuse and not plain
    if not plain:
        drafter.set_plugins(cfg.plugins)
    if fuse:
        target.text.fuse_projections()
        drafter.fuse_projections()
    quant = {f: list(formats.values()).count(f) for f in sorted(set(formats.values()))}
    processor = Processor(preset.assets)
    return Models(target, drafter, processor, dtype, torch.device(cfg.device), quant, fuse, processor.max_pixels,
                  cfg.recipe or "bf16")


def _quantized_layers(target) -> dict[str, int]:
    from ocria.quant.linear import QuantLinear

    formats = [m.fmt for m in target.modules() if isinstance(m, QuantLinear)]
    return {f: formats.count(f) for f in sorted(set(formats))}


def set_draft_vocab(drafter, size: int | None) -> None:
    """``--draft-vocab N`` overrides the drafter's ``draft_vocab_size`` (0: the whole vocabulary), for A/B runs."""
    from ocria.errors import ConfigError

    if size is None:
        return
    try:
        drafter.config.check_draft_vocab(size, drafter.lm_head.weight.shape[0])
    except ConfigError as e:
        raise OcriaError(f"--draft-vocab {size}: {e}") from None
    drafter.config.draft_vocab_size = size


def check_modes(cfg: BenchConfig, models: Models) -> None:
    """Modes the loaded models can run: spec-family modes (and ``--profile``) need a drafter, ``tau=X`` at most
    its block size."""
    if (cfg.spec_modes or cfg.profile) and models.drafter is None:
        raise OcriaError("this engine has no drafter: modes other than ar and --profile need one (--modes ar)")
    for m in cfg.modes:
        if m.tau is not None and m.tau > models.block:
            raise OcriaError(f"--modes {m.name}: the drafter's block is {models.block} tokens, so X can be at most "
                             f"{models.block}")


def default_page(max_pixels: int | None):
    """The package's long synthetic page, shrunk (aspect kept) when it is over ``max_pixels``."""
    from PIL import Image

    from ocria.data import LONG_PAGE, generate

    page = generate(PAGE_SEED, kind="page", config=LONG_PAGE).image
    w, h = page.size
    if max_pixels and w * h > max_pixels:
        scale = math.sqrt(max_pixels / (w * h))
        page = page.resize((max(1, int(w * scale)), max(1, int(h * scale))), Image.Resampling.LANCZOS)
    return page


def document(cfg: BenchConfig, models: Models) -> bytes:
    """The document every row prefills, encoded: ``--image``, or the default page as PNG."""
    if cfg.image is not None:
        return cfg.image.read_bytes()
    buf = io.BytesIO()
    default_page(models.max_pixels).save(buf, format="PNG")
    return buf.getvalue()


def prepare_prompt(cfg: BenchConfig, models: Models) -> PreparedPrompt:
    """The document prompt every row prefills."""
    return models.processor.prepare(document(cfg, models))


# ----------------------------------------------------------------------------------------------------------------
# Forced acceptance: the oracle table and its fixed point


class ForcedDrafter:
    """The real drafter runs; its proposals are replaced from an oracle table (graph-safe).

    ``table[slot, pos]`` is the wanted token at position ``pos``; the graph reads it in place, so the
    fixed-point passes rewrite it without a new capture. With ``tau`` the first k drafts stay right and
    the rest are made wrong, k counting uniforms under (tau - 1) / n drawn once per (slot, position):
    the same table gives the same schedule, as the fixed point needs.
    """

    def __init__(self, real, table: Tensor, tau: float | None, seed: int = 0):
        import torch

        self.real, self.table, self.tau = real, table, tau
        n = real.config.block_size - 1
        gen = torch.Generator(table.device).manual_seed(seed)
        self.draws = torch.rand(*table.shape, n, generator=gen, device=table.device) if tau is not None else None

    def __getattr__(self, name):
        return getattr(self.real, name)

    def verify_budget(self, conf):
        """Every forced draft goes to verification: the selector still runs (its cost stays in the
        step), its cut does not apply (a threshold would otherwise cap the forced acceptance)."""
        import torch

        budget = self.real.verify_budget(conf)
        return None if budget is None else torch.full_like(budget, conf.shape[1])

    def propose(self, logits, cache, slots):
        import torch

        n = logits.shape[1]
        pos = cache.ctx_len[slots].long().clamp(max=self.table.shape[1] - 1)
        idx = (pos[:, None] + 1 + torch.arange(n, device=slots.device)).clamp(max=self.table.shape[1] - 1)
        want = self.table[slots[:, None], idx]
        if self.tau is not None:
            k = (self.draws[slots, pos] < (self.tau - 1) / n).sum(1)
            wrong = torch.arange(n, device=slots.device)[None, :] >= k[:, None]
            want = torch.where(wrong, (want + 1) % logits.shape[-1], want)
        return want


def first_mismatch(want: list[int], got: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)


def table_rows(table: Tensor, start: int, tokens: list[list[int]]) -> list[list[int]]:
    """Each row's table entries over the positions its emitted tokens cover."""
    return [table[r, start: start + len(t)].tolist() for r, t in enumerate(tokens)]


def oracle_fixed_point(generate: Callable[[int], tuple[list[list[int]], list[int]]], table: Tensor, start: int,
                       max_passes: int) -> tuple[int, bool]:
    """Rewrite ``table`` in place until a pass of the forced mode emits exactly the table.

    ``generate(p)`` runs pass p (un-timed, same batch, graph and schedule as the timed run, but longer)
    and returns its tokens per row, token 0 at position ``start``, and how many of each row's tokens
    must agree: every token the timed run will emit in that row plus one block, so its last drafts read
    agreed positions too (the pass's own last block may read past what is known). Emitted tokens are
    the verify path's own greedy outputs, so they become the table. Each pass moves the first
    disagreement right by at least one token. Returns (passes, converged).
    """
    import torch

    for p in range(1, max_passes + 1):
        tokens, agree = generate(p)
        head = [t[:n] for t, n in zip(tokens, agree)]
        if all(first_mismatch(w, t) is None for w, t in zip(table_rows(table, start, head), head)):
            return p, True
        for r, t in enumerate(tokens):
            table[r, start: start + len(t)] = torch.tensor(t, device=table.device)
    return max_passes, False


def agreed_lengths(lengths: list[list[int]], want: int, block: int) -> list[int]:
    """How many of a pass's tokens per row must equal the table: all the timed run emits (it stops at
    the first step where every row has more than ``want``; ``lengths`` are the rows' lengths after
    each step of the pass), plus one block its last drafts read."""
    stop = next(n for n in lengths if min(n) > want)
    return [n + block for n in stop]


def check_table(table: Tensor, start: int, tokens: list[list[int]]) -> tuple[bool, list[dict]]:
    """A forced mode's timed tokens against its (fixed-point) table: exact, no tie allowance."""
    report = [{"row": r, "compared": len(t), "first_divergence": first_mismatch(w, t)}
              for r, (w, t) in enumerate(zip(table_rows(table, start, tokens), tokens))]
    return all(x["first_divergence"] is None for x in report), report


def reach(mode: Mode, tokens: int, block: int) -> int:
    """Most tokens a row can hold after a run of ``mode`` (its first token included): a run ends once every row
    has more than its target, the slowest row gains at least one token a step, the fastest at most a block. The
    target is ``tokens`` for a timed run and one block more for a forced mode's fixed-point passes."""
    if not mode.spec:
        return tokens + 1
    want = tokens + block if mode.forced else tokens
    return (want + 1) * block + 1


def new_table(rows: int, prompt_len: int, tokens: int, block: int, device) -> Tensor:
    """An oracle table (one row per slot, the pad slot included) wide enough for every position a run reaches."""
    import torch

    width = prompt_len + reach(Mode("oracle"), tokens, block) + block + 1
    return torch.zeros(rows + 1, width, dtype=torch.long, device=device)


# ----------------------------------------------------------------------------------------------------------------
# Decoding and timing one (batch, mode)


class EagerDecoder:
    """``GraphDecoder.step`` without a graph (CPU): the same ``decode_step`` run eagerly, its inputs kept from one
    step to the next as the graph keeps them, the same host outputs."""

    def __init__(self, target, drafter, tcache: TargetCache, dcache: DrafterCache | None):
        self.target, self.drafter, self.tcache, self.dcache = target, drafter, tcache, dcache
        self.composition: tuple | None = None
        self.slots = self.last = self.params = None

    def step(self, slots: list[int], last: list[int], params, spec: bool, max_len: int, greedy: bool,
             composition: tuple) -> tuple[Tensor, Tensor, Tensor]:
        import torch

        from ocria.runtime.decode import decode_step

        if composition != self.composition:
            dev = self.tcache.kv_len.device
            self.slots = torch.tensor(slots, device=dev)
            self.last = torch.tensor(last, device=dev)
            self.params = params if params is not None else self.params
            self.composition = composition
        T = self.drafter.config.block_size if spec else 1
        res = decode_step(self.target, self.drafter if spec else None, self.tcache, self.dcache if spec else None,
                          self.slots, self.last, self.params, min(max_len + T, self.tcache.max_len), greedy)
        self.last = res.tokens.gather(1, res.accepted[:, None])[:, 0]
        return res.tokens, res.accepted, res.proposed


@dataclass
class ModeRun:
    """One (batch, mode)'s fixed state: caches, the stepper (a CUDA graph or eager), the sampling inputs."""

    models: Models
    prompt: PreparedPrompt
    rows: int
    mode: Mode
    drafter: Any  # what the step drafts with: None (ar), the drafter, or a ForcedDrafter around it
    tcache: TargetCache
    dcache: DrafterCache | None
    decoder: Any  # GraphDecoder (CUDA) or EagerDecoder
    params: Any  # SamplingTensors
    horizon: int  # the attention length bound of every step of the run (fixed-point passes included)

    @property
    def block(self) -> int:
        return self.models.block if self.mode.spec else 1

    @property
    def real_drafter(self):
        return self.drafter.real if isinstance(self.drafter, ForcedDrafter) else self.drafter

    @property
    def cuda(self) -> bool:
        return self.models.device.type == "cuda"


@dataclass
class Generation:
    """One generation of every row: tokens and per-step timings."""

    tokens: list[list[int]]
    steps: int
    lengths: list[list[int]]  # rows' lengths after each step
    step_ms: list[float]  # device time (CUDA events) or, on CPU, the step's wall time
    wall_ms: list[float]
    ttft_ms: float
    tau: float  # mean tokens per row and step


@dataclass
class ForcedTable:
    """How a forced mode's table was settled."""

    table_source: str  # "ar", "fixed_point" or "empty"
    oracle_passes: int
    oracle_converged: bool
    table_first_rewrite: int | None


@dataclass
class RunRow:
    """One (batch, mode) result row. GPU-only measurements are None on CPU."""

    batch: int
    mode: str
    steps: int
    step_ms: float
    wall_ms_per_step: float
    host_ms_per_step: float | None
    host_fraction: float | None
    mean_acceptance_length: float
    tokens_per_s: float
    ttft_ms: float
    launches: dict | None
    kv_len_end: int
    tokens_per_s_nominal: float | None = None
    step_bytes: int | None = None
    floor_ms: float | None = None
    roofline_fraction: float | None = None
    spec_equals_ar: bool | None = None  # spec-family modes against ar's tokens (None: ar itself, or no ar run)
    table_source: str | None = None
    oracle_passes: int | None = None
    oracle_converged: bool | None = None
    table_first_rewrite: int | None = None


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def setup_run(models: Models, prompt: PreparedPrompt, rows: int, mode: Mode, table: Tensor, tokens: int) -> ModeRun:
    """Caches for ``rows`` (+ a pad slot), the stepper and sampling inputs of one mode."""
    import torch

    from ocria.models import DrafterCache, TargetCache
    from ocria.runtime.decode import SamplingTensors
    from ocria.runtime.graphs import GraphDecoder

    target, dc, dev = models.target, models.drafter, models.device
    L = prompt.input_ids.numel()
    horizon = L + reach(mode, tokens, models.block)
    max_len = horizon + models.block + 64
    # Caches in the weights' dtype, as the engine allocates them: an fp32 model over bf16 caches reads earlier
    # tokens back rounded in ar steps but not inside a verify block, which is bf16-sized path noise.
    block = dc.config.block_size if dc is not None else 1
    tcache = TargetCache.allocate(target.text_config, rows + 1, max_len, block, models.dtype, dev)
    dcache = None
    if mode.spec:
        c = dc.config
        dcache = DrafterCache.allocate(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, rows + 1, max_len,
                                       models.dtype, dev)
    use = None
    if mode.forced:
        use = ForcedDrafter(dc, table, mode.tau)
    elif mode.spec:
        use = dc
    if dev.type == "cuda":
        decoder = GraphDecoder(target, use, tcache, dcache, pad_slot=rows, max_batch=rows)
    else:
        decoder = EagerDecoder(target, use, tcache, dcache)
    zeros = torch.zeros(rows, device=dev)
    params = SamplingTensors(zeros, torch.ones(rows, device=dev), zeros.long(), zeros.long())
    return ModeRun(models, prompt, rows, mode, use, tcache, dcache, decoder, params, horizon)


def prefill_rows(run: ModeRun) -> list[int]:
    """Every row has the same prompt: prefill row 0 and copy its state into the others; returns first tokens."""
    import torch

    from ocria.models.cache import cache_tensors
    from ocria.runtime.decode import prefill

    first = int(prefill(run.models.target, run.real_drafter, run.tcache, run.dcache, 0, run.prompt,
                        chunk=PREFILL_CHUNK).argmax(-1))
    dst = torch.arange(1, run.rows, device=run.models.device)
    for cache in [run.tcache] + ([run.dcache] if run.dcache is not None else []):
        for t in cache_tensors(cache):
            t[dst] = t[0].clone()
    return [first] * run.rows


def count_launches(fn: Callable[[], Any]) -> dict:
    """CUDA graph and kernel launches (and memcpy calls) of one call of ``fn``, from the profiler's CPU events."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    graph = sum(n in ("cudaGraphLaunch", "cuGraphLaunch") for n in names)
    kernels = sum(n in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC") for n in names)
    copies = sum(n.startswith("cudaMemcpy") for n in names)
    return {"graph_launches": graph, "kernel_launches": kernels, "memcpy_calls": copies,
            "launches_per_step": graph + kernels}


def warm_up(run: ModeRun) -> dict | None:
    """Capture the step (CUDA) or run it once (CPU) on a throw-away generation; on CUDA, count one step's
    launches."""
    slots = list(range(run.rows))
    first = prefill_rows(run)
    tag = ("warm", run.mode.name)
    run.decoder.step(slots, first, run.params, run.mode.spec, run.horizon, True, tag)
    if not run.cuda:
        return None
    return count_launches(lambda: run.decoder.step(slots, first, None, run.mode.spec, run.horizon, True, tag))


def generate(run: ModeRun, tag: tuple, want: int) -> Generation:
    """Prefill every row, then decode steps until each row has ``want`` tokens after its first."""
    import torch

    dev = run.models.device
    sync(dev)
    t0 = time.perf_counter()
    first = prefill_rows(run)
    sync(dev)
    ttft_ms = (time.perf_counter() - t0) * 1e3  # one prompt prefill (the other rows copy its state)
    tokens = [[t] for t in first]
    slots = list(range(run.rows))
    step_ms, wall_ms, lengths, accepted = [], [], [], 0
    events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if run.cuda else None
    while min(len(t) for t in tokens) <= want:  # every step emits a token per row
        w0 = time.perf_counter()
        if events:
            events[0].record()
        out, acc, _ = run.decoder.step(slots, [t[-1] for t in tokens], run.params, run.mode.spec, run.horizon, True,
                                       tag)
        if events:
            events[1].record()
        wall_ms.append((time.perf_counter() - w0) * 1e3)
        if events:
            events[1].synchronize()  # the step waits for its readback only, which can finish before the end event
            step_ms.append(events[0].elapsed_time(events[1]))
        else:
            step_ms.append(wall_ms[-1])
        out, acc = out.cpu(), acc.cpu()
        for r in range(run.rows):
            tokens[r] += out[r, : int(acc[r]) + 1].tolist()
        lengths.append([len(t) for t in tokens])
        accepted += int(acc.sum())
    n = len(step_ms)
    return Generation(tokens, n, lengths, step_ms, wall_ms, ttft_ms, (accepted + run.rows * n) / (run.rows * n))


def settle_table(run: ModeRun, table: Tensor, tokens: int, source: str) -> ForcedTable:
    """Bring a forced mode's table to its fixed point: passes one block longer than the timed run, agreeing on
    everything it emits. ``source`` says where ``table`` came from."""
    L, T = run.prompt.input_ids.numel(), run.block

    def agreed_pass(p: int) -> tuple[list[list[int]], list[int]]:
        gen = generate(run, ("pass", run.mode.name, p), tokens + T)
        return gen.tokens, agreed_lengths(gen.lengths, tokens, T)

    before = table[:run.rows, L: L + tokens + 1].clone()
    passes, converged = oracle_fixed_point(agreed_pass, table, L, reach(run.mode, tokens, T) + 2)
    # where the passes rewrote what the timed run reads (not just extended the table past it)
    changed = (table[:run.rows, L: L + tokens + 1] != before).any(0).nonzero()
    rewrite = int(changed[0]) if changed.numel() else None
    return ForcedTable(source if rewrite is None else "fixed_point", passes, converged, rewrite)


def summarize(run: ModeRun, gen: Generation, launches: dict | None, forced: ForcedTable | None) -> RunRow:
    """A run's row: medians over the steps after the first (the first may still warm caches)."""
    med_step = statistics.median(gen.step_ms[1:] or gen.step_ms)
    med_wall = statistics.median(gen.wall_ms[1:] or gen.wall_ms)
    host = max(med_wall - med_step, 0.0) if run.cuda else None
    row = RunRow(batch=run.rows, mode=run.mode.name, steps=gen.steps, step_ms=med_step, wall_ms_per_step=med_wall,
                 host_ms_per_step=host, host_fraction=host / med_wall if host is not None else None,
                 mean_acceptance_length=gen.tau, tokens_per_s=run.rows * gen.tau / (med_wall / 1e3),
                 ttft_ms=gen.ttft_ms, launches=launches,
                 kv_len_end=run.prompt.input_ids.numel() + max(len(t) for t in gen.tokens))
    if forced is not None:
        row.table_source, row.oracle_passes = forced.table_source, forced.oracle_passes
        row.oracle_converged, row.table_first_rewrite = forced.oracle_converged, forced.table_first_rewrite
    nominal = run.mode.nominal(run.models.block)
    if nominal is not None:  # step cost is shape-fixed: throughput at the mode's nominal acceptance
        row.tokens_per_s_nominal = run.rows * nominal / (med_wall / 1e3)
    return row


def time_mode(models: Models, prompt: PreparedPrompt, rows: int, mode: Mode, table: Tensor, tokens: int,
              source: str = "ar") -> tuple[RunRow, list[list[int]]]:
    """Capture + profile on a throw-away generation, bring a forced mode's table to its fixed point, then time a
    fresh generation. ``ar`` writes its tokens into ``table`` (the forced modes' seed)."""
    import torch

    run = setup_run(models, prompt, rows, mode, table, tokens)
    launches = warm_up(run)
    forced = settle_table(run, table, tokens, source) if mode.forced else None
    gen = generate(run, ("timed", mode.name), tokens)
    if not mode.spec:
        L = prompt.input_ids.numel()
        for r in range(rows):
            table[r, L: L + len(gen.tokens[r])] = torch.tensor(gen.tokens[r], device=table.device)
    return summarize(run, gen, launches, forced), gen.tokens


# ----------------------------------------------------------------------------------------------------------------
# Checks: spec == ar, forced tokens == table


@dataclass
class LosslessCheck:
    """spec against ar for one model and prompt; a divergence is tolerated only at a tie: where ar's logit gap
    between the two tokens is within ``tie_margin`` (the measured path noise)."""

    target: Any
    prompt: PreparedPrompt
    tie_margin: float

    def __post_init__(self):
        self._gaps: dict[tuple, float | None] = {}

    def margin(self, ar: list[int], spec: list[int], i: int) -> float | None:
        """Logit gap between ar's and spec's token at generated index i, from a fresh full forward (cached:
        rows with the same prompt diverge identically)."""
        from ocria.train.evaluate import logit_gap

        key = (tuple(ar[:i]), ar[i], spec[i])
        if key not in self._gaps:
            self._gaps[key] = logit_gap(self.target, self.prompt, list(key[0]), key[1], key[2])
        return self._gaps[key]

    def __call__(self, ar_tokens: list[list[int]], spec_tokens: list[list[int]]) -> tuple[bool, list[dict]]:
        """Compare each row up to the shorter length."""
        report = []
        for r, (a, s) in enumerate(zip(ar_tokens, spec_tokens)):
            n = min(len(a), len(s))
            diff = next((i for i in range(n) if a[i] != s[i]), None)
            entry = {"row": r, "compared": n, "first_divergence": diff}
            if diff is not None:
                entry["logit_gap"] = self.margin(a, s, diff)
                entry["tie"] = entry["logit_gap"] is not None and entry["logit_gap"] <= self.tie_margin
            report.append(entry)
        return all(x["first_divergence"] is None or x["tie"] for x in report), report


def step_logits(target, prompt: PreparedPrompt, tokens: list[int], chunk: int) -> Tensor:
    """Logits [1, len(tokens), V] of ``tokens`` teacher-forced after ``prompt``'s prefill, in decode steps of
    ``chunk`` tokens (1: the ar path; the block size: the verify path)."""
    import torch

    from ocria.models import TargetCache
    from ocria.runtime.decode import prefill

    cfg = target.text_config
    L, n = prompt.input_ids.numel(), len(tokens)
    embed = target.text.embed_tokens.weight
    with torch.no_grad():
        cache = TargetCache.allocate(cfg, 1, L + n + chunk, chunk, embed.dtype, embed.device)
        prefill(target, None, cache, None, 0, prompt, chunk=PREFILL_CHUNK)
        slot = torch.zeros(1, dtype=torch.long, device=embed.device)
        ids = torch.tensor(tokens, device=embed.device)[None]
        out = []
        for s in range(0, n, chunk):
            index = cache.kv_len[slot].long()[:, None] + torch.arange(chunk, device=embed.device)
            pos = (index + cache.rope_delta[slot][:, None]).expand(3, 1, chunk)
            hidden, _ = target.forward_cached(target.text.embed_tokens(ids[:, s:s + chunk]), pos, cache, slot,
                                              "verify", attn_len=L + n)
            cache.commit(slot, torch.full((1,), chunk, device=embed.device))
            out.append(target.logits(hidden))
        return torch.cat(out, 1)


def path_noise(target, prompt: PreparedPrompt, tokens: list[int], block: int) -> float:
    """Max |logit| difference between the ar path (T=1 steps) and the verify path (one T=block step)
    on the same teacher-forced tokens: how far apart the two computations are in this precision."""
    tokens = tokens[:block]
    return float((step_logits(target, prompt, tokens, 1) - step_logits(target, prompt, tokens, block)).abs().max())


def record_table_check(result: dict, table: Tensor, start: int, tokens: list[list[int]], row: RunRow,
                       precision: str) -> bool:
    """Forced mode: the timed tokens must equal the table they were forced from; stored in ``result``."""
    ok, report = check_table(table, start, tokens)
    result["table_checks"].append({"precision": precision, "batch": row.batch, "mode": row.mode, "ok": ok,
                                   "table_source": row.table_source, "oracle_passes": row.oracle_passes,
                                   "oracle_converged": row.oracle_converged,
                                   "table_first_rewrite": row.table_first_rewrite, "rows": report})
    if not ok:
        print(f"B={row.batch} {row.mode} ({precision}): timed tokens differ from the oracle table", flush=True)
    return ok


def fp32_check(cfg: BenchConfig, prompt: PreparedPrompt, result: dict) -> bool:
    """spec == ar on the same weights in fp32 (oracle and tau=8), where no tie should flip (CUDA's bf16 runs)."""
    import torch

    models = load_models(cfg, torch.float32, plain=True)
    rows = cfg.fp32_check
    L = prompt.input_ids.numel()
    table = new_table(rows, L, cfg.tokens, models.block, models.device)
    check = LosslessCheck(models.target, prompt, 1e-3)
    _, ar = time_mode(models, prompt, rows, Mode("ar"), table, cfg.tokens)
    ok_all, source = True, "ar"
    tau = min(FP32_TAU, float(models.block))
    for mode in (Mode("oracle"), Mode(f"tau={tau:g}", tau)):
        row, spec = time_mode(models, prompt, rows, mode, table, cfg.tokens, source)
        source = row.table_source
        ok, report = check(ar, spec)
        ok_all &= ok & record_table_check(result, table, L, spec, row, "fp32")
        result["lossless"].append({"precision": "fp32", "batch": rows, "mode": mode.name, "ok": ok,
                                   "mean_acceptance_length": row.mean_acceptance_length, "rows": report})
        print(f"fp32 {mode.name}: lossless {ok}, tau {row.mean_acceptance_length:.2f}, "
              f"table {source} after {row.oracle_passes} passes", flush=True)
    del models
    torch.cuda.empty_cache()
    return ok_all


# ----------------------------------------------------------------------------------------------------------------
# Bytes roofline (CUDA)


def param_bytes(module) -> int:
    """Bytes of a module's weights at their stored size: quantized linears keep theirs as buffers, and
    views (fused projections, gate/up halves of a fused GEMM) count their storage once."""
    storages = {}
    for t in [*module.parameters(), *module.buffers()]:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def step_bytes(target, drafter, rows: int, kv_len: int, spec: bool) -> int:
    """Bytes a decode step must move: weights once (tied head counted once, embeddings gathered),
    each GDN state read + written once per row, each row's attention KV read once."""
    from ocria.models.config import LINEAR

    cfg = target.text_config
    text = param_bytes(target.text) - param_bytes(target.text.embed_tokens)
    weights = text + param_bytes(target.lm_head)
    if spec:  # the drafter reads the head again (its first draft_vocab_size rows when set)
        vd = drafter.config.draft_vocab_size or cfg.vocab_size
        weights += param_bytes(drafter) + param_bytes(target.lm_head) * vd // cfg.vocab_size
    n_lin = cfg.layer_types.count(LINEAR)
    state = n_lin * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4 * 2
    n_full = cfg.num_hidden_layers - n_lin
    elem = next(target.parameters()).element_size()
    kv = n_full * 2 * cfg.num_key_value_heads * cfg.head_dim * kv_len * elem
    return weights + rows * (state + kv)


def add_roofline(row: RunRow, models: Models, mode: Mode, bandwidth: float | None) -> None:
    """The bytes a step must move and, with a measured copy bandwidth (CUDA), its time floor and the fraction of
    it the step reaches."""
    row.step_bytes = step_bytes(models.target, models.drafter, row.batch, row.kv_len_end, mode.spec)
    if bandwidth is not None:
        row.floor_ms = row.step_bytes / bandwidth * 1e3
        row.roofline_fraction = row.floor_ms / row.step_ms


# ----------------------------------------------------------------------------------------------------------------
# Kernel profile (CUDA, --profile)


class DrafterRanges:
    """A drafter whose step calls run inside profiler ranges ``drafter.<method>``, so a profile can
    tell the drafter's kernels from the target's without touching the model code."""

    METHODS = ("draft", "propose", "verify_budget", "append_context")

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in self.METHODS:
            return attr

        def ranged(*a, **kw):
            import torch

            with torch.profiler.record_function(f"drafter.{name}"):
                return attr(*a, **kw)

        return ranged


def profile_steps(models: Models, prompt: PreparedPrompt) -> dict:
    """Every CUDA kernel of one eager ar step and one eager oracle step (draft + verify + commit) at
    batch 1: where the time inside the graph goes, and which small kernels are left to fuse."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ocria.bench.timing import kernel_table
    from ocria.models import DrafterCache, TargetCache
    from ocria.runtime.decode import SamplingTensors, decode_step, prefill

    target, drafter, dev = models.target, models.drafter, models.device
    cfg, dc = target.text_config, drafter.config
    L = prompt.input_ids.numel()
    slot = torch.zeros(1, dtype=torch.long, device=dev)
    zero = torch.zeros(1, device=dev)
    params = SamplingTensors(zero, torch.ones(1, device=dev), zero.long(), zero.long())
    table = torch.zeros(1, L + 256, dtype=torch.long, device=dev)  # the wanted tokens do not change the kernels
    out = {}
    for mode in ("ar", "oracle"):
        spec = mode != "ar"
        tcache = TargetCache.allocate(cfg, 1, L + 256, dc.block_size, models.dtype, dev)
        dcache = DrafterCache.allocate(dc.num_hidden_layers, dc.num_key_value_heads, dc.head_dim, 1, L + 256,
                                       models.dtype, dev) if spec else None
        use = DrafterRanges(ForcedDrafter(drafter, table, None)) if spec else None
        last = prefill(target, drafter if spec else None, tcache, dcache, 0, prompt).argmax(-1)
        for _ in range(3):
            decode_step(target, use, tcache, dcache, slot, last, params, L + 64, True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            decode_step(target, use, tcache, dcache, slot, last, params, L + 64, True)
            torch.cuda.synchronize()
        ranges = tuple(f"drafter.{m}" for m in DrafterRanges.METHODS) if spec else ()
        table_ = kernel_table(prof, ranges)
        r = {"total_kernel_us": table_["total_kernel_us"], "kernels": table_["kernels"]}
        if spec:
            drafter_us = sum(x["total_us"] for x in table_["ranges"].values())
            drafter_n = sum(x["kernels"] for x in table_["ranges"].values())
            r.update(drafter_us=drafter_us, drafter_kernels=drafter_n,
                     target_verify_commit_us=r["total_kernel_us"] - drafter_us,
                     target_verify_commit_kernels=r["kernels"] - drafter_n, ranges=table_["ranges"])
        r.update(top=table_["all_kernels"][:20], all_kernels=table_["all_kernels"])
        out[mode] = r
        print(f"eager {mode} step (B=1): {r['kernels']} kernels, {r['total_kernel_us'] / 1e3:.3f} ms of kernel time"
              + (f"; drafter {r['drafter_kernels']} kernels {r['drafter_us'] / 1e3:.3f} ms, target verify + commit "
                 f"{r['target_verify_commit_kernels']} kernels {r['target_verify_commit_us'] / 1e3:.3f} ms"
                 if spec else ""), flush=True)
        for k in r["top"]:
            print(f"  {k['total_us']:9.1f} us  {k['calls']:4d}x  {k['kernel'][:90]}", flush=True)
        del tcache, dcache
    return out


# ----------------------------------------------------------------------------------------------------------------
# HF transformers baseline


def hf_baseline(models: Models, prompt_ids: Tensor, batch: int, new_tokens: int) -> dict:
    """HF ``generate`` (greedy) on the same weights and text prompt: tokens/s of ``batch`` rows."""
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    target, dev = models.target, models.device
    cfg = Qwen3_5Config(**target.config.to_hf())
    with torch.device(dev):
        hf = Qwen3_5ForConditionalGeneration(cfg).to(models.dtype).eval()
    missing, unexpected = hf.load_state_dict(target.state_dict(), strict=False)
    if unexpected or any(not k.startswith("lm_head") for k in missing):
        raise RuntimeError(f"HF weights do not match: missing {missing[:3]}, unexpected {unexpected[:3]}")
    ids = prompt_ids[None].repeat(batch, 1).to(dev)
    hf.generate(ids, max_new_tokens=4, do_sample=False)
    sync(dev)
    t0 = time.perf_counter()
    hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    sync(dev)
    seconds = time.perf_counter() - t0
    return {"batch": batch, "new_tokens": new_tokens, "seconds": seconds, "tokens_per_s": batch * new_tokens / seconds}


def run_hf_baselines(cfg: BenchConfig, models: Models, prompt: PreparedPrompt) -> list[dict]:
    """The baseline at each ``--hf`` batch size, on unquantized weights only; a failure is recorded, not raised
    (the baseline must not hide the engine's own results)."""
    if models.quantized_layers:
        return []
    text_ids = prompt.input_ids[prompt.input_ids != models.processor.image_token_id][:512]
    out = []
    for b in cfg.hf:
        try:
            out.append(hf_baseline(models, text_ids, b, 64))
            print("HF", out[-1], flush=True)
        except Exception as e:  # reported in the result instead
            out.append({"batch": b, "error": f"{type(e).__name__}: {e}"})
    return out


# ----------------------------------------------------------------------------------------------------------------
# Result: header, rows, table, plot


def start_result(cfg: BenchConfig, models: Models, prompt: PreparedPrompt, bandwidth: float | None) -> dict:
    """The result's header and settings; rows and checks are appended as the run goes."""
    import torch

    from ocria.plugins.launch import pdl_launch
    from ocria.plugins.switch import disabled_kernels, enabled_kernels, invariance_enabled

    drafter = models.drafter
    return {
        **result_header("engine"),
        "engine": str(cfg.engine) if cfg.engine is not None else None,
        "preset": cfg.preset,
        "image": str(cfg.image) if cfg.image is not None else None,
        "device_type": models.device.type,
        "dtype": str(models.dtype).removeprefix("torch."),
        "timing": "cuda_graph" if models.device.type == "cuda" else "eager_wall_clock",
        "batches": list(cfg.batches),
        "modes": [m.name for m in cfg.modes],
        "tokens": cfg.tokens,
        "plugins": {None: "auto", True: "on", False: "off"}[cfg.plugins],
        "disabled_kernels": sorted(disabled_kernels()),
        "enabled_kernels": sorted(enabled_kernels()),
        "pdl": pdl_launch(models.device) if models.device.type == "cuda" else None,
        "batch_invariant": invariance_enabled(),
        "recipe": models.recipe,
        "quantized_layers": models.quantized_layers,
        "fused_projections": models.fused,
        "block_size": models.block,
        "draft_vocab_size": drafter.config.draft_vocab_size if drafter is not None else None,
        "prompt_tokens": prompt.input_ids.numel(),
        "copy_bandwidth_GBps": bandwidth / 1e9 if bandwidth is not None else None,
        "target_params": sum(p.numel() for p in models.target.text.parameters()),
        "drafter_params": sum(p.numel() for p in drafter.parameters()) if drafter is not None else None,
        "torch_threads": torch.get_num_threads() if models.device.type == "cpu" else None,
        "runs": [], "lossless": [], "table_checks": [], "fp32_check": None,
        "path_noise": None,  # max logit difference of the ar and verify paths, in the run's dtype
        "hf_baseline": [], "lossless_ok": None,
    }


def _fmt(value, spec: str, width: int) -> str:
    return f"{value:{width}{spec}}" if value is not None else f"{'-':>{width}}"


def _row_parts(row: dict) -> tuple[int | None, bool | None, str]:
    """(launches per step, the spec == ar check, the forced table's source) of a result row."""
    launches = row["launches"]["launches_per_step"] if row["launches"] else None
    table = f"{row['table_source']} ({row['oracle_passes']} passes)" if row["table_source"] else ""
    return launches, row["spec_equals_ar"], table


def row_line(row: dict) -> str:
    """One row as printed while the run goes."""
    launches, same, table = _row_parts(row)
    check = {None: "", True: "  spec==ar ok", False: "  spec==ar VIOLATED"}[same]
    return (f"B={row['batch']:3d} {row['mode']:7s} step {row['step_ms']:8.3f} ms  host "
            f"{_fmt(row['host_ms_per_step'], '.3f', 6)} ms  tau {row['mean_acceptance_length']:5.2f}  "
            f"{row['tokens_per_s']:9.1f} tok/s  roofline {_fmt(row['roofline_fraction'], '.2f', 4)}  "
            f"launches {_fmt(launches, 'd', 3)}{check}{'  table ' + table if table else ''}")


def print_table(result: dict) -> None:
    """The batch x mode table: step time, tokens/s, acceptance length, the spec == ar check."""
    print(f"\n{'batch':>5} {'mode':>8} {'ms/step':>9} {'host ms':>8} {'tok/s':>10} {'accept':>6} {'nominal':>10} "
          f"{'roofline':>8} {'launches':>8} {'spec==ar':>8}  table")
    for r in result["runs"]:
        launches, same, table = _row_parts(r)
        check = {None: "-", True: "ok", False: "VIOLATED"}[same]
        print(f"{r['batch']:5d} {r['mode']:>8} {r['step_ms']:9.3f} {_fmt(r['host_ms_per_step'], '.3f', 8)} "
              f"{r['tokens_per_s']:10.1f} {r['mean_acceptance_length']:6.2f} "
              f"{_fmt(r['tokens_per_s_nominal'], '.1f', 10)} {_fmt(r['roofline_fraction'], '.2f', 8)} "
              f"{_fmt(launches, 'd', 8)} {check:>8}  {table}")
    for h in result["hf_baseline"]:
        print("HF generate", h)
    print("lossless:", "ok" if result["lossless_ok"] else "VIOLATED", "| forced tokens == table:",
          all(c["ok"] for c in result["table_checks"]))


def plot(result: dict, fig) -> None:
    """Tokens/s and step time against batch size, one line per mode (x: the HF generate baseline)."""
    from matplotlib.ticker import FuncFormatter

    a, b = fig.subplots(1, 2)
    modes = list(dict.fromkeys(r["mode"] for r in result["runs"]))
    batches = sorted({r["batch"] for r in result["runs"]})
    for m in modes:
        rs = sorted((r for r in result["runs"] if r["mode"] == m), key=lambda r: r["batch"])
        a.plot([r["batch"] for r in rs], [r["tokens_per_s"] for r in rs], marker="o", label=m)
        b.plot([r["batch"] for r in rs], [r["step_ms"] for r in rs], marker="o", label=m)
    hf = [h for h in result.get("hf_baseline", []) if "tokens_per_s" in h]
    if hf:
        a.scatter([h["batch"] for h in hf], [h["tokens_per_s"] for h in hf], marker="x", color="k",
                  label="HF generate")
    model = result["preset"] or Path(result["engine"] or "engine").name
    unit = "device time" if result["timing"] == "cuda_graph" else "wall time, eager"
    for ax in (a, b):
        ax.set_xscale("log")
        if batches:
            ax.set_xticks(batches, [str(x) for x in batches])
            ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        ax.legend()
    a.set(yscale="log", xlabel="batch", ylabel="tokens/s", title=f"{model} on {result['device']}")
    # 20, 50, 100 rather than 2x10^1 on the log axis, labels at 1, 2 and 5 of each decade only
    plain = FuncFormatter(lambda v, _: f"{v:g}" if v > 0 and f"{v:.0e}"[0] in "125" else "")
    a.yaxis.set_major_formatter(plain)
    a.yaxis.set_minor_formatter(plain)
    b.set(xlabel="batch", ylabel="ms per decode step", title=f"decode step ({unit})")


# ----------------------------------------------------------------------------------------------------------------
# The run


def measure_path_noise(models: Models, prompt: PreparedPrompt, result: dict) -> float:
    """The ar/verify path noise in the run's precision: the spec == ar check's tie margin is twice it."""
    noise = path_noise(models.target, prompt, [1 + i for i in range(16)], models.block)
    result["path_noise"] = noise
    print(f"{result['dtype']} logit noise between ar and verify paths: {noise:.4g}", flush=True)
    return noise


def bench_batch(cfg: BenchConfig, models: Models, prompt: PreparedPrompt, rows: int, check: LosslessCheck | None,
                bandwidth: float | None, result: dict, progress) -> bool:
    """Every mode at one batch size; rows and checks go into ``result`` (saved after each row)."""
    L = prompt.input_ids.numel()
    precision = str(models.dtype).removeprefix("torch.")
    table = new_table(rows, L, cfg.tokens, models.block, models.device)
    ar_tokens, source, ok = None, "empty", True
    for mode in cfg.modes:
        progress.set_postfix_str(f"batch {rows} {mode.name}")
        row, tokens = time_mode(models, prompt, rows, mode, table, cfg.tokens, source)
        if mode.forced:
            source = row.table_source
            ok &= record_table_check(result, table, L, tokens, row, precision)
        add_roofline(row, models, mode, bandwidth)
        if not mode.spec:
            ar_tokens, source = tokens, "ar"
        elif ar_tokens is not None and check is not None:
            row.spec_equals_ar, report = check(ar_tokens, tokens)
            ok &= row.spec_equals_ar
            result["lossless"].append({"precision": precision, "batch": rows, "mode": mode.name,
                                       "ok": row.spec_equals_ar, "rows": report})
        result["runs"].append(asdict(row))
        write_json(result, cfg.out)  # partial results survive an interrupted run
        if models.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
        progress.write(row_line(result["runs"][-1]))
        progress.update()
    return ok


def run(args: argparse.Namespace) -> int:
    """``ocria bench engine``: 0 when every check held, 1 when one failed (2 for bad flags, from the CLI)."""
    cfg = config_from_args(args)
    import torch

    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 check must be fp32
    try:
        with torch.no_grad():
            return bench(cfg)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def bench(cfg: BenchConfig) -> int:
    """Load, check in fp32 (CUDA), measure the path noise, time every (batch, mode), write the result and plot."""
    import torch
    from tqdm import tqdm

    cuda = cfg.cuda
    models = load_models(cfg, torch.bfloat16 if cuda else torch.float32)
    check_modes(cfg, models)
    prompt = prepare_prompt(cfg, models)
    bandwidth = None
    if cuda:
        from ocria.bench.timing import copy_bandwidth

        bandwidth = copy_bandwidth()
    result = start_result(cfg, models, prompt, bandwidth)
    print(f"{cfg.engine or cfg.preset} on {result['device']}: prompt {result['prompt_tokens']} tokens, "
          f"block {models.block}, {result['timing'].replace('_', ' ')}", flush=True)
    ok = True
    if cfg.fp32_check and cfg.spec_modes:
        result["fp32_check"] = fp32_check(cfg, prompt, result)
        ok &= result["fp32_check"]
    from ocria.bench.prefill import measure_prefill

    result["prefill"] = first = measure_prefill(models, document(cfg, models), PREFILL_CHUNK)
    print(f"before the first token: prepare {first['prepare_ms']:.2f} ms, prefill {first['prefill_eager_ms']:.2f} ms "
          f"eager / {_fmt(first['prefill_graph_ms'], '.2f', 0)} ms graph (equal: {first['graph_equals_eager']}), "
          f"offline TTFT {first['ttft_offline_ms']:.2f} ms", flush=True)
    ok &= first["graph_equals_eager"] is not False
    if cfg.profile:
        prof = profile_steps(models, prompt)
        result["profile_ar_b1"], result["profile_oracle_b1"] = prof["ar"], prof["oracle"]
    check = None
    if cfg.spec_modes:
        check = LosslessCheck(models.target, prompt, 2 * measure_path_noise(models, prompt, result))
    with tqdm(total=len(cfg.batches) * len(cfg.modes), desc="ocria bench engine", unit="run",
              disable=None) as progress:  # a bar on a terminal; the row lines either way
        for rows in cfg.batches:
            ok &= bench_batch(cfg, models, prompt, rows, check, bandwidth, result, progress)
    result["hf_baseline"] = run_hf_baselines(cfg, models, prompt)
    result["lossless_ok"] = bool(ok)
    out = write_result(result, cfg.out, plot)
    print_table(result)
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0 if ok else 1
