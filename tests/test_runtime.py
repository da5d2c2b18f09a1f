"""Runtime: lossless spec == ar under batching and joins, exact rollback, stops, detokenization."""

import inspect
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from ocria.errors import OcriaError
from ocria.models import TargetCache, gdn
from ocria.models.gdn import fold_pending
from ocria.plugins.policy import ALL_KERNELS, AUTO, ExecutionPolicy
from ocria.runtime import IncrementalDetokenizer, SamplingParams, load_engine
from ocria.runtime.decode import prefill

REPO = Path(__file__).parent.parent
ASSETS = REPO / "ocria" / "assets" / "ocria-mini"
EXAMPLES = sorted((REPO / "examples").glob("*.png"))


@pytest.fixture(scope="module")
def engine(mini_engine):
    return load_engine(mini_engine)


class NoisyOracle:
    """Wraps the real drafter (which still runs) and replaces its proposals: each drafted token is the
    true continuation with probability ``p``, else random. Exercises every acceptance length. The
    selector's confidences are replaced by uniform draws too (a random selector's own are noise, and
    may sit on one side of any threshold), so a threshold cuts drafts at every length."""

    def __init__(self, real, sched, refs: dict[int, list[int]], p: float, seed: int):
        self.real, self.sched, self.refs, self.p = real, sched, refs, p
        self.rng = random.Random(seed)

    def __getattr__(self, name):
        return getattr(self.real, name)

    def draft(self, last, cache, slots, attn_len=None, policy=AUTO):
        logits, conf = self.real.draft(last, cache, slots, attn_len, policy)
        vocab = logits.shape[-1]
        for i, s in enumerate(slots.tolist()):
            req = next(r for r in self.sched.running.values() if r.slot == s)
            base = int(cache.ctx_len[s]) - req.prompt.input_ids.numel() + 1
            ref = self.refs[req.rid]
            for j in range(logits.shape[1]):  # a draft vocabulary cannot propose ids past its end
                good = base + j < len(ref) and ref[base + j] < vocab and self.rng.random() < self.p
                tok = ref[base + j] if good else self.rng.randrange(vocab)
                logits[i, j] = float("-inf")
                logits[i, j, tok] = 0.0
        if conf is not None:
            conf = torch.tensor([[self.rng.random() for _ in range(conf.shape[1])] for _ in range(conf.shape[0])],
                                dtype=conf.dtype, device=conf.device)
        return logits, conf


def run_alone(engine, prompt, params) -> list[int]:
    sched = engine.scheduler(max_batch_size=1)
    sched.add(prompt, params)
    ids = []
    while sched.has_work():
        for ev in sched.step():
            ids += ev.token_ids
    return ids


def requests(engine, n, temperature):
    out = []
    for i in range(n):
        image = EXAMPLES[i % len(EXAMPLES)]
        prompt = engine.processor.prepare(image, None if i % 2 else f"Transcribe part {i}.")
        params = SamplingParams(max_tokens=12 + 5 * i, temperature=temperature, top_p=0.9 if i % 3 else 1.0,
                                top_k=50 if i % 2 else 0, seed=100 + i, ignore_eos=True)
        out.append((prompt, params))
    return out


@pytest.mark.parametrize("temperature,p_accept,threshold,draft_vocab",
                         [(0.0, 0.8, 0.0, 0), (0.9, 0.7, 0.0, 0), (0.0, 0.9, 0.5, 0), (0.0, 0.9, 0.0, 300)])
