"""``python -m ocria.train``: run (resumable, time-boxed), status, ship.

    python -m ocria.train run --state .train --budget-s 510 --out "$OUT"   # repeat until stage 'done'
    python -m ocria.train status --state .train
    python -m ocria.train probe --state .train --docs 8                    # CPU: greedy CER of its target now
    python -m ocria.train ship --state .train                              # into ocria/assets/ocria-mini
    python -m ocria.train eval --engine engines/ocria-mini --docs 64       # per split: CER, tau, spec == ar
"""

import argparse
import json
import sys
from pathlib import Path

from ocria.builder.presets import load_preset
from ocria.data.splits import EVAL_SPLITS, check_splits
from ocria.errors import OcriaError
from ocria.runtime.engine import Engine
from ocria.train import checkpoint as ckpt
from ocria.train.evaluate import evaluate_splits, probe_state, summary
from ocria.train.export import ship
from ocria.train.run import Run, TrainConfig, mirror, utc_now


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ocria.train", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="continue the run in --state until it is done or --budget-s is spent")
    r.add_argument("--state", type=Path, required=True, help="state directory (created on the first call)")
    r.add_argument("--budget-s", type=float, default=510.0, help="seconds of work in this call")
    r.add_argument("--out", type=Path, help="copy the state directory here at the end (e.g. $OUT/train)")
    r.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="training config override (see TrainConfig); on a resumed run it is recorded in run.json")
    r.add_argument("--max-steps", type=int, help="per stage: stop (with a checkpoint) after this many optimizer steps")
    s = sub.add_parser("status", help="print stage, progress and results of a state directory")
    s.add_argument("--state", type=Path, required=True)
    q = sub.add_parser("probe", help="greedy CER of the run's newest target on an evaluation split (CPU)")
    q.add_argument("--state", type=Path, required=True)
    q.add_argument("--preset", default="ocria-mini")
    q.add_argument("--docs", type=int, default=8, help="pages of the split (the first N)")
    q.add_argument("--split", default="synthetic", help=f"evaluation split: one of {', '.join(EVAL_SPLITS)}")
    q.add_argument("--max-tokens", type=int, default=384)
    q.add_argument("--out", type=Path, help="also write the result as JSON (with date and command)")
    p = sub.add_parser("ship", help="copy the trained target/ and drafter/ into the preset's assets")
    p.add_argument("--state", type=Path, required=True)
    p.add_argument("--preset", default="ocria-mini")
    e = sub.add_parser("eval", help="per evaluation split: CER (ar), tau and spec == ar of a built engine")
    e.add_argument("--engine", type=Path, required=True, help="engine directory (ocria-build engine)")
    e.add_argument("--docs", type=int, default=64, help="pages per split (the first N)")
    e.add_argument("--splits", nargs="+", default=list(EVAL_SPLITS), metavar="SPLIT",
                   help=f"evaluation splits (default: all of {', '.join(EVAL_SPLITS)})")
    e.add_argument("--max-tokens", type=int, default=384)
    e.add_argument("--batch", type=int, default=16, help="requests decoded together")
    e.add_argument("--device", default="cpu")
    e.add_argument("--out", type=Path, help="also write the result as JSON (with date and command)")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    try:
        if args.cmd == "run":
            run = Run(args.state, TrainConfig.with_overrides(args.set), args.budget_s, args.device, args.set,
                      args.max_steps, command="python -m ocria.train " + " ".join(argv), out=args.out)
            try:
                result = run.main()
            finally:
                if args.out is not None:
                    for path in mirror(args.state, args.out):
                        print(f"saved {path}")
            print(json.dumps({"stage": result["stage"], "results": result["results"]}, indent=1))
        elif args.cmd == "probe":
            check_splits([args.split])
            result = {"date": utc_now(), "command": "python -m ocria.train " + " ".join(argv),
                      **probe_state(args.state, load_preset(args.preset), args.docs, args.max_tokens, args.split)}
            print(json.dumps(result, indent=1, ensure_ascii=False))
            if args.out is not None:
                ckpt.write_json(args.out, result)
        elif args.cmd == "eval":
            check_splits(args.splits)
            engine = Engine(args.engine, device=args.device)
            splits = evaluate_splits(engine, args.splits, args.docs, args.max_tokens, args.batch, progress=True)
            result = {"date": utc_now(), "command": "python -m ocria.train " + " ".join(argv),
                      "engine": str(args.engine), "device": args.device, "dtype": str(engine.dtype),
                      "docs": args.docs, "summary": summary(splits), "splits": splits}
            print(json.dumps(result, indent=1))
            if args.out is not None:
                ckpt.write_json(args.out, result)
        elif args.cmd == "status":
            run = ckpt.read_run(args.state)
            if run is None:
                raise OcriaError(f"{args.state}: no {ckpt.RUN_FILE} (not a training state directory)")
            last = {k: v[-1] for k, v in run["history"].items() if v}
            print(json.dumps({"stage": run["stage"], "last": last, "stages": run["stages"],
                              "results": run["results"], "calls": len(run["calls"])}, indent=1))
        else:
            state = args.state
            run = ckpt.read_run(state) or {}
            if run.get("stage") != "done":
                raise OcriaError(f"{state}: the run is not done yet (python -m ocria.train status --state {state})")
            kept = ("config", "seeds", "init_target", "init_drafter", "stages", "results", "calls")
            training = {k: run[k] for k in kept if k in run}
            for path in ship(state / "target", state / "drafter", load_preset(args.preset), training):
                print(path)
    except OcriaError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
