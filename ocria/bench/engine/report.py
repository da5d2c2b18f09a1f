"""The result: its header and settings, the row lines and batch x mode table printed, the plot."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ocria.bench.engine.config import BenchConfig
from ocria.bench.engine.models import Models
from ocria.bench.results import result_header

if TYPE_CHECKING:
    from ocria.runtime.processor import PreparedPrompt


def start_result(cfg: BenchConfig, models: Models, prompt: PreparedPrompt, bandwidth: float | None) -> dict:
    """The result's header and settings; rows and checks are appended as the run goes."""
    import torch

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
        "plugins": models.policy.kernels.value,
        "disabled_kernels": sorted(models.policy.disabled),
        "enabled_kernels": sorted(models.policy.enabled),
        "pdl": models.policy.pdl,
        "batch_invariant": models.policy.batch_invariant,
        "policy": models.policy.describe(models.device),
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


def fmt(value, spec: str, width: int) -> str:
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
            f"{fmt(row['host_ms_per_step'], '.3f', 6)} ms  tau {row['mean_acceptance_length']:5.2f}  "
            f"{row['tokens_per_s']:9.1f} tok/s  roofline {fmt(row['roofline_fraction'], '.2f', 4)}  "
            f"launches {fmt(launches, 'd', 3)}{check}{'  table ' + table if table else ''}")


# (header, width, format) of print_table's columns, before the forced table's source
TABLE_COLUMNS = (("batch", 5, "d"), ("mode", 8, "s"), ("ms/step", 9, ".3f"), ("host ms", 8, ".3f"),
                 ("tok/s", 10, ".1f"), ("accept", 6, ".2f"), ("nominal", 10, ".1f"), ("roofline", 8, ".2f"),
                 ("launches", 8, "d"), ("spec==ar", 8, "s"))


def table_cells(row: dict) -> list[str]:
    """A result row as print_table's cells, right-aligned in TABLE_COLUMNS' widths (``-``: not measured)."""
    launches, same, _ = _row_parts(row)
    values = (row["batch"], row["mode"], row["step_ms"], row["host_ms_per_step"], row["tokens_per_s"],
              row["mean_acceptance_length"], row["tokens_per_s_nominal"], row["roofline_fraction"], launches,
              {None: "-", True: "ok", False: "VIOLATED"}[same])
    return [f"{'-' if v is None else format(v, spec):>{width}}" for v, (_, width, spec) in zip(values, TABLE_COLUMNS)]


def print_table(result: dict) -> None:
    """The batch x mode table: step time, tokens/s, acceptance length, the spec == ar check."""
    print("\n" + " ".join(f"{name:>{width}}" for name, width, _ in TABLE_COLUMNS) + "  table")
    for r in result["runs"]:
        print(" ".join(table_cells(r)) + f"  {_row_parts(r)[2]}")
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

