"""Evaluation through the runtime: greedy CER of the target (``ar``), ``spec`` == ``ar`` per document,
and the drafter's mean acceptance length tau (tokens per target forward in ``spec`` mode), on each evaluation
split separately (``ocria.data.splits``: in-distribution synthetic pages, held-out typefaces, the held-out layout
family, the independent renderer's pages and the same pages at 1-4 megapixels)."""

import io
import tempfile
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm import tqdm

from ocria.builder.presets import Preset
from ocria.data.metrics import edit_distance
from ocria.data.splits import eval_pages
from ocria.errors import OcriaError
from ocria.models import OCRiaForConditionalGeneration
from ocria.runtime.engine import Engine
from ocria.runtime.processor import PreparedPrompt
from ocria.runtime.sampling import SamplingParams
from ocria.train import checkpoint as ckpt
from ocria.train.export import export_model
from ocria.train.gdn_chunked import chunked_gdn
from ocria.train.target import build_target


def split_pngs(split: str, n: int, start: int = 0) -> list[tuple[bytes, str]]:
    """Pages ``start .. start+n-1`` of an evaluation split as (lossless PNG bytes, Markdown truth): what a user
    would send, decoded and resized by the engine's processor."""
    out = []
    for image, truth in eval_pages(split, n, start):
        buf = io.BytesIO()
        image.save(buf, format="PNG", compress_level=1)
        out.append((buf.getvalue(), truth))
    return out


def heldout_pngs(n: int, start: int = 0) -> list[tuple[bytes, str]]:
    """The classic generator's held-out pages (the "classic" split) as (PNG bytes, ground truth) pairs."""
    return split_pngs("classic", n, start)


def transcribe(engine: Engine, images: list[bytes], mode: str, max_tokens: int, batch: int,
               fast_prefill: bool = True, progress: str | None = None) -> list[dict]:
    """Run every image through the engine's scheduler; per request: token ids, text, tau stats. ``progress``: the
    label of a progress bar (pages finished) on stderr; None shows none."""
    sched = engine.scheduler(max_batch_size=batch)
    ctx = chunked_gdn() if fast_prefill else nullcontext()
    rids = {}
    bar = tqdm(total=len(images), desc=progress, unit="page", disable=progress is None, leave=False)
    with ctx, bar:
        for i, image in enumerate(images):
            rids[sched.add(engine.processor.prepare(image), SamplingParams(max_tokens=max_tokens, mode=mode))] = i
        results: list[dict] = [{"tokens": [], "text": ""} for _ in images]
        while sched.has_work():
            for event in sched.step():
                r = results[rids[event.request_id]]
                r["tokens"] += event.token_ids
                r["text"] += event.text
                if event.finished:
                    bar.update()
                    r["steps"] = event.stats.num_steps
                    r["accepted"] = event.stats.num_accepted_draft_tokens
                    r["proposed"] = event.stats.num_draft_tokens
    return results


def doc_edits(results: list[dict], truths: list[str]) -> list[int]:
    """Each document's character edits against its truth."""
    return [edit_distance(r["text"], t) for r, t in zip(results, truths)]


def cer(edits: list[int], truths: list[str]) -> float:
    """Character error rate over the set: total edits / total truth characters."""
    return sum(edits) / max(1, sum(len(t) for t in truths))


def tau(results: list[dict]) -> float:
    """Mean acceptance length: tokens committed per target forward (accepted drafts + the bonus token)."""
    steps = sum(r["steps"] for r in results)
    return 1.0 + sum(r["accepted"] for r in results) / max(1, steps)


def evaluate_splits(engine: Engine, splits: list[str], docs: int, max_tokens: int, batch: int,
                    selector_settings: tuple[bool, ...] = (True, False), progress: bool = False) -> dict[str, dict]:
    """``evaluate`` on the first ``docs`` pages of each split: split name -> its result (``progress``: a bar per
    split and pass on stderr)."""
    return {split: evaluate(engine, split_pngs(split, docs), max_tokens, batch, selector_settings,
                            split if progress else None) for split in splits}


def summary(results: dict[str, dict]) -> dict[str, dict]:
    """Per split: CER (ar), spec == ar, and tau with the drafter's selector on (when there is a drafter)."""
    out = {}
    for split, r in results.items():
        spec = r.get("selector_on") or r.get("selector_off") or {}
        out[split] = {"cer_ar": round(r["cer_ar"], 4), "tau": round(spec["tau"], 3) if spec else None,
                      "spec_equals_ar": spec.get("spec_equals_ar")}
    return out


