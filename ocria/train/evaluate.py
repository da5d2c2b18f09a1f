"""Evaluation through the runtime: greedy CER of the target (``ar``), ``spec`` == ``ar`` per document,
and the drafter's mean acceptance length tau (tokens per target forward in ``spec`` mode)."""

import io
from contextlib import nullcontext
from pathlib import Path

from ocria.data import dataset
from ocria.data.metrics import edit_distance
from ocria.runtime.engine import Engine
from ocria.runtime.sampling import SamplingParams
from ocria.train.gdn_chunked import chunked_gdn


def heldout_pngs(n: int, start: int = 0) -> list[tuple[bytes, str]]:
    """The first n held-out documents as (lossless PNG bytes, Markdown truth)."""
    out = []
    for doc in dataset("heldout", n, start):
        buf = io.BytesIO()
        doc.image.save(buf, format="PNG", compress_level=1)
        out.append((buf.getvalue(), doc.markdown))
    return out


def transcribe(engine: Engine, images: list[bytes], mode: str, max_tokens: int, batch: int,
               fast_prefill: bool = True) -> list[dict]:
    """Run every image through the engine's scheduler; per request: token ids, text, tau stats."""
    sched = engine.scheduler(max_batch_size=batch)
    ctx = chunked_gdn() if fast_prefill else nullcontext()
    rids = {}
    with ctx:
        for i, image in enumerate(images):
            rids[sched.add(engine.processor.prepare(image), SamplingParams(max_tokens=max_tokens, mode=mode))] = i
        results: list[dict] = [{"tokens": [], "text": ""} for _ in images]
        while sched.has_work():
            for event in sched.step():
                r = results[rids[event.request_id]]
                r["tokens"] += event.token_ids
                r["text"] += event.text
                if event.finished:
                    r["steps"] = event.stats.num_steps
                    r["accepted"] = event.stats.num_accepted_draft_tokens
                    r["proposed"] = event.stats.num_draft_tokens
    return results


def cer(results: list[dict], truths: list[str]) -> float:
    """Character error rate over the set: total edits / total truth characters."""
    edits = sum(edit_distance(r["text"], t) for r, t in zip(results, truths))
    return edits / max(1, sum(len(t) for t in truths))


def tau(results: list[dict]) -> float:
    """Mean acceptance length: tokens committed per target forward (accepted drafts + the bonus token)."""
    steps = sum(r["steps"] for r in results)
    return 1.0 + sum(r["accepted"] for r in results) / max(1, steps)


def evaluate(engine: Engine, docs: list[tuple[bytes, str]], max_tokens: int, batch: int,
             selector_settings: tuple[bool, ...] = (True, False)) -> dict:
    """CER (ar), and per selector setting (on: the drafter config's threshold): tau, drafts sent for
    verification per step, CER and spec == ar on every document."""
    images, truths = [d[0] for d in docs], [d[1] for d in docs]
    ar = transcribe(engine, images, "ar", max_tokens, batch)
    out = {"docs": len(docs), "cer_ar": cer(ar, truths),
           "exact_docs_ar": sum(r["text"] == t for r, t in zip(ar, truths))}
    drafter = engine.drafter
    if drafter is None:
        return out
    has_selector = drafter.config.selector_head
    for use_selector in selector_settings if has_selector else (False,):
        drafter.config.selector_head = use_selector
        try:
            spec = transcribe(engine, images, "spec", max_tokens, batch)
        finally:
            drafter.config.selector_head = has_selector
        key = "selector_on" if use_selector else "selector_off"
        out[key] = {
            "tau": tau(spec),
            "drafts_sent_per_step": sum(r["proposed"] for r in spec) / max(1, sum(r["steps"] for r in spec)),
            "spec_equals_ar": all(s["tokens"] == a["tokens"] for s, a in zip(spec, ar)),
            "cer_spec": cer(spec, truths),
        }
    return out


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