def test_spec_equals_ar_with_joins_and_mixed_batches(engine, temperature, p_accept, threshold, draft_vocab):
    reqs = requests(engine, 6, temperature)
    refs_alone = [run_alone(engine, pr, SamplingParams(**{**pa.__dict__, "mode": "ar"})) for pr, pa in reqs]
    real = engine.drafter
    old_threshold = real.config.selector_threshold
    real.config.selector_threshold = threshold
    real.config.draft_vocab_size = draft_vocab
    sched = engine.scheduler(max_batch_size=4)
    oracle = NoisyOracle(real, sched, {}, p_accept, seed=7)
    engine.drafter = oracle
    try:
        got, rid_of, accepted, join_at = {}, {}, 0, {0: [0, 1, 2], 2: [3], 5: [4, 5]}
        step = 0
        while step in join_at or sched.has_work() or any(s > step for s in join_at):
            for i in join_at.get(step, []):
                prompt, params = reqs[i]
                mode = "ar" if i == 3 else "spec"  # one AR request shares the loop with spec ones
                rid = sched.add(prompt, SamplingParams(**{**params.__dict__, "mode": mode}))
                rid_of[rid] = i
                oracle.refs[rid] = refs_alone[i]
            for ev in sched.step():
                got.setdefault(rid_of[ev.request_id], []).extend(ev.token_ids)
                if ev.finished:
                    accepted += ev.stats.num_accepted_draft_tokens
            step += 1
    finally:
        engine.drafter = real
        real.config.selector_threshold = old_threshold
        real.config.draft_vocab_size = 0
    assert accepted > 10  # the oracle's drafts were really accepted
    for i, ref in enumerate(refs_alone):
        assert got[i] == ref, f"request {i}: spec/batched tokens differ from ar alone"


