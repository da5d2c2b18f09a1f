"""``ocria bench engine``'s forced-acceptance machinery on a toy verify path (CPU, no model).

The toy target's greedy token depends on where its position sits in the verify block at near-ties,
like bf16 logits of the ar (T=1) and verify (T=16) paths: an oracle table taken from the ar path is
rejected after the first flip, the fixed point of the verify path is accepted block after block.
"""

import io
from types import SimpleNamespace

import pytest
import torch

from ocria.bench import engine
from ocria.bench.timing import kernel_table
from ocria.data import generate
from ocria.errors import OcriaError

V, BLOCK, START, TOKENS = 97, 16, 5, 40


def greedy(seq: list[int], block_start: int) -> int:
    """Next token after ``seq``; every fifth position is a tie that the block alignment breaks."""
    h = (31 * sum(seq[-3:]) + 7 * len(seq)) % V
    return (h + block_start % 2) % V if len(seq) % 5 == 2 else h


def decode(drafter, rows: int, want: int = TOKENS) -> tuple[list[list[int]], dict]:
    """Forced-mode generation like ``time_mode``'s: verify [last, drafts], accept the agreeing prefix."""
    prompt = [3, 1, 4, 1, 5][:START]
    first = greedy(prompt, START - 1)
    cache = SimpleNamespace(ctx_len=torch.full((rows,), START, dtype=torch.int32))
    seqs = [[*prompt, first] for _ in range(rows)]
    steps, accepted, lengths = 0, 0, []
    while min(len(s) - START for s in seqs) <= want:
        for r, seq in enumerate(seqs):
            c = int(cache.ctx_len[r])
            drafts = drafter.propose(torch.zeros(1, BLOCK - 1, V), cache, torch.tensor([r]))[0].tolist()
            inputs = seq[: c + 1] + drafts
            ys = [greedy(inputs[: c + 1 + j], c) for j in range(BLOCK)]
            acc = next((j for j in range(BLOCK - 1) if drafts[j] != ys[j]), BLOCK - 1)
            seq += ys[: acc + 1]
            cache.ctx_len[r] += acc + 1
            accepted += acc
        steps += 1
        lengths.append([len(s) - START for s in seqs])
    tokens = [s[START:] for s in seqs]
    return tokens, {"tau": (accepted + rows * steps) / (rows * steps), "lengths": lengths}


def agreed_pass(drafter, rows: int):
    """A pass of ``settle_table``: one block longer than the timed run, agreeing on all the timed run emits."""
    def run(p):
        tokens, stats = decode(drafter, rows, TOKENS + BLOCK)
        return tokens, engine.agreed_lengths(stats["lengths"], TOKENS, BLOCK)
    return run


def ar_table(rows: int) -> torch.Tensor:
    """The ar path's greedy continuation (every block of length one) as the seed table."""
    table = torch.zeros(rows + 1, START + 2 * TOKENS + 64, dtype=torch.long)
    seq = [3, 1, 4, 1, 5][:START]
    for _ in range(TOKENS + BLOCK + 1):
        seq.append(greedy(seq, len(seq) - 1))
    table[:rows, : len(seq)] = torch.tensor(seq)
    return table


def test_ar_table_breaks_and_fixed_point_is_fully_accepted():
    rows = 2
    table = ar_table(rows)
    drafter = engine.ForcedDrafter(SimpleNamespace(config=SimpleNamespace(block_size=BLOCK)), table, None)
    tokens, stats = decode(drafter, rows)
    assert stats["tau"] < BLOCK / 2  # the ar table flips at a tie and every later draft is rejected
    ok, report = engine.check_table(table, START, tokens)
    assert not ok and report[0]["first_divergence"] is not None

    passes, converged = engine.oracle_fixed_point(agreed_pass(drafter, rows), table, START, 4 * TOKENS)
    assert converged and 1 < passes < 4 * TOKENS
    tokens, stats = decode(drafter, rows)  # the timed run reads the same table
    assert stats["tau"] == BLOCK
    assert engine.check_table(table, START, tokens)[0]


def test_tau_mode_is_deterministic_has_its_mean_and_reaches_a_fixed_point():
    rows, tau = 3, 8.0
    table = ar_table(rows)
    real = SimpleNamespace(config=SimpleNamespace(block_size=BLOCK))
    drafter = engine.ForcedDrafter(real, table, tau)
    k = (drafter.draws < (tau - 1) / (BLOCK - 1)).sum(-1).float()
    assert abs(float(k.mean()) + 1 - tau) < 0.2  # Binomial(15, 7/15) per (slot, position): mean tau - 1

    passes, converged = engine.oracle_fixed_point(agreed_pass(drafter, rows), table, START, 4 * TOKENS)
    assert converged
    tokens, stats = decode(drafter, rows)
    _, agree = agreed_pass(drafter, rows)(0)
    assert all(n >= len(t) + BLOCK for n, t in zip(agree, tokens))  # fast rows included
    again, stats2 = decode(engine.ForcedDrafter(real, table, tau), rows)  # same seed: same schedule
    assert tokens == again and stats == stats2
    longer = decode(drafter, rows, TOKENS + BLOCK)[0]
    assert [t[: len(s)] for t, s in zip(longer, tokens)] == tokens  # the timed run is a pass's prefix
    assert engine.check_table(table, START, tokens)[0]
    assert 1 < stats["tau"] < BLOCK