def evaluate(engine: Engine, docs: list[tuple[bytes, str]], max_tokens: int, batch: int,
             selector_settings: tuple[bool, ...] = (True, False), progress: str | None = None) -> dict:
    """CER (ar; also each document's edits and length), and per selector setting (on: the drafter config's
    threshold): tau, drafts sent for verification per step, CER and spec == ar on every document."""
    images, truths = [d[0] for d in docs], [d[1] for d in docs]
    label = (lambda what: f"{progress}: {what}") if progress is not None else (lambda what: None)
    ar = transcribe(engine, images, "ar", max_tokens, batch, progress=label("ar"))
    edits = doc_edits(ar, truths)
    out = {"docs": len(docs), "cer_ar": cer(edits, truths), "exact_docs_ar": edits.count(0),
           "edits_ar": edits, "chars": [len(t) for t in truths]}  # per document: where the errors are
    drafter = engine.drafter
    if drafter is None:
        return out
    has_selector = drafter.config.selector_head
    for use_selector in selector_settings if has_selector else (False,):
        drafter.config.selector_head = use_selector
        try:
            spec = transcribe(engine, images, "spec", max_tokens, batch,
                              progress=label("spec, selector " + ("on" if use_selector else "off")))
        finally:
            drafter.config.selector_head = has_selector
        key = "selector_on" if use_selector else "selector_off"
        differ = divergences(spec, ar)
        for d in differ[:8]:
            d["logit_gap"] = logit_gap(engine.target, engine.processor.prepare(images[d["doc"]]),
                                       ar[d["doc"]]["tokens"][:d["position"]], d["ar_token"], d["spec_token"])
        out[key] = {
            "tau": tau(spec),
            "drafts_sent_per_step": sum(r["proposed"] for r in spec) / max(1, sum(r["steps"] for r in spec)),
            "spec_equals_ar": not differ,
            "docs_differing": len(differ),
            "first_divergences": differ[:8],
            "cer_spec": cer(doc_edits(spec, truths), truths),
        }
    return out


def _token_at(tokens: list[int], pos: int) -> int | None:
    return tokens[pos] if pos < len(tokens) else None


def divergences(spec: list[dict], ar: list[dict]) -> list[dict]:
    """Per document whose spec tokens differ from ar: the first differing position and both tokens (None past
    the end). On the GPU in bf16 a 16-token verify and a 1-token step round differently, so near-ties can flip;
    this says where."""
    out = []
    for i, (s, a) in enumerate(zip(spec, ar)):
        if s["tokens"] != a["tokens"]:
            pos = next((j for j, (x, y) in enumerate(zip(s["tokens"], a["tokens"])) if x != y),
                       min(len(s["tokens"]), len(a["tokens"])))
            out.append({"doc": i, "position": pos, "spec_token": _token_at(s["tokens"], pos),
                        "ar_token": _token_at(a["tokens"], pos)})
    return out


@torch.no_grad()
def logit_gap(target: OCRiaForConditionalGeneration, prompt: PreparedPrompt, prefix: list[int], a: int | None,
              b: int | None) -> float | None:
    """|logit a - logit b| after the prompt and ``prefix``, from one uncached forward (neither decode path) that
    projects the last position only: a divergence whose gap is within the two paths' rounding noise is a
    floating-point tie, not a lost token. None when either token is missing (past an end)."""
    if a is None or b is None:
        return None
    dev = target.text.embed_tokens.weight.device
    ids = torch.cat([prompt.input_ids, torch.tensor(prefix, dtype=torch.long)])[None].to(dev)
    grid = prompt.image_grid_thw.to(dev)
    positions, _ = target.positions(ids, grid)
    hidden, _ = target.text(target.embed(ids, prompt.pixel_values.to(dev), grid), positions)
    logits = target.logits(hidden[:, -1])[0]
    return float((logits[a] - logits[b]).abs())


def probe_state(state: Path, preset: Preset, docs: int, max_tokens: int, split: str = "synthetic") -> dict:
    """Greedy CER (``ar``, CPU, through the runtime) of a run's newest target on an evaluation split: its exported
    ``target/`` or else its mid-run checkpoint. The early word on whether a run reads, between GPU calls."""
    run = ckpt.read_run(state)
    if run is None:
        raise OcriaError(f"{state}: no {ckpt.RUN_FILE} (not a training state directory)")
    meta = run.get("checkpoint") or {}
    with tempfile.TemporaryDirectory() as tmp:
        target_dir = state / "target"
        if (target_dir / "config.json").is_file():
            step = run["stages"].get("target", {}).get("steps")
        elif meta.get("stage") == "target":
            model = build_target(preset.target, preset.seed)
            ckpt.load_module_tensors(model, "model", ckpt.load_state(state, run))
            target_dir, step = export_model(model, Path(tmp) / "target"), meta["step"]
        else:
            raise OcriaError(f"{state}: no target checkpoint yet (stage {run['stage']!r})")
        engine = Engine(engine_dir(Path(tmp) / "engine", preset.assets, target_dir, None), device="cpu",
                        verify=False)
        pngs = split_pngs(split, docs)
        results = transcribe(engine, [d[0] for d in pngs], "ar", max_tokens, docs)
    truths = [d[1] for d in pngs]
    edits = doc_edits(results, truths)
    return {"target_step": step, "split": split, "docs": docs,
            "cer_ar": cer(edits, truths), "exact_docs_ar": edits.count(0),
            "samples": [{"truth": t, "text": r["text"]} for r, t in zip(results[:4], truths)]}


def engine_dir(root: Path, assets: Path, target: Path, drafter: Path | None) -> Path:
    """An engine-shaped directory (tokenizer, target, drafter) of links to the trained checkpoints."""
    root.mkdir(parents=True, exist_ok=True)
    for name, src in (("tokenizer", assets), ("target", target), ("drafter", drafter)):
        link = root / name
        if link.is_symlink() or link.exists():
            link.unlink()
        if src is not None:
            link.symlink_to(Path(src).resolve(), target_is_directory=True)
    return root
