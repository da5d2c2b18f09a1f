"""The run: load, check in fp32 (CUDA), measure the path noise, time every (batch, mode), write result and plot."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import TYPE_CHECKING

from ocria.bench.engine.checks import LosslessCheck, fp32_check, measure_path_noise, record_table_check
from ocria.bench.engine.config import PREFILL_CHUNK, BenchConfig, config_from_args
from ocria.bench.engine.decode import time_mode
from ocria.bench.engine.hf import run_hf_baselines
from ocria.bench.engine.models import Models, check_modes, document, load_models, prepare_prompt
from ocria.bench.engine.oracle import new_table
from ocria.bench.engine.profile import profile_steps
from ocria.bench.engine.report import fmt, plot, print_table, row_line, start_result
from ocria.bench.engine.roofline import add_roofline
from ocria.bench.results import write_json, write_result

if TYPE_CHECKING:
    from ocria.runtime.processor import PreparedPrompt


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
          f"eager / {fmt(first['prefill_graph_ms'], '.2f', 0)} ms graph (equal: {first['graph_equals_eager']}), "
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
