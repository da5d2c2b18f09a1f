"""The OCRia-mini training run as resumable stages, each call working until its time budget is spent.

State directory (every file <= 15 MiB, at most 7 files, so it round-trips through the GPU machine's
$OUT and travels back as a carried path):
``run.json`` (config, seeds, stage progress, loss history, calls, results), the in-progress stage's
``state-*.safetensors`` shards, and the exported ``target/`` and ``drafter/`` HF directories.

Stages: ``check`` (tokenizer files vs a fresh build, data deterministic, held-out typefaces disjoint from
training's) -> ``target`` -> ``drafter`` (local conv + selector on, exported; with ``ablation``, a local-conv-off
drafter trained beside it on the same batches) -> ``drafter_noconv`` (the ablation's tau on the first evaluation
split; not shipped) -> ``eval`` (per evaluation split: CER, spec == ar, tau per selector setting; a call that runs
out of time leaves the remaining splits to the next) -> ``done``.
"""

import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

import torch

from ocria.builder.presets import load_preset
from ocria.data import READING, generate, split_seeds
from ocria.data import tokenizer as tokenizer_files
from ocria.data.config import HELDOUT_LAYOUTS
from ocria.data.fonts import split_files
from ocria.data.splits import EVAL_SPLITS, check_splits
from ocria.errors import OcriaError
from ocria.models import OCRiaForConditionalGeneration
from ocria.runtime.engine import Engine
from ocria.runtime.processor import Processor
from ocria.train import checkpoint as ckpt
from ocria.train.data import image_swap_pair, loader
from ocria.train.distill import block_forward, build_drafter, drafter_loss, greedy_sequences, sample_blocks
from ocria.train.evaluate import engine_dir, evaluate, evaluate_splits, split_pngs, summary
from ocria.train.export import export_model, load_exported, shipped_bytes
from ocria.train.gdn_chunked import chunked_gdn
from ocria.train.optim import FlatAdamW, lr_at, set_lr
from ocria.train.target import build_target, image_reliance, target_loss
from ocria.train.vision_batched import batched_vision

STAGES = ("check", "target", "drafter", "drafter_noconv", "eval", "done")