def test_rollback_state_equals_model_that_saw_only_accepted(engine):
    prompt, params = requests(engine, 1, 0.0)[0]
    ref = run_alone(engine, prompt, SamplingParams(**{**params.__dict__, "mode": "ar", "max_tokens": 30}))
    real = engine.drafter
    sched = engine.scheduler(max_batch_size=2)
    engine.drafter = NoisyOracle(real, sched, {0: ref}, 0.6, seed=3)
    try:
        sched.add(prompt, SamplingParams(**{**params.__dict__, "max_tokens": 30}))
        for _ in range(4):
            sched.step()
    finally:
        engine.drafter = real
    req = sched.running[0]
    s = req.slot
    tc = sched.runner.tcache
    committed = torch.cat([prompt.input_ids, torch.tensor(req.generated[:-1])])
    assert int(tc.kv_len[s]) == committed.numel() == req.length
    fresh = TargetCache.allocate(engine.target.text_config, 1, tc.max_len, tc.max_chunk, torch.float32)
    fresh_prompt = type(prompt)(committed, prompt.pixel_values, prompt.image_grid_thw)
    prefill(engine.target, None, fresh, None, 0, fresh_prompt)
    n = int(tc.kv_len[s])
    slot = torch.tensor([s])
    for i in range(len(tc.k)):
        torch.testing.assert_close(tc.k[i][s, :, :n], fresh.k[i][0, :, :n], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(tc.v[i][s, :, :n], fresh.v[i][0, :, :n], rtol=1e-4, atol=1e-5)
    W = engine.target.text_config.linear_conv_kernel_dim - 1
    for i in range(len(tc.ssm)):
        ours = fold_pending(tc.ssm[i], tc.ring_k[i], tc.ring_u[i], tc.ring_g[i], tc.ring_phase, tc.pending_len,
                            slot)
        torch.testing.assert_close(ours[0], fresh.ssm[i][0], rtol=1e-4, atol=1e-5)
        p = int(tc.pending_len[s])
        torch.testing.assert_close(tc.conv_buf[i][s, p:p + W], fresh.conv_buf[i][0, :W])
    assert int(tc.pending_len[s]) >= 1


def test_stop_strings_and_eos(engine):
    prompt, params = requests(engine, 1, 0.0)[0]
    full = list(engine.generate(EXAMPLES[0], None, SamplingParams(max_tokens=24, ignore_eos=True, mode="ar")))
    text = "".join(e.text for e in full)
    stop = text[5:8]
    cut = list(engine.generate(EXAMPLES[0], None, SamplingParams(max_tokens=24, ignore_eos=True, stop=(stop,))))
    assert "".join(e.text for e in cut) == text[: text.find(stop)]
    assert cut[-1].finish_reason == "stop"
    first_id = full[0].token_ids[0]
    by_id = list(engine.generate(EXAMPLES[0], None, SamplingParams(max_tokens=24, stop_token_ids=(first_id,))))
    assert by_id[-1].finish_reason == "stop" and sum(len(e.token_ids) for e in by_id) == 0


def test_acceptance_length_counts_the_final_step(engine):
    """Mean tokens per decode step, bonus included: exactly 1 in ar mode, the last step too."""
    params = [SamplingParams(max_tokens=n, ignore_eos=True, mode="ar") for n in (2, 6)]
    stats = [list(engine.generate(EXAMPLES[0], None, p))[-1].stats for p in params]
    assert [(s.num_generated_tokens, s.num_steps, s.acceptance_length) for s in stats] == [(2, 1, 1.0), (6, 5, 1.0)]


def test_cancel_frees_slot(engine):
    sched = engine.scheduler(max_batch_size=2)
    prompt, params = requests(engine, 1, 0.0)[0]
    rid = sched.add(prompt, params)
    sched.step()
    assert sched.num_running == 1
    sched.cancel(rid)
    events = sched.step()
    assert events[0].finished and events[0].finish_reason == "cancelled" and sched.num_running == 0
    assert len(sched.free) == 2


def test_incremental_detokenizer_multibyte(engine):
    tok = engine.processor.tokenizer
    text = "Zürich — 東京 ok  spaced\ttab 🙂 end"
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push([i]) for i in ids] + [detok.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_spec_equals_ar_with_triton_plugins(engine, monkeypatch):
    """The same losslessness with the ReplaySSM Triton kernels (Triton's interpreter on CPU), where every step
    costs seconds: the example at half size (77 prompt tokens, not 150), and the selector's threshold at 0 so the
    oracle's drafts decide each accepted length. A verify step costs its 16 tokens whatever it accepts; without the
    threshold's early cuts, and with the oracle's seed chosen for it, ten tokens take three steps, which fold 0, 1 and
    2 pending tokens."""
    plugged = load_engine(engine.root, policy=ALL_KERNELS)
    assert plugged.plugins == "triton"
    params = requests(plugged, 1, 0.0)[0][1]
    with Image.open(EXAMPLES[0]) as image:
        prompt = plugged.processor.prepare(image.resize((image.width // 2, image.height // 2)), None)
    params = SamplingParams(**{**params.__dict__, "max_tokens": 10})
    ref = run_alone(engine, prompt, SamplingParams(**{**params.__dict__, "mode": "ar"}))
    assert run_alone(plugged, prompt, SamplingParams(**{**params.__dict__, "mode": "ar"})) == ref
    sched = plugged.scheduler(max_batch_size=2)
    real = plugged.drafter
    monkeypatch.setattr(real.config, "selector_threshold", 0.0)
    plugged.drafter = NoisyOracle(real, sched, {0: ref}, 0.7, seed=0)
    folded, replay_verify = set(), gdn.replay_verify
    bind = inspect.signature(replay_verify).bind

    def recording(*args, **kwargs):  # what each verify call folds: its block length and pending counts
        named = bind(*args, **kwargs).arguments
        folded.update((named["q"].shape[1], n) for n in named["pending_len"][named["slot_ids"]].tolist())
        return replay_verify(*args, **kwargs)

    monkeypatch.setattr(gdn, "replay_verify", recording)
    try:
        sched.add(prompt, params)
        got = []
        while sched.has_work():
            for ev in sched.step():
                got += ev.token_ids
    finally:
        plugged.drafter = real
    assert got == ref
    assert {T for T, _ in folded} == {16} and {min(n, 2) for _, n in folded} == {0, 1, 2}, folded


def test_decode_steps_run_the_target_batch_invariant(engine, monkeypatch):
    """Decode and verify steps run the target under the engine policy's ``for_steps()`` (prefill does not); a policy
    built with OCRIA_BATCH_INVARIANT=0 turns it off, and a value other than 0 or 1 stops the engine's load by name."""
    seen = []
    real = engine.target.logits
    monkeypatch.setattr(engine.target, "logits",
                        lambda hidden, policy: (seen.append(policy.invariant_rows), real(hidden, policy))[1])
    prompt, params = requests(engine, 1, 0.0)[0]
    for mode in ("ar", "spec"):
        seen.clear()
        run_alone(engine, prompt, SamplingParams(**{**params.__dict__, "max_tokens": 4, "mode": mode}))
        assert seen[0] is False and len(seen) >= 2 and all(seen[1:]), (mode, seen)
    monkeypatch.setattr(engine, "policy", ExecutionPolicy.from_env(environ={"OCRIA_BATCH_INVARIANT": "0"}))
    seen.clear()
    run_alone(engine, prompt, SamplingParams(**{**params.__dict__, "max_tokens": 4, "mode": "spec"}))
    assert len(seen) >= 2 and not any(seen)
    monkeypatch.setenv("OCRIA_BATCH_INVARIANT", "yes")
    with pytest.raises(OcriaError, match="OCRIA_BATCH_INVARIANT='yes'"):
        load_engine(engine.root)


@pytest.mark.parametrize("size,mode", [((448, 288), "RGB"), ((1, 1), "RGB"), ((301, 77), "L"), ((33, 700), "RGBA"),
                                       ((511, 513), "noise"), ((40, 2), "RGB")])
def test_patch_bytes_are_the_image_processors_own(engine, size, mode):
    """The uint8 patch path (what the server sends) equals transformers' processor byte for byte, and the byte
    table turns it into exactly the processor's normalized pixel values (also what ``prepare`` returns)."""
    from transformers import Qwen2VLImageProcessorPil

    from ocria.runtime.processor import pixels_from_bytes

    proc = engine.processor
    hf = Qwen2VLImageProcessorPil.from_pretrained(str(ASSETS), local_files_only=True)
    image = Image.effect_noise(size, 60) if mode == "noise" else Image.new(mode, size, 77)
    image = proc.load_image(image)
    fast, grid = proc.patch_bytes(image)
    ref = hf(images=[image], do_rescale=False, do_normalize=False, return_tensors="pt")
    assert fast.dtype == torch.uint8 and torch.equal(fast, ref["pixel_values"].to(torch.uint8))
    assert torch.equal(grid, ref["image_grid_thw"].long())
    floats = hf(images=[image], return_tensors="pt")["pixel_values"].float()
    assert torch.equal(pixels_from_bytes(fast, proc.byte_table), floats)
    assert torch.equal(proc.prepare(image).pixel_values, floats)


def test_smart_resize_is_qwen2_vls():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

    from ocria.runtime.processor import smart_resize

    g = torch.Generator().manual_seed(0)
    sides = [1, 2, 31, 32, 33, 511, 512, 513, 1700, 4000] + torch.randint(1, 5000, (30,), generator=g).tolist()
    for h in sides:
        for w in sides:
            for lo, hi in [(4096, 262144), (56 * 56, 1 << 20)]:
                try:
                    want = hf_smart_resize(h, w, 32, lo, hi)
                except ValueError:
                    with pytest.raises(ValueError, match="aspect ratio"):
                        smart_resize(h, w, 32, lo, hi)
                    continue
                assert smart_resize(h, w, 32, lo, hi) == want, (h, w, lo, hi)


def test_runtime_imports_no_modeling_stack():
    """The serving models import ocria.runtime inside Triton's Python stub, which may run NumPy < 2 beside
    packages built for NumPy 2 (SciPy, scikit-learn): the runtime and its processor must not pull them in
    (transformers' image processors and AutoTokenizer do, through modeling_utils and generation)."""
    code = ("import sys; import ocria.runtime, ocria.serving.protocol; "
            f"p = ocria.runtime.Processor({str(ASSETS)!r}); p.prepare({str(REPO / 'examples' / 'report.png')!r}); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('scipy', 'sklearn') or "
            "m.startswith(('transformers.modeling_utils', 'transformers.generation', "
            "'transformers.image_processing'))); "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
