"""The run's checks: spec-family tokens equal ``ar``'s (ties within the measured path noise allowed), forced tokens
equal their table, and the fp32 run of the forced modes (CUDA)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ocria.bench.engine.config import PREFILL_CHUNK, BenchConfig, Mode
from ocria.bench.engine.decode import RunRow, time_mode
from ocria.bench.engine.models import Models, load_models
from ocria.bench.engine.oracle import check_table, first_mismatch, new_table

if TYPE_CHECKING:
    from torch import Tensor

    from ocria.plugins.policy import ExecutionPolicy
    from ocria.runtime.processor import PreparedPrompt

FP32_TAU = 8.0  # the fp32 check's forced-acceptance mode (with oracle), capped at the block size


@dataclass
class LosslessCheck:
    """spec against ar for one model and prompt; a divergence is tolerated only at a tie: where ar's logit gap
    between the two tokens is within ``tie_margin`` (the measured path noise)."""

    target: Any
    prompt: PreparedPrompt
    tie_margin: float

    def __post_init__(self):
        self._gaps: dict[tuple, float | None] = {}

    def margin(self, ar: list[int], spec: list[int], i: int) -> float | None:
        """Logit gap between ar's and spec's token at generated index i, from a fresh full forward (cached:
        rows with the same prompt diverge identically)."""
        from ocria.train.evaluate import logit_gap

        key = (tuple(ar[:i]), ar[i], spec[i])
        if key not in self._gaps:
            self._gaps[key] = logit_gap(self.target, self.prompt, list(key[0]), key[1], key[2])
        return self._gaps[key]

    def __call__(self, ar_tokens: list[list[int]], spec_tokens: list[list[int]]) -> tuple[bool, list[dict]]:
        """Compare each row up to the shorter length.

        Args:
            ar_tokens: each row's ``ar`` tokens.
            spec_tokens: each row's tokens in a spec-family mode.
        Returns:
            (every row equal or diverging at a tie, one report entry per row).
        """
        report = []
        for r, (a, s) in enumerate(zip(ar_tokens, spec_tokens)):
            n = min(len(a), len(s))
            diff = first_mismatch(a, s)
            entry = {"row": r, "compared": n, "first_divergence": diff}
            if diff is not None:
                entry["logit_gap"] = self.margin(a, s, diff)
                entry["tie"] = entry["logit_gap"] is not None and entry["logit_gap"] <= self.tie_margin
            report.append(entry)
        return all(x["first_divergence"] is None or x["tie"] for x in report), report


def step_logits(target, prompt: PreparedPrompt, tokens: list[int], chunk: int, policy: ExecutionPolicy) -> Tensor:
    """Logits of ``tokens`` teacher-forced after ``prompt``'s prefill, in decode steps of ``chunk`` tokens.

    Args:
        target: the target model.
        prompt: the document prompt, prefilled first.
        tokens: n token ids fed after it.
        chunk: tokens per step (1: the ar path; the block size: the verify path).
        policy: the execution policy of the forwards (not a decode step's: the steps are not batch-invariant).
    Returns:
        [1, n rounded up to a multiple of ``chunk``, V] logits, one per fed position.
    """
    import torch

    from ocria.models import TargetCache
    from ocria.runtime.decode import prefill

    cfg = target.text_config
    L, n = prompt.input_ids.numel(), len(tokens)
    embed = target.text.embed_tokens.weight
    with torch.no_grad():
        cache = TargetCache.allocate(cfg, 1, L + n + chunk, chunk, embed.dtype, embed.device)
        prefill(target, None, cache, None, 0, prompt, chunk=PREFILL_CHUNK, policy=policy)
        slot = torch.zeros(1, dtype=torch.long, device=embed.device)
        ids = torch.tensor(tokens, device=embed.device)[None]
        out = []
        for s in range(0, n, chunk):
            index = cache.kv_len[slot].long()[:, None] + torch.arange(chunk, device=embed.device)
            pos = (index + cache.rope_delta[slot][:, None]).expand(3, 1, chunk)
            hidden, _ = target.forward_cached(target.text.embed_tokens(ids[:, s:s + chunk]), pos, cache, slot,
                                              "verify", attn_len=L + n, policy=policy)
            cache.commit(slot, torch.full((1,), chunk, device=embed.device))
            out.append(target.logits(hidden, policy))
        return torch.cat(out, 1)


def path_noise(target, prompt: PreparedPrompt, tokens: list[int], block: int, policy: ExecutionPolicy) -> float:
    """Max |logit| difference between the ar path (T=1 steps) and the verify path (one T=block step)
    on the same teacher-forced tokens: how far apart the two computations are in this precision."""
    tokens = tokens[:block]
    ar, verify = (step_logits(target, prompt, tokens, t, policy) for t in (1, block))
    return float((ar - verify).abs().max())


def record_table_check(result: dict, table: Tensor, start: int, tokens: list[list[int]], row: RunRow,
                       precision: str) -> bool:
    """Forced mode: the timed tokens must equal the table they were forced from; stored in ``result``."""
    ok, report = check_table(table, start, tokens)
    result["table_checks"].append({"precision": precision, "batch": row.batch, "mode": row.mode, "ok": ok,
                                   "table_source": row.table_source, "oracle_passes": row.oracle_passes,
                                   "oracle_converged": row.oracle_converged,
                                   "table_first_rewrite": row.table_first_rewrite, "rows": report})
    if not ok:
        print(f"B={row.batch} {row.mode} ({precision}): timed tokens differ from the oracle table", flush=True)
    return ok


def fp32_check(cfg: BenchConfig, prompt: PreparedPrompt, result: dict) -> bool:
    """spec == ar on the same weights in fp32 (oracle and tau=8), where no tie should flip (CUDA's bf16 runs)."""
    import torch

    models = load_models(cfg, torch.float32, plain=True)
    rows = cfg.fp32_check
    L = prompt.input_ids.numel()
    table = new_table(rows, L, cfg.tokens, models.block, models.device)
    check = LosslessCheck(models.target, prompt, 1e-3)
    _, ar = time_mode(models, prompt, rows, Mode("ar"), table, cfg.tokens)
    ok_all, source = True, "ar"
    tau = min(FP32_TAU, float(models.block))
    for mode in (Mode("oracle"), Mode(f"tau={tau:g}", tau)):
        row, spec = time_mode(models, prompt, rows, mode, table, cfg.tokens, source)
        source = row.table_source
        ok, report = check(ar, spec)
        ok_all &= ok & record_table_check(result, table, L, spec, row, "fp32")
        result["lossless"].append({"precision": "fp32", "batch": rows, "mode": mode.name, "ok": ok,
                                   "mean_acceptance_length": row.mean_acceptance_length, "rows": report})
        print(f"fp32 {mode.name}: lossless {ok}, tau {row.mean_acceptance_length:.2f}, "
              f"table {source} after {row.oracle_passes} passes", flush=True)
    del models
    torch.cuda.empty_cache()
    return ok_all


def measure_path_noise(models: Models, prompt: PreparedPrompt, result: dict) -> float:
    """The ar/verify path noise in the run's precision: the spec == ar check's tie margin is twice it."""
    noise = path_noise(models.target, prompt, [1 + i for i in range(16)], models.block, models.policy)
    result["path_noise"] = noise
    print(f"{result['dtype']} logit noise between ar and verify paths: {noise:.4g}", flush=True)
    return noise

