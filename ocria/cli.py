"""Command lines: ``ocria-build`` (engine, triton-repo) and ``ocria`` (run, serve, client).

User errors (``OcriaError``) print one line and exit 2; nothing is left half-written.
"""

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from ocria.errors import OcriaError


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="HF Qwen3.5 checkpoint directory (default: the preset's weights)")
    p.add_argument("--drafter", help="DFlash/DFlash2 drafter directory (needs --target)")
    p.add_argument("--recipe", help="quantization recipe name or YAML (default: bf16)")
    p.add_argument("--calib", default="synthetic:32", help="calibration set: a directory of images or synthetic:N")
    p.add_argument("--allow-vision-quant", action="store_true", help="let a recipe quantize the vision encoder")
    p.add_argument("--device", default="cpu",
                   help="where a quantized build calibrates and checks accuracy: cpu or cuda (awq_lite and mse "
                        "search NVFP4 scales on cuda only; on cpu they fall back to max)")
    p.add_argument("--preset", default="ocria-mini", help="model preset (configs/presets/NAME.yaml)")
    p.add_argument("--out", default="engines/ocria-mini", help="engine directory to write")
    p.add_argument("--force", action="store_true", help="replace an existing engine directory")
    p.add_argument("--max-batch-size", type=int, help="override the preset's max batch size")
    p.add_argument("--max-seq-len", type=int, help="override the preset's max sequence length")
    p.add_argument("--format-costs", help="format cost table measured on the target GPU (ocria bench formats): "
                                          "recorded in the manifest, and the auto recipe's per-layer candidates")
    p.add_argument("--gpu-arch", help="without --format-costs: the target GPU's architecture for the default "
                                      "cost table (sm_90, sm_100; default: this machine's GPU, else sm_90)")


def cmd_engine(args: argparse.Namespace) -> int:
    from ocria.builder.engine import build_engine

    profile = {k: v for k, v in (("max_batch_size", args.max_batch_size), ("max_seq_len", args.max_seq_len))
               if v is not None}
    out = build_engine(args.out, args.target, args.drafter, args.recipe, args.preset, args.force, args.calib,
                       args.allow_vision_quant, profile, device=args.device, format_costs=args.format_costs,
                       target_arch=args.gpu_arch)
    print(f"engine written to {out}")
    return 0


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True, help="engine directory (from ocria-build engine)")
    p.add_argument("--image", required=True, help="document image file")
    p.add_argument("--prompt", help="instruction (default: transcribe as Markdown)")
    p.add_argument("--mode", choices=("spec", "ar"), default="spec")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--gpu-memory-fraction", type=float, default=0.9,
                   help="share of the GPU the caches may fill (CUDA): sizes the number of sequence slots")
    p.add_argument("--plugins", choices=("auto", "on", "off"), default="auto",
                   help="Triton plugin kernels: auto = on CUDA only (less OCRIA_DISABLE_KERNELS, opt-in ones as "
                        "OCRIA_ENABLE_KERNELS says); on = every kernel, opt-in ones too (CPU: Triton's interpreter); "
                        "off = the PyTorch references. --json prints the resulting execution policy")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")


def cmd_run(args: argparse.Namespace) -> int:
    from ocria.plugins.policy import ExecutionPolicy
    from ocria.runtime import SamplingParams, load_engine

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed, stop=tuple(args.stop), mode=args.mode)
    params.check(max_new_tokens=1 << 30)  # reject bad sampling flags before loading anything
    policy = ExecutionPolicy.from_env(args.plugins)
    engine = load_engine(args.engine, device=args.device, policy=policy, gpu_memory_fraction=args.gpu_memory_fraction)
    resize = engine.processor.resize_of(Path(args.image))  # what the model sees: a page is resized to its budget
    text, ids, final = [], [], None
    for event in engine.generate(Path(args.image), args.prompt, params):
        text.append(event.text)
        ids += event.token_ids
        if not args.json:
            print(event.text, end="", flush=True)
        final = event
    if args.json:
        s = final.stats
        print(json.dumps({"text": "".join(text), "token_ids": ids, "num_steps": s.num_steps,
                          "acceptance_length": round(s.acceptance_length, 4), "tokens_per_s": round(s.tokens_per_s, 2),
                          "finish_reason": final.finish_reason, "mode": s.mode, "plugins": s.plugins,
                          "batch_invariant": s.batch_invariant, "policy": policy.describe(engine.device),
                          "num_draft_tokens": s.num_draft_tokens,
                          "num_accepted_draft_tokens": s.num_accepted_draft_tokens,
                          "image": {"size": list(resize.original), "resized": list(resize.resized)}}))
    else:
        print()
    return 0


def _serving(name: str) -> tuple[Callable, Callable]:
    """A serving command's (add_args, cmd): defining its flags imports nothing optional, so the command is always
    listed; running it names a missing optional dependency (``ocria.deps.require``)."""
    from ocria.serving import commands

    return getattr(commands, f"add_{name}_args"), getattr(commands, f"cmd_{name}")


def _bench_args(p: argparse.ArgumentParser) -> None:
    from ocria.bench import engine, formats, scaling, serve

    sub = p.add_subparsers(dest="bench", required=True)
    engine.add_args(sub.add_parser("engine", help="offline throughput and latency of an engine"))
    serve.add_args(sub.add_parser("serve", help="load generator against a running server"))
    formats.add_args(sub.add_parser("formats", help="format cost table: each format's decode GEMMs on this device"))
    scaling.add_args(sub.add_parser("scaling", help="serving throughput on one GPU against several, both paths"))


def cmd_bench(args: argparse.Namespace) -> int:
    from ocria.bench import engine, formats, scaling, serve

    return {"engine": engine.run, "serve": serve.run, "formats": formats.run, "scaling": scaling.run}[args.bench](args)


def _dispatch(prog: str, commands: dict[str, tuple[str, Callable, Callable]], argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_args, _) in commands.items():
        add_args(sub.add_parser(name, help=help_text))
    args = parser.parse_args(argv)
    try:
        return commands[args.command][2](args)
    except OcriaError as e:
        print(f"{prog} {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog} {args.command}: interrupted", file=sys.stderr)
        return 130


def build_main(argv: list[str] | None = None) -> int:
    commands = {"engine": ("build an engine directory", _engine_args, cmd_engine),
                "triton-repo": ("write a Triton Inference Server model repository for an engine",
                                *_serving("triton_repo"))}
    return _dispatch("ocria-build", commands, argv)


def main(argv: list[str] | None = None) -> int:
    commands = {"run": ("read a document image with an engine", _run_args, cmd_run),
                "serve": ("serve an engine from Triton Inference Server", *_serving("serve")),
                "client": ("send a document to a running server", *_serving("client")),
                "bench": ("benchmark an engine offline, or a running server under load", _bench_args, cmd_bench)}
    return _dispatch("ocria", commands, argv)


if __name__ == "__main__":
    sys.exit(main())
