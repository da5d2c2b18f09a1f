"""How much of the answer the drafter distillation can train on, by rule and by fixed-point passes.

``ocria.train.distill.greedy_sequences`` labels every answer position with the shipped target's greedy token
after the fed prefix. Two rules for which positions make training samples:
  prefix  only the exact greedy prefix (fed tokens equal to their labels from the answer's start) and the
          label after it: the earlier rule;
  local   any position whose fed token before it is the target's own (slot 1 of a block anchored there;
          longer slots need the block's fed tokens to be its own as well): the rule now.
Each extra pass costs one more target forward per training step. CPU, fp32, the train split's first batch.

    python bench/drafter_labels.py --docs 16 --out bench/results/drafter_labels_cpu.json
"""

import argparse
import datetime as dt
import sys
import time

import torch

from ocria.bench.results import write_json
from ocria.builder.presets import load_preset
from ocria.models import OCRiaForConditionalGeneration
from ocria.train.data import IGNORE, loader
from ocria.train.distill import greedy_sequences
from ocria.train.gdn_chunked import chunked_gdn
from ocria.train.vision_batched import batched_vision


def coverage(seq: torch.Tensor, labels: torch.Tensor, answer: torch.Tensor) -> dict:
    """Shares of the answer tokens (``answer``: positions with a ground-truth label) each rule trains on."""
    known = labels != IGNORE
    own = known & (seq == labels)
    prev_own = torch.zeros_like(own)
    prev_own[:, 1:] = own[:, :-1]
    start = answer.float().argmax(1, keepdim=True)  # each row's first answer position
    after = torch.arange(seq.shape[1])[None] >= start
    run = torch.where(after, own, torch.ones_like(own)).long().cumprod(1).bool() & after  # the exact prefix
    prefix = known & after & torch.cat([torch.ones_like(run[:, :1]), run[:, :-1]], 1)
    total = int(answer.sum())
    return {"prefix": int((prefix & answer).sum()) / total, "local": int((known & prev_own & answer).sum()) / total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--iters", type=int, nargs="+", default=[0, 1, 3])
    ap.add_argument("--preset", default="ocria-mini")
    ap.add_argument("--out", default="bench/results/drafter_labels_cpu.json")
    args = ap.parse_args()
    preset = load_preset(args.preset)
    target = OCRiaForConditionalGeneration.from_pretrained(preset.assets / "target", torch.float32, "cpu")
    target.set_plugins(False)
    batch = next(iter(loader(preset.assets, args.docs, 0, 0)))
    capture = tuple(preset.drafter["dflash_config"]["target_layer_ids"])
    eos = preset.target["text_config"].get("eos_token_id", 2)
    rows = []
    for iters in args.iters:
        t = time.perf_counter()
        with torch.no_grad(), chunked_gdn(64), batched_vision():
            seq, _, labels = greedy_sequences(target, batch, capture, iters, 8, eos)
        answer = torch.zeros_like(labels, dtype=torch.bool)  # answer token positions (batch.labels is shifted)
        answer[:, 1: batch.labels.shape[1] + 1] = batch.labels != IGNORE
        rows.append({"iters": iters, "target_forwards": iters + 1, **coverage(seq, labels, answer),
                     "cpu_s": round(time.perf_counter() - t, 2)})
        print(rows[-1])
    write_json({"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": "cpu",
               "command": " ".join(["python", *sys.argv]), "preset": args.preset, "docs": args.docs,
               "answer_tokens": int(answer.sum()), "rows": rows}, args.out)


if __name__ == "__main__":
    main()