@dataclass
class TrainConfig:
    preset: str = "ocria-mini"
    seed: int = 0
    block_size: int = 16  # drafter block (tau is quoted at block 16)
    target_steps: int = 5600  # 0: as many as fit in target_minutes (timed in the first call)
    target_minutes: float = 13.0
    line_steps: int = 0  # curriculum: the target's first steps read single lines only, then every kind. Off:
    # 1700-2500 line steps never made the target use the image; it began to read only once it trained on whole
    # pages
    target_batch: int = 64
    target_lr: float = 1.5e-3
    target_warmup: int = 300
    init_target: str = ""  # an HF target directory (e.g. ocria/assets/ocria-mini/target) to start from instead of
    # the seeded init: a further run of a trained target, with its own schedule; a resumed checkpoint still wins
    init_drafter: str = ""  # the same for the shipped drafter (an HF drafter directory); needs ablation=false: an
    # ablation drafter trained from scratch beside it would not differ from it by the extension only
    data_offset: int = 0  # the train split from this document on: a further run reads documents earlier runs did not
    drafter_steps: int = 0  # 0: as many as fit in drafter_minutes
    drafter_minutes: float = 2.0
    ablation: bool = True  # also train a local-conv-off drafter, beside the shipped one, for its tau
    drafter_batch: int = 32
    drafter_lr: float = 1e-3
    drafter_warmup: int = 100
    drafter_layers: int = 0  # drafter depth (both drafters); 0 = the preset's
    anchors: int = 16
    fixed_point_iters: int = 3
    slack: int = 8
    selector_weight: float = 0.2
    selector_threshold: float = 0.5  # exported drafter's threshold (the "selector on" evaluation)
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    gdn_chunk: int = 64
    workers: int = 12
    data_kind: str = ""  # train on one document kind only (ocria.data.KINDS); "" = every kind
    eval_docs: int = 64  # per evaluation split
    eval_splits: str = ",".join(EVAL_SPLITS)  # comma-separated (ocria.data.splits.EVAL_SPLITS)
    eval_batch: int = 32
    eval_max_tokens: int = 384
    eval_graphs: str = "auto"  # runtime CUDA graphs in evaluation: auto (runtime default), on, off
    log_every: int = 25
    save_every_s: float = 240.0

    @classmethod
    def with_overrides(cls, pairs: list[str]) -> "TrainConfig":
        cfg = cls()
        names = [f.name for f in fields(cls)]
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or key not in names:
                raise OcriaError(f"bad --set {pair!r}: expected KEY=VALUE with KEY one of {', '.join(names)}")
            kind = type(getattr(cfg, key))
            try:
                if kind is bool and value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                setattr(cfg, key, value.lower() in ("true", "1") if kind is bool else kind(value))
            except ValueError:
                raise OcriaError(f"bad --set {pair!r}: {value!r} is not a {kind.__name__}") from None
        if cfg.init_drafter and cfg.ablation:
            raise OcriaError("--set init_drafter needs --set ablation=false: the local-conv-off drafter would start "
                             "from scratch beside it, so their taus would not measure the extension alone")
        if cfg.data_offset < 0:
            raise OcriaError(f"bad --set data_offset={cfg.data_offset}: expected a document index >= 0")
        if cfg.drafter_layers < 0:  # 0 is the preset's depth; a negative one would build a drafter of no layers
            raise OcriaError(f"bad --set drafter_layers={cfg.drafter_layers}: expected 0 (the preset's) or more")
        cfg.splits()
        return cfg

    def splits(self) -> list[str]:
        """The evaluation splits, checked."""
        names = [s.strip() for s in self.eval_splits.split(",") if s.strip()]
        if not names:
            raise OcriaError(f"eval_splits names no evaluation split; choose from {', '.join(EVAL_SPLITS)}")
        return check_splits(names)


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Run:
    """One call's work on a state directory: resume where the last call stopped, stop at the deadline."""

    def __init__(self, state: Path, cfg: TrainConfig, budget_s: float, device: str | None = None,
                 overrides: list[str] = (), max_steps: int | None = None, command: str | None = None,
                 out: Path | None = None):
        self.state = Path(state)
        self.t0 = time.time()
        self.deadline = self.t0 + budget_s
        self.max_steps = max_steps  # optimizer steps per stage in this call, then checkpoint and stop
        self.out = out  # mirrored after every checkpoint and stage: a call killed at its limit loses little
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        run = ckpt.read_run(self.state)
        if run is None:
            run = {"version": 1, "config": asdict(cfg), "stage": "check", "checkpoint": None, "stages": {},
                   "history": {}, "calls": [], "results": {}}
        self.run = run
        # The first call's config is kept; a later call's --set changes are applied and recorded.
        changed = {}
        if run["calls"]:
            base = TrainConfig(**run["config"])
            for pair in overrides:
                key = pair.partition("=")[0]
                changed[key] = getattr(cfg, key)
                setattr(base, key, getattr(cfg, key))
            run["config"] = asdict(base)
        self.cfg = TrainConfig(**run["config"])
        self.preset = load_preset(self.cfg.preset)
        torch.manual_seed(self.cfg.seed)
        if self.device.type == "cuda":
            torch.set_float32_matmul_precision("high")
        run["seeds"] = {"config": self.cfg.seed, "target_init": self.preset.seed, "drafter_init": self.preset.seed + 1,
                        "anchor_sampler": self.cfg.seed + 17, "data": "train split documents in index order"}
        self.call = {"command": command or " ".join(sys.argv), "start_utc": utc_now(),
                     "device": self._device_name(), "torch": torch.__version__,
                     "python": platform.python_version(), "stage_at_start": run["stage"], "config_changes": changed}

    def _device_name(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else platform.processor() or "cpu"

    def left(self) -> float:
        return self.deadline - time.time()

    def autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda")

    def save_run(self) -> None:
        ckpt.write_json(self.state / ckpt.RUN_FILE, self.run)
        self.sync()

    def sync(self) -> None:
        if self.out is not None:
            mirror(self.state, self.out)

    def log(self, msg: str) -> None:
        print(f"[{time.time() - self.t0:7.1f}s] {msg}", flush=True)

    # -- stages -----------------------------------------------------------------------------------

    def main(self) -> dict:
        try:
            while self.run["stage"] != "done" and self.left() > 0:
                stage = self.run["stage"]
                finished = getattr(self, f"stage_{stage}")()
                if not finished:
                    break
                self.run["stage"] = STAGES[STAGES.index(stage) + 1]
                self.save_run()
        finally:
            self.call["wall_s"] = round(time.time() - self.t0, 1)
            self.call["stage_at_end"] = self.run["stage"]
            self.run["calls"].append(self.call)
            self.save_run()
        return self.run

    def stage_check(self) -> bool:
        """Tokenizer files against a fresh build (recorded: BPE training may differ across ``tokenizers``
        versions, and training always uses the shipped files); documents deterministic; splits disjoint."""
        import tokenizers

        t = time.time()
        stale = [n for n, text in tokenizer_files.files().items()
                 if (self.preset.assets / n).read_text("utf-8") != text]
        seed = split_seeds("train", 1)[0]
        a, b = generate(seed, None, READING), generate(seed, None, READING)
        if a.markdown != b.markdown or a.image.tobytes() != b.image.tobytes():
            raise OcriaError("synthetic documents are not deterministic")
        train, held = split_seeds("train", 1 << 30), split_seeds("heldout", 1)
        if held[0] in train:
            raise OcriaError("held-out seeds overlap the train split")
        if split_files("train") & split_files("heldout") or READING.fonts != "train" or \
                set(HELDOUT_LAYOUTS) & set(READING.layouts):
            raise OcriaError("the training mixture draws a held-out typeface or layout family")
        self.run["stages"]["check"] = {
            "tokenizer": f"differs from a fresh build: {stale}" if stale else "matches a fresh build",
            "tokenizers_version": tokenizers.__version__,
            "data": "deterministic, held-out seeds, typefaces and layout family disjoint from training's",
            "wall_s": round(time.time() - t, 1)}
        self.log(f"check: {self.run['stages']['check']}")
        return True

    def _batches(self, batch_size: int, start: int, line_steps: int):
        """The train split from batch ``start`` on: single lines while ``step < line_steps`` (a curriculum:
        lines are the easy case of reading), then ``data_kind`` (every kind by default)."""
        cfg, assets = self.cfg, self.preset.assets
        if start < line_steps and not cfg.data_kind:
            lines = loader(assets, batch_size, start, cfg.workers, kind="line", first_doc=cfg.data_offset)
            yield from (batch for _, batch in zip(range(line_steps - start), lines))
            del lines  # its workers stop before the next loader's start
            start = line_steps
        yield from loader(assets, batch_size, start, cfg.workers, kind=cfg.data_kind or None,
                          first_doc=cfg.data_offset)

    def _loop(self, name: str, model: torch.nn.Module, steps_key: str, minutes: float, batch_size: int, lr: float,
              warmup: int, loss_fn, line_steps: int = 0) -> bool:
        """Shared resumable loop: AdamW + cosine, grad clipping, time-boxed, checkpoint on exit.

        A stage configured with 0 steps gets ``minutes`` of training: its first call times the steps of the
        warmup's last three quarters (the first steps wait for the data workers and the kernels' first
        launches: on the H200 a drafter stage timed 2.3 steps/s over steps 5-39 and then ran at 3.7), then fixes
        the total (recorded in run.json) before warmup ends, so the cosine schedule is known from then on and
        identical in every later call. A call that stops inside the warmup before that (say at step 56 of 100)
        leaves the timing to the next call, over what is left of the warmup.
        """
        cfg = self.cfg
        steps = getattr(cfg, steps_key)  # 0: not yet fixed (the first call times it, below)
        opt = FlatAdamW(model, lr, cfg.weight_decay)
        sampler = torch.Generator().manual_seed(cfg.seed + 17)
        step = 0
        meta = self.run.get("checkpoint") or {}
        if meta.get("stage") == name:
            tensors = ckpt.load_state(self.state, self.run)
            ckpt.load_module_tensors(model, "model", tensors)
            opt.load_state_tensors("opt", tensors)
            ckpt.restore_rng(tensors, sampler)
            step = meta["step"]
            self.log(f"{name}: resumed at step {step}")
        history = self.run["history"].setdefault(name, [])
        timing_at = max(step + 10, warmup - 1)
        timing_from = step + max(5, (timing_at - step) // 4)
        if steps <= 0 and timing_at >= warmup:
            raise OcriaError(f"{name}: {warmup - step} warmup steps are left, too few to time the steps before the "
                             f"warmup ends (>= 11): set --set {steps_key}=N")
        last_save = time.time()
        t_start, step_start = time.time(), step
        skipped = bad_run = torch.zeros((), dtype=torch.int64, device=self.device)  # on the GPU: read at log time
        waited = 0.0  # seconds the loop spent waiting for the data workers since the last log line
        t_body_end = t_waited_from = time.perf_counter()

        def save() -> None:
            tensors = ckpt.module_tensors("model", model)
            tensors.update(opt.state_tensors("opt"))
            tensors.update(ckpt.rng_tensors(sampler))
            self.run["checkpoint"] = {"stage": name, "step": step, "cursor": step}
            ckpt.save_state(self.state, self.run, tensors, f"{name}-{step}")
            self.sync()
            self.log(f"{name}: checkpoint at step {step}")

        parts = model.values() if isinstance(model, torch.nn.ModuleDict) else [model]  # each clipped on its own
        if steps <= 0 or step < steps:
            for batch in self._batches(batch_size, step, line_steps):
                waited += time.perf_counter() - t_body_end
                cur_lr = lr_at(step, max(steps, warmup + 1), lr, warmup)
                set_lr(opt, cur_lr)
                with self.autocast(), chunked_gdn(cfg.gdn_chunk), batched_vision():
                    loss, stats = loss_fn(batch.to(self.device), sampler)
                opt.zero_grad()
                loss.backward()
                norms = [torch.nn.utils.clip_grad_norm_(p.parameters(), cfg.grad_clip) for p in parts]
                gnorm = torch.stack(norms).max()
                finite = torch.isfinite(gnorm)  # a non-finite batch must not poison the weights
                opt.step(finite)
                skipped, bad_run = skipped + ~finite, (bad_run + 1) * ~finite
                step += 1
                if step == timing_from:
                    t_timing = time.time()
                if steps <= 0 and step == timing_at:
                    rate = (step - timing_from) / (time.time() - t_timing)
                    steps = max(step + 1, int(rate * minutes * 60))
                    setattr(self.cfg, steps_key, steps)
                    self.run["config"][steps_key] = steps
                    self.call.setdefault("config_changes", {})[steps_key] = steps
                    self.log(f"{name}: {rate:.2f} steps/s -> {steps} steps for {minutes} min")
                if step % cfg.log_every == 0 or step == steps:
                    if int(bad_run) >= 20:
                        raise OcriaError(f"{name}: {int(bad_run)} steps in a row with a non-finite gradient (to step "
                                         f"{step}): lower the learning rate and resume from the last checkpoint")
                    if int(skipped):
                        self.run["stages"][f"{name}_skipped"] = int(skipped)
                    rate = (step - step_start) / (time.time() - t_start)
                    now = time.perf_counter()  # the share of wall time the GPU loop sat waiting for batches
                    data_wait, waited, t_waited_from = waited / max(now - t_waited_from, 1e-9), 0.0, now
                    history.append({"step": step, "loss": round(loss.item(), 5), "lr": cur_lr,
                                    "grad_norm": round(float(gnorm), 4), "steps_per_s": round(rate, 3),
                                    "data_wait": round(data_wait, 3), "skipped": int(skipped),
                                    **{k: round(v, 5) for k, v in stats.items()}})
                    self.log(f"{name} step {step}/{steps} loss {loss.item():.4f} lr {cur_lr:.2e} "
                             f"{rate:.2f} it/s data wait {data_wait:.0%} {stats}")
                if step == steps:
                    break
                stop = self.left() < 45 or (self.max_steps is not None and step - step_start >= self.max_steps)
                if stop or time.time() - last_save > cfg.save_every_s:
                    save()
                    last_save = time.time()
                    if stop:
                        return False
                t_body_end = time.perf_counter()
        self.run["stages"][name] = {"steps": step, "final_loss": history[-1]["loss"] if history else None,
                                    "finished_utc": utc_now()}
        return True

    def stage_target(self) -> bool:
        cfg = self.cfg
        model = build_target(self.preset.target, self.preset.seed)
        if cfg.init_target:
            self.run["init_target"] = load_exported(model, Path(cfg.init_target), "init_target")
            self.log(f"target: initialized from {cfg.init_target}")
        model = model.to(self.device)
        docs = [generate(seed, "line") for seed in split_seeds("heldout", 16)]
        pair = [b.to(self.device) for b in image_swap_pair(Processor(self.preset.assets), docs)]
        calls, stats = 0, {}

        def loss_fn(batch, _sampler):  # logs the latest image reliance (held-out lines, every 100 steps)
            nonlocal calls
            if calls % 100 == 0:
                with self.autocast(), chunked_gdn(cfg.gdn_chunk), batched_vision():
                    stats["image_gap"] = image_reliance(model, *pair)
            calls += 1
            return target_loss(model, batch), stats

        if not self._loop("target", model, "target_steps", cfg.target_minutes, cfg.target_batch, cfg.target_lr,
                          cfg.target_warmup, loss_fn, line_steps=cfg.line_steps):
            return False
        export_model(model, self.state / "target")
        ckpt.drop_state(self.state, self.run)
        self.log(f"target exported to {self.state / 'target'}")
        if self.left() > 90:  # early word on whether it reads, before drafter time is spent
            with self._engine(None) as engine:
                quick = evaluate_splits(engine, cfg.splits(), min(16, cfg.eval_docs), cfg.eval_max_tokens,
                                        cfg.eval_batch)
            self.run["stages"]["target"]["heldout_cer_quick"] = summary(quick)
            self.log(f"target quick eval: {summary(quick)}")
        return True

    def _trained_target(self) -> OCRiaForConditionalGeneration:
        target = OCRiaForConditionalGeneration.from_pretrained(self.state / "target", torch.float32, self.device)
        for p in target.parameters():
            p.requires_grad_(False)
        return target

    def _drafter_cfg(self, local_conv: bool) -> dict:
        d = dict(self.preset.drafter, block_size=self.cfg.block_size)
        if self.cfg.drafter_layers:
            d["num_hidden_layers"] = self.cfg.drafter_layers
        d["dflash_config"] = dict(d.get("dflash_config", {}), selector_head=True,
                                  selector_threshold=self.cfg.selector_threshold)
        if not local_conv:
            d["dflash_config"]["local_conv_kernel"] = 0
        return d

    def _train_drafters(self) -> torch.nn.ModuleDict | None:
        """The shipped drafter and, with ``ablation``, a local-conv-off one, trained on the same batches.

        The target's greedy passes are most of a step and are shared, so the ablation costs little; both
        see identical data, and each is clipped on its own, so the shipped drafter trains exactly as it
        would alone and the two taus differ by the extension only.
        """
        cfg = self.cfg
        target = self._trained_target()
        variants = {"drafter": True, "drafter_noconv": False} if cfg.ablation else {"drafter": True}
        drafters = torch.nn.ModuleDict({name: build_drafter(self._drafter_cfg(conv), target, self.preset.seed + 1)
                                        for name, conv in variants.items()}).to(self.device)
        if cfg.init_drafter:
            start = load_exported(drafters["drafter"], Path(cfg.init_drafter), "init_drafter", target)
            self.run["init_drafter"] = start
            self.log(f"drafter: initialized from {cfg.init_drafter}")
        config = drafters["drafter"].config
        capture = tuple(config.target_layer_ids)
        eos = self.preset.target["text_config"].get("eos_token_id", 2)

        def loss_fn(batch, sampler):
            seq, feats, labels = greedy_sequences(target, batch, capture, cfg.fixed_point_iters, cfg.slack, eos)
            anchors, ids, blabels = sample_blocks(seq, labels, cfg.anchors, config.block_size, config.mask_token_id,
                                                  sampler)
            total, stats = 0.0, {}
            for name, drafter in drafters.items():  # the logged loss is the sum; stats name each drafter
                loss, part = drafter_loss(*block_forward(drafter, feats, anchors, ids), blabels, cfg.selector_weight)
                total = total + loss
                stats.update(part if name == "drafter" else {f"noconv_{k}": v for k, v in part.items()})
            return total, stats

        if not self._loop("drafter", drafters, "drafter_steps", cfg.drafter_minutes, cfg.drafter_batch,
                          cfg.drafter_lr, cfg.drafter_warmup, loss_fn):
            return None
        return drafters

    def stage_drafter(self) -> bool:
        drafters = self._train_drafters()
        if drafters is None:
            return False
        for name, drafter in drafters.items():
            export_model(drafter, self.state / name)
        ckpt.drop_state(self.state, self.run)
        return True

    @contextmanager
    def _engine(self, drafter_dir: Path | None) -> Iterator[Engine]:
        """The run's target (and ``drafter_dir``'s drafter) as a runtime engine (links in a temp engine dir)."""
        with tempfile.TemporaryDirectory() as tmp:
            root = engine_dir(Path(tmp), self.preset.assets, self.state / "target", drafter_dir)
            graphs = {"on": {"use_graphs": True}, "off": {"use_graphs": False}}.get(self.cfg.eval_graphs, {})
            yield Engine(root, device=str(self.device), verify=False, **graphs)

    def stage_drafter_noconv(self) -> bool:
        """Ablation: tau of the local-conv-off drafter trained in the drafter stage, on the first evaluation split
        (then deleted: not shipped)."""
        out = self.state / "drafter_noconv"
        if not (out / "config.json").is_file():  # ablation off
            return True
        if self.left() < 120:  # the evaluation does not split across calls: the next call does it
            return False
        split = self.cfg.splits()[0]
        with self._engine(out) as engine:
            res = evaluate(engine, split_pngs(split, self.cfg.eval_docs), self.cfg.eval_max_tokens,
                           self.cfg.eval_batch)
        self.run["results"]["local_conv_off"] = {"split": split,
                                                 **{k: v for k, v in res.items() if k.startswith("selector")}}
        shutil.rmtree(out)
        return True

    def stage_eval(self) -> bool:
        """Each evaluation split in turn (CER, spec == ar, tau per selector setting), saved as it finishes; a call
        with under two minutes left leaves the remaining splits to the next."""
        cfg, done = self.cfg, self.run["results"].setdefault("splits", {})
        with self._engine(self.state / "drafter") as engine:
            for split in cfg.splits():
                if split in done:
                    continue
                if self.left() < 120:
                    return False
                t = time.time()
                res = evaluate(engine, split_pngs(split, cfg.eval_docs), cfg.eval_max_tokens, cfg.eval_batch)
                res["local_conv_on"] = {k: res.pop(k) for k in list(res) if k.startswith("selector")}
                res["wall_s"] = round(time.time() - t, 1)
                done[split] = res
                self.save_run()
                self.log(f"eval {split}: cer {res['cer_ar']:.4f} "
                         f"tau {res['local_conv_on'].get('selector_on', {}).get('tau')}")
        self.run["results"].update(docs=cfg.eval_docs, block_size=cfg.block_size, device=self._device_name(),
                                   shipped_bytes=shipped_bytes(self.state / "target", self.state / "drafter"))
        return True


def mirror(state: Path, out: Path) -> list[Path]:
    """Make ``out`` a copy of the state directory (run.json, shards, target/, drafter/) for the next
    call: changed files are copied, files no longer in the state are removed."""
    out.mkdir(parents=True, exist_ok=True)
    copied = []
    for src in sorted(state.rglob("*")):
        rel = src.relative_to(state)
        if src.is_dir() or src.is_symlink() or any(part.startswith(".") for part in rel.parts):
            continue
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        st = src.stat()
        if not dst.is_file() or dst.stat().st_size != st.st_size or dst.stat().st_mtime != st.st_mtime:
            shutil.copy2(src, dst)
        copied.append(dst)
    for stale in sorted(out.rglob("*"), reverse=True):
        if stale.is_file() and stale not in copied:
            stale.unlink()
        elif stale.is_dir() and not any(stale.iterdir()):
            stale.rmdir()
    return copied
