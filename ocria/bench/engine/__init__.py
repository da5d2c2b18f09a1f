"""``ocria bench engine``: end-to-end decode throughput of an engine, ``ar`` against the speculative modes.

    ocria bench engine --engine engines/ocria-mini --batch 1 8 --modes ar spec tau=8 --out bench/engine.json
    ocria bench engine --preset ocria-1-sim --device cuda --batch 1 8 32 64 --out engine.json

The model is a built engine directory (``--engine``: its target, drafter and processor) or the random weights of a
preset (``--preset``, optionally quantized with ``--recipe`` and no calibration: the bytes and kernels of a step
are those of an engine built with that recipe). For each batch size every row prefills the same document prompt,
then decode steps are timed: on CUDA, graph-captured steps (one graph launch and one asynchronous readback per step)
timed with CUDA events; on CPU, eager steps timed with the wall clock.

Modes: ``ar`` decodes one token per step; ``spec`` uses the drafter as is; ``oracle`` forces every draft to be the
target's own continuation; ``tau=X`` forces the first k ~ Binomial(B-1, (X-1)/(B-1)) drafts right and the rest wrong
(uniforms fixed per row and position, so a run is a function of its table). The drafter always runs; in the forced
modes its selector head runs too but does not cut the drafts sent to verification. ``ar`` runs first at each batch
size: the other modes are checked against its tokens and the forced modes start from them.

The forced modes read an oracle table of wanted tokens. ``ar``'s greedy tokens seed it, but in reduced precision the
ar path (T=1 steps) and the verify path (T=block steps) differ by rounding, a near-tie flips and every later draft
would be rejected. So before timing, a forced mode runs un-timed passes on the same batch and block schedule and
takes the tokens it emitted as the new table until a pass emits exactly the table (every block fully accepted): a
fixed point of the verify path itself. Each pass extends the agreed prefix by at least one token (the verify outputs
up to the first disagreement repeat), so the cap (every token a pass can emit, + 2) is never the reason to stop; the
passes are reported. Passes run one block past the timed run and agree on every token the timed run emits in each
row (fast rows of ``tau=X`` run far past ``--tokens``) plus a block, so its last drafts read agreed positions too.
Each forced run records its passes and ``table_source``: ``ar`` when the passes only extended ar's table past its
end, ``fixed_point`` when they rewrote a token the timed run reads (``table_first_rewrite``: the first one).

Checks, each failing the run (exit status 1): the timed tokens of a forced mode equal its table (exact: same
computation, same schedule); every spec-family run equals ``ar`` token for token, a first divergence accepted only
where the two tokens' logit gap is under twice the measured ar/verify path noise (a floating-point tie), and
reported; on CUDA (bf16 runs), an fp32 run of oracle and tau=8 against ar. On CPU the runs are fp32 already.
Also: launches per step (profiler), host time per step, fraction of the bytes roofline (CUDA; null on CPU), an HF
transformers ``generate`` baseline, ``--profile`` (CUDA): every kernel of one eager ar and one eager oracle step at
batch 1, the oracle step split into drafter and target verify + commit.

Modules, one job each: ``config`` (flags and settings), ``models`` (the models and the prompt), ``oracle`` (forced
acceptance and the table's fixed point), ``decode`` (timing one batch and mode), ``checks`` (spec == ar, forced
tokens == table, fp32), ``roofline`` (bytes a step moves), ``profile`` (``--profile``), ``hf`` (the HF baseline),
``report`` (result, table, plot), ``main`` (the run). Their top-level imports stay light (``add_args`` runs
whenever an ``ocria`` parser is built): torch and the models are imported by the functions that use them.
"""

from ocria.bench.engine.checks import path_noise, step_logits
from ocria.bench.engine.config import add_args
from ocria.bench.engine.main import run
from ocria.bench.engine.models import set_draft_vocab
from ocria.bench.engine.oracle import ForcedDrafter, agreed_lengths, check_table, oracle_fixed_point
from ocria.bench.engine.profile import DrafterRanges

__all__ = ["DrafterRanges", "ForcedDrafter", "add_args", "agreed_lengths", "check_table", "oracle_fixed_point",
           "path_noise", "run", "set_draft_vocab", "step_logits"]
