#!/usr/bin/env bash
# One device call of the OCRia-mini training run (python -m ocria.train; see ocria/train/run.py).
#
# The state lives in $STATE (default .train/; ignored: echo /.train/ >> .git/info/exclude). Each call resumes it,
# works for BUDGET_S seconds, and mirrors it to $OUT/train (every file <= 15 MiB, <= 8 files).
# Between calls, replace .train with the returned $OUT/train and carry it: run(carry=[".train"]).
# Between calls, `python -m ocria.train probe --state .train` (CPU, seconds) gives the target's greedy CER now.
# Repeat until `python -m ocria.train status --state .train` says stage "done", then
# `python -m ocria.train ship --state .train` copies target/ and drafter/ into ocria/assets/ocria-mini.
# The defaults (ocria/train/run.py TrainConfig) are the plan for ~3 calls: 5600 target steps on every
# document kind, then the drafter with its local-conv-off ablation beside it, and the held-out evaluation. The
# shipped weights did not come from that plan: runs 5 and 6 took 19700 target steps (batch 64, then 256 from
# step 13236) over many calls, with generator and loader fixes made between calls; run 7 started from run 6's
# exported target for 1400 more steps, then trained the 4-layer drafter for 2200 steps (batch 128, 32 anchors,
# one fixed-point pass); run 8 took the target 1500 + 1600 steps further on unseen documents (data_offset, two
# state directories, the second with STATE=.train9) and fine-tuned run 7's drafter 500 steps (init_drafter).
# bench/results/train_h200/README.md records every call's overrides, and SHIPPED.json run 8's last state;
# a from-scratch rerun has not been done.
# Extra arguments go to `python -m ocria.train run` (e.g. --set ablation=false when time is short).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-510}
STATE=${STATE:-.train}
OUT_DIR=${OUT:-/tmp/ocria-train-out}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT_DIR"
$PY - <<'PY'
import torch, transformers
from transformers import Qwen2VLImageProcessorPil  # the runtime's processor must import here
print("torch", torch.__version__, "transformers", transformers.__version__,
      "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))
PY
$PY -m ocria.train run --state "$STATE" --budget-s "$BUDGET_S" --out "$OUT_DIR/train" "$@" 2>&1 | tee "$OUT_DIR/log.txt"