def test_agreement_covers_every_token_the_timed_run_emits():
    # three steps of a pass; the timed run (want 8) stops after the second, with a fast row at 40
    lengths = [[3, 17], [10, 40], [20, 60]]
    assert engine.agreed_lengths(lengths, 8, BLOCK) == [10 + BLOCK, 40 + BLOCK]


def test_draft_vocab_override_is_checked():
    from ocria.models.config import DrafterConfig

    config = DrafterConfig(hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1,
                           num_key_value_heads=1, head_dim=8, vocab_size=512, block_size=4, mask_token_id=6,
                           target_layer_ids=[0], num_target_layers=1, draft_vocab_size=300)
    drafter = SimpleNamespace(config=config, lm_head=SimpleNamespace(weight=torch.empty(512, 8)))
    engine.set_draft_vocab(drafter, None)
    assert drafter.config.draft_vocab_size == 300  # the preset's
    engine.set_draft_vocab(drafter, 0)
    assert drafter.config.draft_vocab_size == 0
    for bad in (-1, 6, 513):
        with pytest.raises(OcriaError, match="draft-vocab"):
            engine.set_draft_vocab(drafter, bad)


def test_check_table_reports_the_first_wrong_position():
    table = torch.arange(40)[None].repeat(2, 1)
    ok, report = engine.check_table(table, 10, [list(range(10, 20)), [10, 11, 99, 13]])
    assert not ok
    assert [r["first_divergence"] for r in report] == [None, 2]
    assert [r["compared"] for r in report] == [10, 4]


def test_drafter_ranges_put_step_calls_in_profiler_ranges():
    from torch.profiler import ProfilerActivity, profile

    inner = SimpleNamespace(config=SimpleNamespace(block_size=BLOCK), propose=lambda x: x + 1, other=lambda: 3)
    drafter = engine.DrafterRanges(inner)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = drafter.propose(torch.ones(2))
    assert torch.equal(out, torch.full((2,), 2.0))
    assert drafter.config.block_size == BLOCK and drafter.other is inner.other
    ranged = [e for e in prof.events() if e.name == "drafter.propose"]
    assert len(ranged) == 1 and any(c.name == "aten::add" for c in ranged[0].cpu_children)
    table = kernel_table(prof, ("drafter.propose",))
    assert table["kernels"] == 0 and table["ranges"]["drafter.propose"] == {"kernels": 0, "total_us": 0}


def test_forced_drafter_in_the_real_decode_step():
    """ocria-mini's eager spec step: the table is indexed by the drafter cache's positions as the oracle
    mode needs (ar's table, extended by the passes, is accepted block after block, selector or not)."""
    from ocria.builder.presets import load_preset, random_models
    from ocria.models import DrafterCache, TargetCache
    from ocria.runtime.decode import SamplingTensors, decode_step, prefill
    from ocria.runtime.processor import Processor

    preset = load_preset("ocria-mini")
    target, drafter = random_models(preset, "cpu", torch.float32)
    cfg, dc = target.text_config, drafter.config
    buf = io.BytesIO()
    generate(3, kind="page").image.save(buf, format="PNG")
    prompt = Processor(preset.assets).prepare(buf.getvalue())
    L, n, size = prompt.input_ids.numel(), 20, 256
    zero = torch.zeros(1)
    params = SamplingTensors(zero, torch.ones(1), zero.long(), zero.long())
    table = torch.zeros(1, L + size, dtype=torch.long)

    def run(use, want: int) -> tuple[list[list[int]], float]:
        tcache = TargetCache.allocate(cfg, 1, L + size, dc.block_size, torch.float32, "cpu")
        dcache = DrafterCache.allocate(dc.num_hidden_layers, dc.num_key_value_heads, dc.head_dim, 1, L + size,
                                       torch.float32, "cpu") if use else None
        last = prefill(target, drafter if use else None, tcache, dcache, 0, prompt).argmax(-1)
        tokens, steps = [int(last)], 0
        while len(tokens) <= want:
            res = decode_step(target, use, tcache, dcache, torch.zeros(1, dtype=torch.long), last, params,
                              L + size - 2 * dc.block_size, True)
            a = int(res.accepted[0])
            tokens += res.tokens[0, : a + 1].tolist()
            last, steps = res.tokens[0, a: a + 1], steps + 1
        return [tokens], (len(tokens) - 1) / steps

    ar, _ = run(None, n)
    table[0, L: L + n + 1] = torch.tensor(ar[0])
    oracle = engine.ForcedDrafter(drafter, table, None)
    def agreed(p):  # one row: agree on the timed run's tokens plus a block
        tokens = run(oracle, n + dc.block_size)[0]
        return tokens, [len(tokens[0])]

    passes, converged = engine.oracle_fixed_point(agreed, table, L, 4 * n)
    assert converged and table[0, L: L + n + 1].tolist() == ar[0]  # fp32: the passes only extend ar's table
    tokens, tau = run(oracle, n)
    assert tau == dc.block_size and engine.check_table(table, L, tokens)[0]
