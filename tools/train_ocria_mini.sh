#!/usr/bin/env bash
# One device call of the OCRia-mini training run (python -m ocria.train; see ocria/train/run.py).
#
# The state lives in $STATE (default .train/; ignored: echo /.train/ >> .git/info/exclude). Each call resumes it,
# works for BUDGET_S seconds, and mirrors it to $OUT/train (every file <= 15 MiB, <= 8 files).
# Between calls, replace .train with the returned $OUT/train and carry it: run(carry=[".train"]).
# Between calls, `python -m ocria.train probe --state .train` (CPU, seconds) gives the target's greedy CER now.
# Repeat until `python -m ocria.train status --state .train` says stage "done", then
# `python -m ocria.train ship --state .train` copies target/ and drafter/ into ocria/assets/ocria-mini.
# The training pages are the READING mixture (ocria/data/config.py; docs/reading_data.md): broad text, many fonts
# and layouts, scan effects, with two font families and one layout family held out for evaluation. The shipped
# weights predate it: they were trained on the classic generator (their last call's settings are the "training"
# record of ocria/assets/ocria-mini/SHIPPED.json). To fine-tune them on the mixture, start from them:
#   STATE=.train_read tools/train_ocria_mini.sh --set init_target=ocria/assets/ocria-mini/target \
#     --set init_drafter=ocria/assets/ocria-mini/drafter --set ablation=false
# then `python -m ocria.train eval --engine DIR` gives CER and acceptance per split.
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
