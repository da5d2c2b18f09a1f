"""ReplaySSM: reference and Triton kernel (CPU interpreter) against a float64 recurrence over accepted tokens.

The float64 model below is written from the gated delta rule alone (MISSION.md section 3): each
sequence keeps one state that only ever sees its accepted tokens, and a list of accepted conv inputs.
The plugin instead keeps a checkpoint, a ring of pending tokens and a cursor; after every step of a
multi-step run its outputs, and its states once pending tokens are folded, must agree.
"""

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before any Triton kernel of the plugin is decorated

import pytest
import torch
import torch.nn.functional as F

from ocria.models import gdn as R
from ocria.models.gdn import causal_conv_verify, replay_verify
from ocria.plugins.policy import ALL_KERNELS, DEFAULT_LAUNCH, REFERENCE, ExecutionPolicy, Launch

if "ocria.plugins.replay_ssm.kernel" in sys.modules:  # decorated earlier without the interpreter
    importlib.reload(sys.modules["ocria.plugins.replay_ssm.kernel"])
from ocria.plugins.replay_ssm.kernel import key_chunking, launch_config, replay_verify_kernel, token_rows  # noqa: E402

STEP = ALL_KERNELS.for_steps()  # the policy of a batch-invariant decode step


def _gdn_step64(S, q, k, v, a, b, A_log, dt_bias):
    """One token of one sequence in float64: S [Hv, Dk, Dv]; q, k [Hk, Dk]; v [Hv, Dv]; a, b [Hv]."""
    Hv, Dk = S.shape[0], S.shape[1]
    rep = Hv // k.shape[0]
    k = (k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(rep, 0)
    q = (q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(rep, 0) / Dk**0.5
    alpha = torch.exp(-torch.exp(A_log) * torch.log1p(torch.exp(a + dt_bias)))
    beta = 1 / (1 + torch.exp(-b))
    S = alpha[:, None, None] * S
    u = beta[:, None] * (v - torch.einsum("hkv,hk->hv", S, k))
    S = S + k[:, :, None] * u[:, None, :]
    return S, torch.einsum("hkv,hk->hv", S, q)


def _run(policy: ExecutionPolicy, dtype: torch.dtype, seed: int, steps: int = 5, shape=None, ts=None, launch=None,
         pending_seen=None):  # fmt: skip
    """Drive the plugin through `steps` verify/accept rounds; yield (name, got, expected) pairs.

    shape (Hk, Hv, Dk, Dv, Tmax) and ts (T of each step) fix what is otherwise drawn at random;
    launch: keyword arguments of a direct Triton launch (tile, key chunk); pending_seen collects (T, pending count)
    of every sequence at every step."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    def randint(lo, hi, shape=()):
        return torch.randint(lo, hi, shape, generator=gen)

    Hk = int(randint(1, 3))
    Hv = Hk * 2 ** int(randint(0, 3))  # GQA: 1, 2 or 4 value heads per key head
    Dk, Dv = (int(x) for x in torch.tensor([16, 24, 32])[randint(0, 3, (2,))])
    Tmax, KW, n_seq = int(randint(4, 17)), 4, 3
    if shape is not None:
        Hk, Hv, Dk, Dv, Tmax = shape
    S_slots = n_seq + 2
    C = 2 * Hk * Dk + Hv * Dv
    slot_of = torch.randperm(S_slots, generator=gen)[:n_seq]  # sequence i lives in slot slot_of[i]

    A_log, dt_bias = rand(Hv, scale=0.5) - 2.0, rand(Hv, scale=0.5)
    conv_w = rand(C, KW, scale=0.5)
    init_state = rand(n_seq, Hv, Dk, Dv, scale=0.1)
    init_window = rand(n_seq, C, KW - 1)

    state = torch.zeros(S_slots, Hv, Dk, Dv)
    state[slot_of] = init_state.float()
    ring_k, ring_u = torch.zeros(S_slots, 2, Tmax, Hk, Dk), torch.zeros(S_slots, 2, Tmax, Hv, Dv)
    ring_g = torch.zeros(S_slots, 2, Tmax, Hv)
    ring_phase = torch.zeros(S_slots, dtype=torch.int32)
    pending_len = torch.zeros(S_slots, dtype=torch.int32)
    conv_buf = torch.zeros(S_slots, KW - 1 + Tmax, C)
    conv_buf[slot_of, : KW - 1] = init_window.transpose(1, 2).float()

    true_state = list(init_state)
    conv_hist = [list(w.T) for w in init_window]  # accepted conv inputs, oldest first

    for step in range(steps):
        T = int(randint(1, Tmax + 1)) if ts is None else ts[step]
        members = torch.randperm(n_seq, generator=gen)[: int(randint(1, n_seq + 1))]  # batch joins/leaves
        B = len(members)
        slot_ids = slot_of[members]
        x = rand(B, T, C).to(dtype)
        q, k, v = rand(B, T, Hk, Dk).to(dtype), rand(B, T, Hk, Dk).to(dtype), rand(B, T, Hv, Dv).to(dtype)
        a, b = rand(B, T, Hv).to(dtype), rand(B, T, Hv).to(dtype)

        y = causal_conv_verify(x, conv_w.float(), conv_buf, pending_len, slot_ids, policy=policy)
        verify_args = (q, k, v, a, b, A_log.float(), dt_bias.float(), state, ring_k, ring_u, ring_g, ring_phase,
                       pending_len, slot_ids)  # fmt: skip
        if pending_seen is not None:
            pending_seen.extend((T, int(n)) for n in pending_len[slot_ids])
        if launch is None:
            o = replay_verify(*verify_args, policy=policy)
        else:
            o = replay_verify_kernel(*verify_args, **launch)

        accepted = randint(0, T + 1, (B,))
        for row, i in enumerate(members.tolist()):
            window = torch.stack(conv_hist[i][-(KW - 1) :], 1)
            full = torch.cat([window, x[row].double().T], 1)
            y_ref = F.silu(F.conv1d(full[None], conv_w[:, None, :], groups=C))[0].T
            yield "conv output", y[row], y_ref
            S = true_state[i]
            for t in range(T):
                S, o_t = _gdn_step64(S, q[row, t].double(), k[row, t].double(), v[row, t].double(),
                                     a[row, t].double(), b[row, t].double(), A_log, dt_bias)  # fmt: skip
                yield "output", o[row, t], o_t
                if t < accepted[row]:
                    true_state[i] = S
                    conv_hist[i].append(x[row, t].double())
        ring_phase[slot_ids] ^= 1  # the caller's rollback: a cursor move
        pending_len[slot_ids] = accepted.int()

        committed = R.fold_pending(state, ring_k, ring_u, ring_g, ring_phase, pending_len, slot_of)
        for i in range(n_seq):
            yield "committed state", committed[i], true_state[i]
            n = int(pending_len[slot_of[i]])
            yield "conv window", conv_buf[slot_of[i], n : n + KW - 1], torch.stack(conv_hist[i][-(KW - 1) :])


@pytest.mark.parametrize("policy", [REFERENCE, ALL_KERNELS], ids=["reference", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seed", [0, 1])
def test_replay_matches_float64_recurrence(policy, dtype, seed):
    out_tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    n_checked = 0
    for name, got, want in _run(policy, dtype, seed):
        tol = out_tol if name in ("output", "conv output") else dict(rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.double(), want, **tol, msg=lambda m, name=name: f"{name}: {m}")
        n_checked += 1
    assert n_checked > 20


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_batch_invariant_kernel_matches_float64_recurrence(dtype):
    """The sequential kernel of batch-invariant steps, over T = 1 and T > 1 with 0, 1 and several pending tokens,
    several column tiles per head (Dv = 64) and GQA."""
    out_tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    seen = []
    ts = [1, 6, 1, 5, 1, 1, 4]
    for name, got, want in _run(ALL_KERNELS.for_steps(), dtype, 8, steps=len(ts), shape=(1, 2, 16, 64, 8), ts=ts,
                                pending_seen=seen):  # fmt: skip
        tol = out_tol if name in ("output", "conv output") else dict(rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.double(), want, **tol, msg=lambda m, name=name: f"{name}: {m}")
    assert {min(n, 2) for T, n in seen if T > 1} == {0, 1, 2}


def test_batch_invariant_block_gives_each_token_its_one_token_bits():
    """A verify block of 6 tokens for two sequences, against the second sequence's tokens decoded alone one by
    one: the same output bits, and after folding, the same state bits. The WY chunk path rounds differently."""
    Hk, Hv, Dk, Dv, Tmax, T = 1, 2, 16, 32, 8, 6
    gen = torch.Generator().manual_seed(12)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k, v, a, b = r(2, T, Hk, Dk), r(2, T, Hk, Dk), r(2, T, Hv, Dv), r(2, T, Hv), r(2, T, Hv)
    A_log, dt_bias, state0 = r(Hv) - 2, r(Hv), r(3, Hv, Dk, Dv) * 0.1
    slots = torch.tensor([2, 0])

    def fresh():
        return [state0.clone(), torch.zeros(3, 2, Tmax, Hk, Dk), torch.zeros(3, 2, Tmax, Hv, Dv),
                torch.zeros(3, 2, Tmax, Hv), torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)]

    def step(buf, rows, t0, t1, sl, policy=STEP):
        o = replay_verify(q[rows, t0:t1], k[rows, t0:t1], v[rows, t0:t1], a[rows, t0:t1], b[rows, t0:t1], A_log,
                          dt_bias, *buf, sl, policy=policy)  # fmt: skip
        buf[4][sl] ^= 1
        buf[5][sl] = t1 - t0  # all accepted
        return o

    blocked, alone = fresh(), fresh()
    block = step(blocked, slice(0, 2), 0, T, slots)
    ones = torch.cat([step(alone, slice(1, 2), t, t + 1, slots[1:]) for t in range(T)], 1)
    assert torch.equal(ones[0], block[1])
    empty = (slice(0, 0), 0, 0, slots[:0])
    step(blocked, *empty), step(alone, *empty)
    last = slots[1:]
    for buf in (blocked, alone):  # one more token each, folding the pending ones in the kernel
        buf[5][last] = torch.tensor([T if buf is blocked else 1], dtype=torch.int32)
    assert torch.equal(step(blocked, slice(1, 2), 0, 1, last), step(alone, slice(1, 2), 0, 1, last))
    assert torch.equal(blocked[0][2], alone[0][2])
    chunked = step(fresh(), slice(0, 2), 0, T, slots, ALL_KERNELS)
    assert not torch.equal(chunked, block)
    torch.testing.assert_close(chunked, block, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("block_v", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_narrow_column_tiles_match_float64_recurrence(block_v, dtype):
    """The 16- and 32-column tiles launch_config picks for small batches, over several tiles per head
    (Dv = 64), GQA (2 value heads per key head) and a step schedule that reaches every path of the
    kernel: T = 1 and T > 1, each with 0, 1 and several pending tokens."""
    out_tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    seen = []
    ts = [1, 6, 1, 5, 1, 1, 4]
    for name, got, want in _run(ALL_KERNELS, dtype, 8, steps=len(ts), shape=(1, 2, 16, 64, 8), ts=ts,
                                launch=dict(block_v=block_v), pending_seen=seen):  # fmt: skip
        tol = out_tol if name in ("output", "conv output") else dict(rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.double(), want, **tol, msg=lambda m, name=name: f"{name}: {m}")
    for one_token in (True, False):
        counts = {min(n, 2) for T, n in seen if (T == 1) == one_token}
        assert counts == {0, 1, 2}, f"T{'=' if one_token else '>'}1 steps saw pending counts {counts}"


@pytest.mark.parametrize("key_chunk,stages,Dk", [(16, 2, 24), (16, 3, 48), (32, 1, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_block_kernel_key_chunks_match_float64_recurrence(key_chunk, stages, Dk, dtype):
    """T > 1 steps stream the state in key chunks: several chunks, a last chunk cut by Dk (24 of 32) or wholly
    past it (48 of 64), and one chunk for the whole tile, each with and without the pipeliner's stages."""
    out_tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    seen = []
    ts = [5, 3, 8, 1, 6]
    launch = dict(block_v=16, key_chunk=key_chunk, stages=stages)
    for name, got, want in _run(ALL_KERNELS, dtype, 7, steps=len(ts), shape=(1, 2, Dk, 32, 8), ts=ts, launch=launch,
                                pending_seen=seen):  # fmt: skip
        tol = out_tol if name in ("output", "conv output") else dict(rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.double(), want, **tol, msg=lambda m, name=name: f"{name}: {m}")
    assert {min(n, 2) for T, n in seen if T > 1} >= {0, 2}  # nothing pending, and a rank-n fold


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_deep_grid_launch_matches_float64_recurrence(monkeypatch, dtype):
    """What a deep grid launches (one prep program per key head for its 2 or 4 value heads, with two 32-key chunks
    in the block kernel), forced on a small grid: every grid counts as deep."""
    import ocria.plugins.replay_ssm.kernel as kernel

    monkeypatch.setattr(kernel, "DEEP_GRID_PROGRAMS_PER_SM", 0)
    out_tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    for shape in ((1, 2, 64, 32, 8), (2, 8, 16, 32, 8)):  # two key chunks; 4 value heads per key head
        ts = [5, 3, 8, 1, 6]
        for name, got, want in _run(ALL_KERNELS, dtype, 7, steps=len(ts), shape=shape, ts=ts, launch=dict(block_v=32)):
            tol = out_tol if name in ("output", "conv output") else dict(rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(got.double(), want, **tol, msg=lambda m, name=name: f"{name}: {m}")


class _LaunchSpy:
    """Stands in for a Triton kernel: records each launch's keyword arguments, then launches the kernel."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(kwargs)
            return self.kernel[grid](*args, **kwargs)

        return launch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_deep_grid_block_launch_caps_registers_for_five_programs_per_sm(monkeypatch, dtype):
    """A deep grid's own launch caps the key-chunked block kernel's tf32 build (bf16 inputs) at
    ``KEY_CHUNK_MAX_REGISTERS``; the tf32x3 build (fp32 inputs) keeps the deep-grid cap, and a launch with a tile
    given is not capped. One SM and every grid deep, so a small shape is what a large batch launches on the H200;
    outputs and states still match the float64 recurrence."""
    import ocria.plugins.replay_ssm.kernel as kernel

    monkeypatch.setattr(kernel, "_sm_count", lambda device: 1)
    monkeypatch.setattr(kernel, "DEEP_GRID_PROGRAMS_PER_SM", 0)
    spy = _LaunchSpy(kernel._verify_block_kernel)
    monkeypatch.setattr(kernel, "_verify_block_kernel", spy)
    auto_cap = kernel.KEY_CHUNK_MAX_REGISTERS if dtype == torch.bfloat16 else kernel.DEEP_GRID_MAX_REGISTERS
    out_tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    for launch in (None, dict(block_v=64)):
        spy.launches.clear()
        for name, got, want in _run(ALL_KERNELS, dtype, 3, steps=3, shape=(1, 2, 64, 64, 8), ts=[5, 1, 8],
                                    launch=launch):
            tol = out_tol if name in ("output", "conv output") else dict(rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(got.double(), want, **tol, msg=lambda m, n=name: f"{n}: {m}")
        cap = auto_cap if launch is None else None
        assert [(kw["BKC"], kw.get("maxnreg")) for kw in spy.launches] == [(32, cap)] * 2


def test_key_chunking_streams_wide_tiles_and_keeps_narrow_tiles_whole():
    """32-key chunks in 3 stages from the 32-column tiles up, the whole tile for the 16-column tiles launch_config
    picks for the smallest grids (where one program's latency is the step's)."""
    picks = {B: key_chunking(launch_config(B, 32, 128, 132)[0], 128) for B in (1, 4, 8, 32)}
    assert picks == {1: (128, 1), 4: (32, 3), 8: (32, 3), 32: (32, 3)}


def test_launch_config_fills_the_gpu_at_small_batch():
    """Qwen3.5 heads (32 value heads of 128) on 132 SMs: narrow tiles until the grid has two programs
    per SM, the 64-column tile once it has, and the register cap once it has eight."""
    picks = {B: launch_config(B, 32, 128, 132) for B in (1, 2, 4, 8, 16, 32, 64)}
    assert picks == {1: (16, 4, None), 2: (16, 4, None), 4: (32, 4, None), 8: (64, 4, None), 16: (64, 4, None),
                     32: (64, 4, 168), 64: (64, 4, 168)}  # fmt: skip
    for B, (bv, _, cap) in picks.items():
        programs = (128 // bv) * 32 * B
        assert programs >= 2 * 132 or bv == 16
        assert bv == 64 or (128 // (2 * bv)) * 32 * B < 2 * 132  # the next wider tile would not fill it
        assert (cap is not None) == (programs >= 8 * 132)


def test_nothing_pending_leaves_state_bit_identical():
    """With no pending tokens the fold is a no-op: the checkpoint state is not rewritten, for T = 1
    (rank-1 path) and T > 1 (chunk path), and the outputs match the reference."""
    for T in (1, 5):
        verify, _ = _small_case(T=T)
        verify = list(verify)
        verify[12] = torch.zeros_like(verify[12])
        mine, theirs = [t.clone() for t in verify], [t.clone() for t in verify]
        torch.testing.assert_close(replay_verify(*mine, policy=ALL_KERNELS), R.replay_verify_reference(*theirs),
                                   rtol=1e-4, atol=1e-5)  # fmt: skip
        assert torch.equal(mine[7], verify[7])


def _small_case(T=5, Tmax=8, B=2, S=4, Hk=1, Hv=2, D=16, C=12, KW=4):
    gen = torch.Generator().manual_seed(7)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    slot_ids = torch.tensor([3, 1])[:B]
    verify = (
        r(B, T, Hk, D), r(B, T, Hk, D), r(B, T, Hv, D), r(B, T, Hv), r(B, T, Hv), r(Hv) - 2, r(Hv),
        r(S, Hv, D, D) * 0.1, R.l2norm(r(S, 2, Tmax, Hk, D)), r(S, 2, Tmax, Hv, D), -r(S, 2, Tmax, Hv).abs(),
        torch.tensor([0, 1, 1, 0], dtype=torch.int32),
        torch.tensor([2, Tmax, 0, 3], dtype=torch.int32), slot_ids,
    )  # fmt: skip
    conv = (r(B, T, C), r(C, KW), r(S, KW - 1 + Tmax, C), verify[12], slot_ids)
    return verify, conv


def test_kernel_and_reference_agree_on_buffers():
    verify, conv = _small_case()
    cases = ((replay_verify, R.replay_verify_reference, verify),
             (causal_conv_verify, R.causal_conv_verify_reference, conv))
    for op, ref, args in cases:
        mine = [t.clone() for t in args]
        theirs = [t.clone() for t in args]
        torch.testing.assert_close(op(*mine, policy=ALL_KERNELS), ref(*theirs), rtol=1e-4, atol=1e-5)
        for got, want in zip(mine, theirs, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _as_fused_views(*parts: torch.Tensor, unused: int = 3) -> list[torch.Tensor]:
    """The same values as views into one [B, T, sum of widths + unused] tensor, like a fused projection's outputs
    (the unused columns make the rows not dense)."""
    B, T = parts[0].shape[:2]
    flat = [p.reshape(B, T, -1) for p in parts]
    fused = torch.cat(flat + [torch.zeros(B, T, unused)], dim=-1)
    views = torch.split(fused, [f.shape[-1] for f in flat] + [unused], dim=-1)[:-1]
    return [v.unflatten(-1, p.shape[2:]) for v, p in zip(views, parts, strict=True)]


@pytest.mark.parametrize("T,B", [(5, 2), (1, 2), (5, 1)])
def test_kernels_read_strided_token_rows(T, B):
    """q/k/v/a/b and the conv input arrive as column slices of fused GEMM outputs: the kernels take
    them as they are (no copy) and give bit-identical outputs and buffers to contiguous inputs."""
    verify, conv = _small_case(T=T, B=B)
    strided_verify = (*_as_fused_views(*verify[:5]), *verify[5:])
    strided_conv = (*_as_fused_views(conv[0]), *conv[1:])
    assert all(token_rows(t)[0] is t for t in strided_verify[:5] + strided_conv[:1])
    for op, args, strided, n in ((replay_verify, verify, strided_verify, 5),
                                 (causal_conv_verify, conv, strided_conv, 1)):
        plain = [t.clone() for t in args]
        views = [*strided[:n], *(t.clone() for t in args[n:])]
        assert torch.equal(op(*plain, policy=ALL_KERNELS), op(*views, policy=ALL_KERNELS))
        assert all(torch.equal(x, y) for x, y in zip(plain[n:], views[n:], strict=True))


def test_opcheck():
    verify, conv = _small_case()
    torch.library.opcheck(torch.ops.ocria.replay_verify.default, (*verify, 0))
    torch.library.opcheck(torch.ops.ocria.causal_conv_verify.default, (*conv, 0))


def test_ops_compile_whole_and_mutate_their_buffers_as_eager():
    """torch.compile takes both ops without a graph break (fullgraph; their declared mutations are functionalized)
    and the compiled call returns and writes what the eager call does; a tensor made from the output's traced shape
    (what the fake implementation says) matches the real one."""
    verify, conv = _small_case()
    for op, args in ((torch.ops.ocria.replay_verify, verify), (torch.ops.ocria.causal_conv_verify, conv)):
        torch._dynamo.reset()
        eager, compiled = [t.clone() for t in args], [t.clone() for t in args]
        want = op(*eager, 0)

        def f(*xs, op=op):
            out = op(*xs, 0)
            return out, out.new_zeros(out.shape)

        got, zeros = torch.compile(f, backend="aot_eager", fullgraph=True)(*compiled)
        assert torch.equal(got, want) and zeros.shape == want.shape and zeros.dtype == want.dtype
        assert all(torch.equal(c, e) for c, e in zip(compiled, eager, strict=True))


def test_warp_specialized_kernel_needs_sm90_its_triton_and_its_shapes(monkeypatch):
    """The Hopper kernel (Gluon) takes bf16 Qwen3.5-like GDN heads on sm_90 with the Triton it was checked with, and
    nothing else: every other GPU, Triton, dtype or shape stays on the Triton kernels."""
    import triton

    from ocria.plugins.replay_ssm import hopper

    ok = (torch.device("cuda", 0), torch.bfloat16, 16, 32, 128, 128, 16)  # device, dtype, Hk, Hv, Dk, Dv, Tmax
    monkeypatch.setattr(hopper, "capability", lambda index: (9, 0))
    monkeypatch.setattr(hopper, "CHECKED_TRITON", (triton.__version__,))
    assert hopper.ws_supported(*ok) is (hopper.gluon is not None)
    assert hopper.ws_supported(*ok[:-1], 8) is (hopper.gluon is not None)  # a shorter ring pads to 16 tokens
    changes = {0: torch.device("cpu"), 1: torch.float32, 3: 48, 4: 64, 5: 96, 6: 32}
    for i, value in changes.items():
        assert not hopper.ws_supported(*ok[:i], value, *ok[i + 1 :]), (i, value)
    monkeypatch.setattr(hopper, "capability", lambda index: (10, 0))
    assert not hopper.ws_supported(*ok)
    monkeypatch.setattr(hopper, "capability", lambda index: (9, 0))
    monkeypatch.setattr(hopper, "CHECKED_TRITON", ("0.1",))
    assert not hopper.ws_supported(*ok)


def test_warp_specialized_kernel_takes_default_verify_blocks_only(monkeypatch):
    """Where the Hopper kernel is supported, a default T > 1 launch goes to it, with the token rows' strides, and
    returns the output it wrote; T = 1, a tuned launch, a batch-invariant step, the ``replay_ssm_ws`` path disabled
    and key or query rows Triton cannot prove 16-byte aligned (its cp.async copies would not compile: seen on the
    H200 with a 1032-element row) stay on the Triton kernels and match the reference."""
    from ocria.plugins.replay_ssm import hopper

    calls = []

    def ws_verify(*args):
        calls.append(args)
        args[14].fill_(7.0)  # o

    monkeypatch.setattr(hopper, "ws_supported", lambda *args: True)
    monkeypatch.setattr(hopper, "ws_verify", ws_verify)
    verify, _ = _small_case(T=5)
    strided = (*_as_fused_views(*verify[:5], unused=12), *verify[5:])  # rows of 80 elements
    o = replay_verify_kernel(*strided)
    assert len(calls) == 1 and calls[0][14] is o and torch.equal(o, torch.full_like(o, 7.0))
    assert calls[0][15] == 5 and calls[0][16] == tuple(token_rows(t)[1] for t in strided[:5])

    def matches_reference(args, **launch):  # inputs as they are (a clone would make views dense), buffers copied
        mine, theirs = [*args[:7], *(t.clone() for t in args[7:])], [*args[:7], *(t.clone() for t in args[7:])]
        torch.testing.assert_close(replay_verify_kernel(*mine, **launch), R.replay_verify_reference(*theirs),
                                   rtol=1e-4, atol=1e-5)  # fmt: skip

    matches_reference((*_as_fused_views(*verify[:5], unused=4), *verify[5:]))  # rows of 72: not divisible by 16
    shifted = _as_fused_views(verify[3], *verify[:3], verify[4], unused=12)  # rows of 80, a first: q 8 bytes in
    matches_reference((*shifted[1:4], shifted[0], shifted[4], *verify[5:]))
    matches_reference(_small_case(T=1)[0])
    matches_reference(verify, key_chunk=16)
    matches_reference(verify, block_v=16)
    matches_reference(verify, launch=DEFAULT_LAUNCH | Launch.INVARIANT)
    matches_reference(verify, launch=DEFAULT_LAUNCH & ~Launch.REPLAY_SSM_WS)
    assert len(calls) == 1
