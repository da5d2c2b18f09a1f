"""Forced acceptance: the drafter whose drafts come from an oracle table, and the table's fixed point."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ocria.bench.engine.config import Mode

if TYPE_CHECKING:
    from torch import Tensor


class ForcedDrafter:
    """The real drafter runs; its proposals are replaced from an oracle table (graph-safe).

    ``table[slot, pos]`` is the wanted token at position ``pos``; the graph reads it in place, so the
    fixed-point passes rewrite it without a new capture. With ``tau`` the first k drafts stay right and
    the rest are made wrong, k counting uniforms under (tau - 1) / n drawn once per (slot, position):
    the same table gives the same schedule, as the fixed point needs.
    """

    def __init__(self, real, table: Tensor, tau: float | None, seed: int = 0):
        """Args:
            real: the drafter (its ``config.block_size`` B sets n = B - 1 drafts a step).
            table: [slots, width] long, the wanted token of each slot and position.
            tau: ``tau=X``'s mean acceptance length, or None (oracle: every draft right).
            seed: the uniforms' seed, drawn once as [slots, width, n].
        """
        import torch

        self.real, self.table, self.tau = real, table, tau
        n = real.config.block_size - 1
        gen = torch.Generator(table.device).manual_seed(seed)
        self.draws = torch.rand(*table.shape, n, generator=gen, device=table.device) if tau is not None else None

    def __getattr__(self, name):
        return getattr(self.real, name)

    def verify_budget(self, conf: Tensor) -> Tensor | None:
        """Every forced draft goes to verification: the selector still runs (its cost stays in the
        step), its cut does not apply (a threshold would otherwise cap the forced acceptance).

        Args:
            conf: [rows, n] the selector's confidences.
        Returns:
            [rows] the full draft count n per row, or None where the drafter sets no budget.
        """
        import torch

        budget = self.real.verify_budget(conf)
        return None if budget is None else torch.full_like(budget, conf.shape[1])

    def propose(self, logits: Tensor, cache, slots: Tensor) -> Tensor:
        """The drafts the table wants (``tau``: the first k right, the rest off by one id).

        Args:
            logits: [rows, n, V] the drafter's logits (only their shape is read).
            cache: the drafter's cache; ``ctx_len[slots]`` is each row's position.
            slots: [rows] long, the rows' cache slots.
        Returns:
            [rows, n] long draft tokens.
        """
        import torch

        n = logits.shape[1]
        pos = cache.ctx_len[slots].long().clamp(max=self.table.shape[1] - 1)
        idx = (pos[:, None] + 1 + torch.arange(n, device=slots.device)).clamp(max=self.table.shape[1] - 1)
        want = self.table[slots[:, None], idx]
        if self.tau is not None:
            k = (self.draws[slots, pos] < (self.tau - 1) / n).sum(1)
            wrong = torch.arange(n, device=slots.device)[None, :] >= k[:, None]
            want = torch.where(wrong, (want + 1) % logits.shape[-1], want)
        return want


def first_mismatch(want: list[int], got: list[int]) -> int | None:
    """The first index where ``want`` and ``got`` differ, over the shorter of the two; None if none."""
    return next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)


def table_rows(table: Tensor, start: int, tokens: list[list[int]]) -> list[list[int]]:
    """Each row's table entries over the positions its emitted tokens cover.

    Args:
        table: [slots, width] long oracle table.
        start: the position of each row's first token.
        tokens: each row's tokens.
    Returns:
        Row r's ``table[r, start: start + len(tokens[r])]``.
    """
    return [table[r, start: start + len(t)].tolist() for r, t in enumerate(tokens)]


def oracle_fixed_point(generate: Callable[[int], tuple[list[list[int]], list[int]]], table: Tensor, start: int,
                       max_passes: int) -> tuple[int, bool]:
    """Rewrite ``table`` in place until a pass of the forced mode emits exactly the table.

    ``generate(p)`` runs pass p (un-timed, same batch, graph and schedule as the timed run, but longer)
    and returns its tokens per row, token 0 at position ``start``, and how many of each row's tokens
    must agree: every token the timed run will emit in that row plus one block, so its last drafts read
    agreed positions too (the pass's own last block may read past what is known). Emitted tokens are
    the verify path's own greedy outputs, so they become the table. Each pass moves the first
    disagreement right by at least one token. Returns (passes, converged).
    """
    import torch

    for p in range(1, max_passes + 1):
        tokens, agree = generate(p)
        head = [t[:n] for t, n in zip(tokens, agree)]
        if all(first_mismatch(w, t) is None for w, t in zip(table_rows(table, start, head), head)):
            return p, True
        for r, t in enumerate(tokens):
            table[r, start: start + len(t)] = torch.tensor(t, device=table.device)
    return max_passes, False


def agreed_lengths(lengths: list[list[int]], want: int, block: int) -> list[int]:
    """How many of a pass's tokens per row must equal the table: all the timed run emits (it stops at
    the first step where every row has more than ``want``; ``lengths`` are the rows' lengths after
    each step of the pass), plus one block its last drafts read."""
    stop = next(n for n in lengths if min(n) > want)
    return [n + block for n in stop]


def check_table(table: Tensor, start: int, tokens: list[list[int]]) -> tuple[bool, list[dict]]:
    """A forced mode's timed tokens against its (fixed-point) table: exact, no tie allowance."""
    report = [{"row": r, "compared": len(t), "first_divergence": first_mismatch(w, t)}
              for r, (w, t) in enumerate(zip(table_rows(table, start, tokens), tokens))]
    return all(x["first_divergence"] is None for x in report), report


def reach(mode: Mode, tokens: int, block: int) -> int:
    """Most tokens a row can hold after a run of ``mode`` (its first token included): a run ends once every row
    has more than its target, the slowest row gains at least one token a step, the fastest at most a block. The
    target is ``tokens`` for a timed run and one block more for a forced mode's fixed-point passes."""
    if not mode.spec:
        return tokens + 1
    want = tokens + block if mode.forced else tokens
    return (want + 1) * block + 1


def new_table(rows: int, prompt_len: int, tokens: int, block: int, device) -> Tensor:
    """An oracle table (one row per slot, the pad slot included) wide enough for every position a run reaches.

    Returns:
        [rows + 1, width] long zeros on ``device``.
    """
    import torch

    width = prompt_len + reach(Mode("oracle"), tokens, block) + block + 1
    return torch.zeros(rows + 1, width, dtype=torch.long, device=device)

