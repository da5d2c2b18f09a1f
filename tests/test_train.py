"""ocria.train on CPU: chunked GDN vs the sequential rule, training steps, exact resume, drafter
distillation (against the inference drafting path), export that loads unchanged, the CLI end to end."""

import dataclasses
import hashlib
import io
import json
import math

import pytest
import torch
import yaml

from ocria.builder.presets import CONFIG_DIR, SHIPPED, load_preset, preset_checkpoints
from ocria.data import generate
from ocria.data.splits import EVAL_SPLITS
from ocria.errors import ConfigError, OcriaError
from ocria.models import DFlash2Drafter, DrafterCache, OCRiaForConditionalGeneration
from ocria.models.gdn import delta_step, gated_delta_rule, l2norm
from ocria.plugins.policy import REFERENCE
from ocria.runtime.processor import Processor
from ocria.train import checkpoint as ckpt
from ocria.train.__main__ import main as train_main
from ocria.train.data import IGNORE, _Batches, collate, encode, image_swap_pair, loader
from ocria.train.distill import block_forward, build_drafter, drafter_loss, greedy_sequences, sample_blocks
from ocria.train.evaluate import divergences
from ocria.train.export import export_model, load_exported, ship
from ocria.train.gdn_chunked import chunk_gated_delta_rule, chunked_gdn
from ocria.train.optim import FlatAdamW, lr_at
from ocria.train.run import Run, TrainConfig
from ocria.train.target import (
    DT_RANGE,
    build_target,
    image_reliance,
    init_gdn_memory,
    target_loss,
)
from ocria.train.vision_batched import batched_vision, batched_vision_forward


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: intra-op threads only contend (on a loaded CI machine, ten times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_preset(tmp_path_factory) -> str:
    """The ocria-mini preset shrunk for fast CPU tests (same tokenizer, processor and layer pattern)."""
    raw = yaml.safe_load((CONFIG_DIR / "presets" / "ocria-mini.yaml").read_text())
    raw["target"]["text_config"].update(hidden_size=64, intermediate_size=96, num_attention_heads=2,
                                        num_key_value_heads=1, head_dim=32, linear_num_key_heads=1,
                                        linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16)
    raw["target"]["text_config"]["rope_parameters"]["mrope_section"] = [2, 1, 1]  # rotary dim 8 of head_dim 32
    raw["target"]["vision_config"].update(depth=1, hidden_size=32, intermediate_size=48, num_heads=2,
                                          out_hidden_size=64)
    raw["drafter"].update(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=32)
    path = tmp_path_factory.mktemp("preset") / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.fixture(scope="module")
def batch(tiny_preset):
    return next(iter(loader(load_preset(tiny_preset).assets, 2, 0, 0, kind="line")))  # short pages: fast tests


def _gdn_inputs(dtype, B=2, T=45, hk=2, hv=4, dk=8, dv=6, seed=0):
    """Fresh leaves (same values for every dtype): T is not a multiple of the chunk, GQA heads, a nonzero state."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, hk, dk, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, T, hv, dv, generator=g, dtype=torch.float64)
    gate = -torch.rand(B, T, hv, generator=g, dtype=torch.float64) * 3
    beta = torch.rand(B, T, hv, generator=g, dtype=torch.float64)
    state = torch.randn(B, hv, dk, dv, generator=g, dtype=torch.float64)
    return [x.to(dtype).requires_grad_(True) for x in (q, k, v, gate, beta, state)]


def _sequential_f64(q, k, v, g, beta, state):
    """The sequential rule's own steps (l2norm, delta_step) in float64."""
    rep, dk = v.shape[2] // k.shape[2], k.shape[-1]
    qn = (l2norm(q) * dk**-0.5).repeat_interleave(rep, dim=2)
    kn = l2norm(k).repeat_interleave(rep, dim=2)
    S, outs = state, []
    for t in range(q.shape[1]):
        S = delta_step(S, kn[:, t], v[:, t], g[:, t], beta[:, t])
        outs.append(torch.einsum("bhkv,bhk->bhv", S, qn[:, t]))
    return torch.stack(outs, 1), S


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("chunk", [8, 16, 64])
def test_chunked_gdn_matches_sequential_in_value_and_gradient(chunk):
    ref_in = _gdn_inputs(torch.float64)
    o_ref, s_ref = _sequential_f64(*ref_in)
    w_o, w_s = torch.randn_like(o_ref), torch.randn_like(s_ref)
    ((o_ref * w_o).sum() + (s_ref * w_s).sum()).backward()

    inp = _gdn_inputs(torch.float32)
    o, s = chunk_gated_delta_rule(*inp, chunk=chunk)
    assert o.dtype == torch.float32 and o.shape == o_ref.shape
    assert _rel(o.double(), o_ref) < 1e-5 and _rel(s.double(), s_ref) < 1e-5
    ((o * w_o.float()).sum() + (s * w_s.float()).sum()).backward()
    for x, r in zip(inp, ref_in):
        assert _rel(x.grad.double(), r.grad) < 1e-4

    seq_in = _gdn_inputs(torch.float32)  # and against the model's own sequential function
    o_seq, s_seq = gated_delta_rule(*seq_in)
    assert _rel(o, o_seq) < 1e-5 and _rel(s, s_seq) < 1e-5


def test_chunked_gdn_in_the_model_matches_and_restores(tiny_preset, batch):
    model = build_target(load_preset(tiny_preset).target, 0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
        ref = model(batch.input_ids[:1, :120], batch.pixel_values[: int(batch.image_grid_thw[0].prod())],
                    batch.image_grid_thw[:1])
        with chunked_gdn(16):
            from ocria.models import gdn
            assert gdn.gated_delta_rule is not gated_delta_rule
            fast = model(batch.input_ids[:1, :120], batch.pixel_values[: int(batch.image_grid_thw[0].prod())],
                         batch.image_grid_thw[:1])
    assert gdn.gated_delta_rule is gated_delta_rule
    assert _rel(fast, ref) < 1e-5


def test_batched_vision_matches_the_per_image_loop(tiny_preset):
    torch.manual_seed(0)
    vis = build_target(load_preset(tiny_preset).target, 0).model.visual
    with torch.no_grad():
        for p in vis.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    grid = torch.tensor([[1, 4, 6], [1, 8, 4], [1, 4, 6], [1, 2, 2]])  # repeated and distinct sizes
    dim = 3 * 2 * vis.cfg.patch_size**2
    pixels = torch.randn(int(grid.prod(-1).sum()), dim)
    ref = vis(pixels, grid)
    with batched_vision():
        out = vis(pixels, grid)
    assert vis.forward.__func__ is not batched_vision_forward
    assert _rel(out, ref) < 1e-5
    params = list(vis.parameters())
    for a, b in zip(torch.autograd.grad(ref.square().sum(), params),
                    torch.autograd.grad(batched_vision_forward(vis, pixels, grid).square().sum(), params)):
        assert _rel(b, a) < 1e-5


def test_batches_teach_only_the_answer(batch):
    for b in range(2):
        keep = batch.labels[b] != IGNORE
        first = int(keep.nonzero()[0])
        assert first == int(batch.prompt_len[b]) - 1  # the last prompt token predicts the first answer token
        assert int(keep.sum()) == int(batch.seq_len[b] - batch.prompt_len[b])
        assert int(batch.labels[b][keep][-1]) == 2  # the answer ends with <|im_end|>
        assert torch.equal(batch.labels[b, first:first + 5], batch.input_ids[b, first + 1:first + 6])


def test_training_prompt_is_the_inference_prompt_of_the_png(tiny_preset):
    """Training encodes the rendered page directly; serving decodes its PNG: same ids and pixels."""
    processor = Processor(load_preset(tiny_preset).assets)
    for seed in range(3):
        doc = generate(seed)
        png = io.BytesIO()
        doc.image.save(png, format="PNG")
        served, trained = processor.prepare(png.getvalue()), encode(processor, doc)
        assert trained.pixel_bytes.dtype == torch.uint8  # a quarter of the bytes through the loader
        assert torch.equal(collate([trained], 0).pixel_values, served.pixel_values)
        assert torch.equal(trained.input_ids[:trained.prompt_len], served.input_ids)


def test_pin_thread_pins_every_tensor_of_a_batch(batch, monkeypatch):
    """The DataLoader pins objects through their ``pin_memory`` method; without one a Batch stayed pageable."""
    from torch.utils.data._utils.pin_memory import pin_memory

    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t, *a, **k: pinned.append(t) or t.clone())
    out = pin_memory(batch)
    assert type(out) is type(batch) and len(pinned) == len(dataclasses.fields(batch))
    assert out.pixel_bytes.dtype == torch.uint8 and torch.equal(out.pixel_values, batch.pixel_values)


def _first_gdn_at_answer(model, batch, pixel_values):
    """Output of the first decoder layer (a GDN layer) at the last prompt token of sample 0."""
    layer = model.text.layers[0]
    assert layer.layer_type == "linear_attention"
    x = model.embed(batch.input_ids, pixel_values, batch.image_grid_thw)
    cos, sin = model.text.rotary(batch.positions, x.dtype)
    out, delta = layer(x, None, cos, sin, "full", None, None, None, None, REFERENCE)
    return (out + delta)[0, int(batch.prompt_len[0]) - 1]


def test_fresh_target_gdn_layers_carry_the_image_to_the_answer(tiny_preset, batch):
    """The instruction text (~40 tokens) sits between the image and the answer. With the engine's random
    GDN gates (dt_bias = 1, A >= 1) every head keeps < 0.3 of its state per token, so no GDN layer saw
    the image at the answer (exactly zero change) and training never recovered (the first H200 runs)."""
    model = build_target(load_preset(tiny_preset).target, 0).eval()
    with torch.no_grad():
        seen = _first_gdn_at_answer(model, batch, batch.pixel_values)
        other = _first_gdn_at_answer(model, batch, -batch.pixel_values)
        assert _rel(other, seen) > 1e-3
        for m in model.modules():  # the engine's random gates: the image is forgotten before the answer
            if hasattr(m, "dt_bias"):
                m.dt_bias.fill_(1.0)
        forgot = _first_gdn_at_answer(model, batch, batch.pixel_values)
        assert _rel(_first_gdn_at_answer(model, batch, -batch.pixel_values), forgot) < 1e-6


def test_white_paper_is_the_zero_input(tiny_preset):
    """Pages are mostly blank. Normalised around white (image_mean 1), a blank patch is exactly zero, so
    the patch embedding sees only the ink; around grey (mean 0.5) every blank patch fed the same large
    input, and training run 4 grew that common response (norm ~340) over the ink's (~20) until the
    merger's LayerNorm made all image tokens alike: an image-blind model."""
    import io

    from PIL import Image

    from ocria.runtime.processor import Processor

    png = io.BytesIO()
    Image.new("RGB", (64, 32), "white").save(png, format="PNG")
    assert torch.count_nonzero(Processor(load_preset(tiny_preset).assets).prepare(png.getvalue()).pixel_values) == 0


def test_image_reliance_is_zero_for_an_image_blind_model(tiny_preset):
    """Same-size pages, so swapping images changes nothing but the pixels: a model whose vision output
    is zero measures exactly 0; the fresh model (which sees the image) does not."""
    from ocria.data import generate, split_seeds
    from ocria.runtime.processor import Processor

    preset = load_preset(tiny_preset)
    docs = [generate(seed, "line") for seed in split_seeds("heldout", 3)]
    docs = [dataclasses.replace(d, image=d.image.resize((256, 48))) for d in docs]
    own, swapped = image_swap_pair(Processor(preset.assets), docs)
    assert torch.equal(own.input_ids, swapped.input_ids) and not torch.equal(own.pixel_values, swapped.pixel_values)
    model = build_target(preset.target, 0)
    assert abs(image_reliance(model, own, swapped)) > 1e-4 and model.training
    with torch.no_grad():
        model.model.visual.merger.linear_fc2.weight.zero_()
        model.model.visual.merger.linear_fc2.bias.zero_()
    assert image_reliance(model, own, swapped) == 0.0


def test_gdn_memory_init_is_seeded_and_in_range(tiny_preset):
    a, b = (build_target(load_preset(tiny_preset).target, 0) for _ in range(2))
    c = build_target(load_preset(tiny_preset).target, 1)
    biases = [[m.dt_bias.detach() for m in x.modules() if hasattr(m, "dt_bias")] for x in (a, b, c)]
    assert len(biases[0]) == 6
    assert all(torch.equal(x, y) for x, y in zip(biases[0], biases[1]))
    assert not all(torch.equal(x, y) for x, y in zip(biases[0], biases[2]))
    dt = torch.nn.functional.softplus(torch.cat(biases[0]).double())
    assert float(dt.min()) >= DT_RANGE[0] * 0.999 and float(dt.max()) <= DT_RANGE[1] * 1.001
    init_gdn_memory(a, 0)
    assert all(torch.equal(m.dt_bias, x) for m, x in zip((m for m in a.modules() if hasattr(m, "dt_bias")), biases[1]))


def test_target_training_steps_reduce_the_loss(tiny_preset, batch):
    torch.manual_seed(0)
    model = build_target(load_preset(tiny_preset).target, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    with chunked_gdn():
        for _ in range(12):
            loss = target_loss(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert losses[0] > math.log(512) - 1
    assert losses[-1] < losses[0] - 1.0


def test_flat_adamw_follows_torch_adamw_and_the_schedule():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    ours = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    ours.load_state_dict(ref.state_dict())
    decay = [p for p in ref.parameters() if p.dim() >= 2]
    plain = [p for p in ref.parameters() if p.dim() < 2]
    torch_opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}],
                                  lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    flat = FlatAdamW(ours, lr=1e-2, weight_decay=0.1)
    x, y = torch.randn(64, 8), torch.randn(64, 3)
    for _ in range(20):
        for model, opt in ((ref, torch_opt), (ours, flat)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    for a, b in zip(ref.parameters(), ours.parameters()):
        assert _rel(b, a) < 5e-3  # bf16 moments
    assert flat.state_tensors("o")["o.0.exp_avg"].dtype == torch.bfloat16
    lrs = [lr_at(s, 100, 1.0, 10) for s in range(100)]
    assert lrs[0] == 0.1 and lrs[9] == 1.0 and all(a >= b for a, b in zip(lrs[10:], lrs[11:])) and lrs[-1] > 0.05


def _cfg(**over) -> TrainConfig:
    base = dict(data_kind="line", target_steps=4, target_batch=2, drafter_steps=3,
                drafter_batch=2, workers=0, eval_docs=2, eval_batch=2, eval_max_tokens=12, log_every=1,
                target_warmup=2, drafter_warmup=2)
    base.update(over)
    return TrainConfig(**base)


def test_line_curriculum_then_every_kind(tiny_preset, tmp_path):
    run = Run(tmp_path, _cfg(preset=tiny_preset, data_kind="", line_steps=2), 600)
    got = [b.input_ids for _, b in zip(range(4), run._batches(1, 1, 3))]  # from batch 1: lines 1, 2; all 3, 4
    assets = load_preset(tiny_preset).assets
    lines = [b.input_ids for _, b in zip(range(2), loader(assets, 1, 1, 0, kind="line"))]
    every = [b.input_ids for _, b in zip(range(2), loader(assets, 1, 3, 0))]
    assert all(torch.equal(a, b) for a, b in zip(got, lines + every, strict=True))
    later = next(iter(run._batches(1, 5, 3)))  # resumed past the curriculum: no line batches
    assert torch.equal(later.input_ids, next(iter(loader(assets, 1, 5, 0))).input_ids)


def test_resume_gives_identical_next_step_loss(tiny_preset, tmp_path):
    cfg = _cfg(preset=tiny_preset, data_kind="", line_steps=3)  # the split at step 2 resumes in the curriculum
    whole = Run(tmp_path / "a", cfg, 600)
    assert whole.stage_target()
    split = Run(tmp_path / "b", cfg, 600, max_steps=2)
    assert not split.stage_target()
    meta = split.run["checkpoint"]
    assert meta["stage"] == "target" and meta["step"] == 2 and meta["cursor"] == 2
    assert all((tmp_path / "b" / f).stat().st_size <= ckpt.MAX_SHARD_BYTES for f in meta["files"])
    resumed = Run(tmp_path / "b", cfg, 600)
    assert resumed.stage_target()
    a = [h["loss"] for h in whole.run["history"]["target"]]
    b = [h["loss"] for h in resumed.run["history"]["target"]]
    assert len(a) == len(b) == 4 and a == b
    assert all(0 <= h["data_wait"] <= 1 for h in whole.run["history"]["target"])  # the loop's wait for batches
    exported = [(tmp_path / r / "target" / "model.safetensors").read_bytes() for r in ("a", "b")]
    assert exported[0] == exported[1]


def test_non_finite_gradients_leave_the_weights_and_stop_the_run(tiny_preset, tmp_path, monkeypatch):
    """A non-finite loss skips its update on the device (weights and moments unchanged, no host sync); a run
    of them stops the stage at the next log line with a clear error."""
    from ocria.train import run as run_module

    real_loss = run_module.target_loss
    monkeypatch.setattr(run_module, "target_loss", lambda model, batch: real_loss(model, batch) * float("nan"))
    trainer = Run(tmp_path / "s", _cfg(preset=tiny_preset, target_steps=30, log_every=5), 600)
    snapshots = []
    monkeypatch.setattr(run_module.FlatAdamW, "step", _recording_step(run_module.FlatAdamW.step, snapshots))
    with pytest.raises(OcriaError, match="20 steps in a row with a non-finite gradient"):
        trainer.stage_target()
    assert len(snapshots) == 20 and all(torch.equal(s, snapshots[0]) for s in snapshots)


def _recording_step(step, snapshots):
    """FlatAdamW.step that records the first group's weights and first moments after each update."""
    def recorded(opt, apply=None):
        step(opt, apply)
        group = opt.param_groups[0]
        snapshots.append(torch.cat([p.detach().reshape(-1) for p in group["params"]] + [group["exp_avg"].float()]))
    return recorded


def test_zero_steps_means_the_steps_that_fit_the_minutes(tiny_preset, tmp_path):
    run = Run(tmp_path, _cfg(preset=tiny_preset, target_steps=0, target_minutes=0.001, target_warmup=11,
                             target_batch=1, log_every=100), 600)
    assert run.stage_target()
    fixed = run.run["config"]["target_steps"]
    assert fixed == 11 and run.run["stages"]["target"]["steps"] == fixed == run.cfg.target_steps
    assert run.call["config_changes"] == {"target_steps": fixed}


def test_minutes_are_timed_by_the_next_call_when_one_stops_inside_the_warmup(tiny_preset, tmp_path):
    cfg = _cfg(preset=tiny_preset, target_steps=0, target_minutes=0.001, target_warmup=15, target_batch=1,
               log_every=100)
    assert not Run(tmp_path, cfg, 600, max_steps=2).stage_target()  # stopped at step 2, nothing timed yet
    run = Run(tmp_path, cfg, 600)
    assert run.stage_target()  # timed steps 7..14 of the warmup
    assert run.run["config"]["target_steps"] == run.run["stages"]["target"]["steps"] == 15
    late = Run(tmp_path / "late", cfg, 600, max_steps=6)
    assert not late.stage_target()
    with pytest.raises(OcriaError, match="9 warmup steps are left.*--set target_steps=N"):
        Run(tmp_path / "late", cfg, 600).stage_target()


def test_sharded_state_round_trips_and_replaces_old_shards(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt, "MAX_SHARD_BYTES", 4096)
    tensors = {f"t{i}": torch.randn(300) for i in range(10)}
    tensors["big"] = torch.randn(3000)  # 12 kB: cut into parts of at most one shard
    tensors["big2d"] = torch.randn(40, 50)
    run: dict = {"checkpoint": None}
    first = ckpt.save_state(tmp_path, run, tensors, "x-1")
    assert len(first) > 2 and all((tmp_path / f).stat().st_size <= 4096 + 1024 for f in first)
    run["checkpoint"] = {"stage": "x", "step": 2}  # as Run.save() rebuilds it: no file list
    second = ckpt.save_state(tmp_path, run, tensors, "x-2")
    assert not any((tmp_path / f).exists() for f in first)
    assert sorted(p.name for p in tmp_path.glob("state-*")) == sorted(second)
    back = ckpt.load_state(tmp_path, ckpt.read_run(tmp_path))
    assert set(back) == set(tensors) and all(torch.equal(back[k], tensors[k]) for k in tensors)
    assert json.loads((tmp_path / "run.json").read_text())["checkpoint"]["files"] == second


def _trained_pair(tiny_preset):
    preset = load_preset(tiny_preset)
    target = build_target(preset.target, 0).eval()
    with torch.no_grad():
        for p in target.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    for p in target.parameters():
        p.requires_grad_(False)
    dcfg = dict(preset.drafter, block_size=6)
    dcfg["dflash_config"] = dict(dcfg["dflash_config"], selector_head=True, local_conv_kernel=3)
    drafter = build_drafter(dcfg, target, 1)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return target, drafter


def test_training_runs_the_reference_ops(tiny_preset, batch, monkeypatch):
    """Training needs autograd, which the plugin kernels do not have: every op of the target's loss and of the
    drafter's block forward is asked under ``REFERENCE`` (on a GPU too, where the default policy runs the kernels),
    and the loss backpropagates."""
    from ocria.plugins.policy import ExecutionPolicy

    asked, uses = [], ExecutionPolicy.uses

    def recorded(policy, name, device):
        asked.append(policy)
        return uses(policy, name, device)

    monkeypatch.setattr(ExecutionPolicy, "uses", recorded)
    target = build_target(load_preset(tiny_preset).target, 0)
    drafter = build_drafter(load_preset(tiny_preset).drafter, target, 1)
    cfg = drafter.config
    feats = torch.randn(1, 12, len(cfg.target_layer_ids) * cfg.hidden_size)
    ids = torch.full((1, 2, cfg.block_size), cfg.mask_token_id)
    loss = target_loss(target, batch) + block_forward(drafter, feats, torch.tensor([[3, 8]]), ids)[0].sum()
    loss.backward()
    assert asked and all(policy is REFERENCE for policy in asked)
    grads = [p.grad for p in (*target.parameters(), *drafter.parameters()) if p.grad is not None]
    assert grads and any(bool(g.abs().sum() > 0) for g in grads)


def test_block_forward_equals_the_inference_drafting_path(tiny_preset):
    torch.manual_seed(0)
    target, drafter = _trained_pair(tiny_preset)
    drafter.eval()
    cfg = drafter.config
    B, M = 2, 24
    feats = torch.randn(B, M, len(cfg.target_layer_ids) * cfg.hidden_size)
    seq = torch.randint(7, 512, (B, M))
    anchors = torch.tensor([[0, 7, 19], [4, 11, 23]])
    ids = torch.full((B, 3, cfg.block_size), cfg.mask_token_id)
    ids[..., 0] = seq.gather(1, anchors)
    with torch.no_grad():
        logits, sel = block_forward(drafter, feats, anchors, ids)
        for b in range(B):
            for n, a in enumerate(anchors[b].tolist()):
                cache = DrafterCache.allocate(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 1, 64,
                                              torch.float32)
                slot = torch.tensor([0])
                if a:
                    drafter.append_context(feats[b:b + 1, :a], torch.tensor([a]), cache, slot)
                ref, conf = drafter.draft(seq[b:b + 1, a], cache, slot, attn_len=64)
                assert torch.allclose(logits[b, n], ref[0], atol=1e-5)
                assert torch.allclose(torch.sigmoid(sel[b, n]), conf[0], atol=1e-6)


def test_greedy_sequences_label_the_targets_own_greedy_tokens(tiny_preset, batch):
    """Each label is the target's greedy token after the fed prefix; the fed tokens that equal their labels
    from the answer's start are the exact greedy decode."""
    target, _ = _trained_pair(tiny_preset)
    with chunked_gdn(16):
        seq, feats, labels = greedy_sequences(target, batch, (0, 2), iters=2, slack=4, eos_id=2)
        assert feats.shape == (*seq.shape, 2 * 64)
        b, L = 0, int(batch.prompt_len[0])
        own = seq[b, L:] == labels[b, L:]
        n = int(own.long().cumprod(0).sum()) + 1  # the exact greedy prefix, and the label after it
        assert n >= 3  # each fixed-point pass fixes at least one more token
        pixels = batch.pixel_values[: int(batch.image_grid_thw[0].prod())]
        ids = batch.input_ids[b:b + 1, :L]
        with torch.no_grad():
            for t in range(n):  # definitional greedy decoding, one full forward per token
                nxt = target(ids, pixels, batch.image_grid_thw[:1])[0, -1].argmax()
                assert int(nxt) == int(labels[b, L + t])
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
            # past a fed token the target would not have chosen: still its argmax after that prefix
            later = [t for t in range(L + n, seq.shape[1]) if labels[b, t] != IGNORE and not own[t - 1 - L]]
            assert later
            t = later[0]
            assert int(target(seq[b:b + 1, :t], pixels, batch.image_grid_thw[:1])[0, -1].argmax()) == int(labels[b, t])


def test_drafter_loss_decreases_on_a_tiny_batch(tiny_preset, batch):
    torch.manual_seed(0)
    target, drafter = _trained_pair(tiny_preset)
    with chunked_gdn(16):
        seq, feats, labels = greedy_sequences(target, batch, tuple(drafter.config.target_layer_ids), 1, 4, 2)
    gen = torch.Generator().manual_seed(0)
    anchors, ids, blabels = sample_blocks(seq, labels, 6, drafter.config.block_size, drafter.config.mask_token_id,
                                          gen)
    assert (anchors >= batch.prompt_len[:, None]).all()
    assert torch.equal(ids[..., 0], labels.gather(1, anchors))  # anchor tokens are the target's own tokens
    assert (blabels != IGNORE).any()
    for r, i, j in (blabels != IGNORE).nonzero().tolist():  # slot j + 1 learns only after the target's own tokens
        fed = seq[r, anchors[r, i] + 1: anchors[r, i] + 1 + j]
        assert torch.equal(fed, labels[r, anchors[r, i] + 1: anchors[r, i] + 1 + j])
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        logits, sel = block_forward(drafter, feats, anchors, ids)
        loss, stats = drafter_loss(logits, sel, blabels, 0.2)
        assert "selector_bce" in stats and stats["accept"] >= 1
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5
    assert all(p.grad is None for p in target.parameters())


def test_ablation_drafter_trains_beside_the_shipped_one_without_changing_it(tiny_preset, tmp_path):
    """The local-conv-off drafter shares the batches and the target's passes; the shipped drafter's weights
    come out bit-identical to a run without the ablation (separate clipping, elementwise AdamW)."""
    exported = {}
    for ablation in (True, False):
        run = Run(tmp_path / str(ablation), _cfg(preset=tiny_preset, ablation=ablation, block_size=4,
                                                  fixed_point_iters=1, drafter_layers=2), 600)
        assert run.stage_target() and run.stage_drafter()
        exported[ablation] = run.state
        last = run.run["history"]["drafter"][-1]
        assert ("noconv_accept" in last) == ablation and last["accept"] >= 1
    with_ablation, alone = exported[True], exported[False]
    assert not (alone / "drafter_noconv").exists()
    noconv = json.loads((with_ablation / "drafter_noconv" / "config.json").read_text())
    shipped = json.loads((with_ablation / "drafter" / "config.json").read_text())
    assert noconv["dflash_config"]["local_conv_kernel"] == 0 and shipped["dflash_config"]["local_conv_kernel"] == 3
    assert noconv["num_hidden_layers"] == shipped["num_hidden_layers"] == 2  # drafter_layers; the preset has 1
    assert ((with_ablation / "drafter" / "model.safetensors").read_bytes()
            == (alone / "drafter" / "model.safetensors").read_bytes())


def test_init_target_starts_from_an_exported_target(tiny_preset, tmp_path):
    """A further run starts from a trained target's export: with a zero learning rate it exports the same bytes."""
    first = Run(tmp_path / "a", _cfg(preset=tiny_preset), 600)
    assert first.stage_target()
    exported = tmp_path / "a" / "target"
    again = Run(tmp_path / "b", _cfg(preset=tiny_preset, init_target=str(exported), target_lr=0.0), 600)
    assert again.stage_target()
    weights = [d / "model.safetensors" for d in (exported, tmp_path / "b" / "target")]
    assert weights[0].read_bytes() == weights[1].read_bytes()
    started = again.run["init_target"]  # by content: shipping replaces the directory it names
    assert started["files"]["model.safetensors"]["sha256"] == hashlib.sha256(weights[0].read_bytes()).hexdigest()
    assert "init_target" not in first.run
    with pytest.raises(OcriaError, match="no config.json"):
        Run(tmp_path / "c", _cfg(preset=tiny_preset, init_target=str(tmp_path)), 600).stage_target()
    with pytest.raises(OcriaError, match="not built like this run's model"):
        load_exported(build_target(load_preset("ocria-mini").target, 0), exported, "init_target")


def test_init_drafter_starts_from_an_exported_drafter(tiny_preset, tmp_path):
    """A further run fine-tunes a trained drafter: with a zero learning rate it exports the same bytes; beside a
    from-scratch ablation drafter it is refused (their taus would not measure the extension alone)."""
    first = Run(tmp_path / "a", _cfg(preset=tiny_preset, ablation=False, block_size=4, fixed_point_iters=1), 600)
    assert first.stage_target() and first.stage_drafter()
    exported = tmp_path / "a" / "drafter"
    again = Run(tmp_path / "b", _cfg(preset=tiny_preset, ablation=False, block_size=4, fixed_point_iters=1,
                                     init_target=str(tmp_path / "a" / "target"), target_steps=1,
                                     init_drafter=str(exported), drafter_lr=0.0), 600)
    assert again.stage_target() and again.stage_drafter()
    weights = [d / "model.safetensors" for d in (exported, tmp_path / "b" / "drafter")]
    assert weights[0].read_bytes() == weights[1].read_bytes()
    assert again.run["init_drafter"]["files"]["model.safetensors"]["sha256"] == hashlib.sha256(
        weights[0].read_bytes()).hexdigest()
    with pytest.raises(OcriaError, match="needs --set ablation=false"):
        TrainConfig.with_overrides([f"init_drafter={exported}"])
    deeper = Run(tmp_path / "c", _cfg(preset=tiny_preset, ablation=False, block_size=4, fixed_point_iters=1,
                                      drafter_layers=2, init_drafter=str(exported)), 600)
    assert deeper.stage_target()
    with pytest.raises(OcriaError, match="init_drafter .* not built like this run's model"):
        deeper.stage_drafter()


def test_data_offset_starts_the_train_split_at_that_document(tiny_preset, tmp_path):
    """A further run reads documents earlier runs did not: batch b holds documents offset + b*B on."""
    assert next(iter(_Batches(1, 2, 5))) == [7, 8]
    run = Run(tmp_path, _cfg(preset=tiny_preset, data_kind="", data_offset=5), 600)
    got = next(iter(run._batches(2, 1, 0))).input_ids  # batch 1 of size 2: documents 7 and 8, right-padded
    for row, doc in enumerate((7, 8)):
        alone = next(iter(loader(load_preset(tiny_preset).assets, 1, doc, 0))).input_ids[0]
        assert torch.equal(got[row, :len(alone)], alone)


def test_train_config_parses_bools_and_names_bad_values():
    assert TrainConfig.with_overrides(["ablation=false"]).ablation is False
    assert TrainConfig.with_overrides(["ablation=1"]).ablation is True
    with pytest.raises(OcriaError, match="'maybe' is not a bool"):
        TrainConfig.with_overrides(["ablation=maybe"])
    with pytest.raises(OcriaError, match="drafter_layers=-1"):
        TrainConfig.with_overrides(["drafter_layers=-1"])


def test_export_loads_unchanged_and_ships(tiny_preset, tmp_path, batch):
    target, drafter = _trained_pair(tiny_preset)
    export_model(target, tmp_path / "target")
    export_model(drafter, tmp_path / "drafter")
    assert {f.name for f in (tmp_path / "target").iterdir()} == {"config.json", "model.safetensors"}
    loaded = OCRiaForConditionalGeneration.from_pretrained(tmp_path / "target")
    loaded_d = DFlash2Drafter.from_pretrained(tmp_path / "drafter", loaded)
    assert loaded_d.config.selector_head and loaded_d.config.local_conv_kernel == 3
    with torch.no_grad():
        for p in target.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        n = int(batch.image_grid_thw[0].prod())
        args = (batch.input_ids[:1, :100], batch.pixel_values[:n], batch.image_grid_thw[:1])
        assert torch.allclose(loaded(*args), target(*args), atol=1e-5)
    preset = dataclasses.replace(load_preset(tiny_preset), assets=tmp_path / "assets")
    preset.assets.mkdir()
    ship(tmp_path / "target", tmp_path / "drafter", preset, {"results": {"cer_ar": 0.5}})
    assert (preset.assets / "target" / "model.safetensors").read_bytes() == (
        tmp_path / "target" / "model.safetensors").read_bytes()
    record = json.loads((preset.assets / SHIPPED).read_text())
    assert record["preset"] == preset.name and record["training"]["results"]["cer_ar"] == 0.5
    assert sorted(record["files"]) == ["drafter/config.json", "drafter/model.safetensors", "target/config.json",
                                       "target/model.safetensors"]
    assert preset_checkpoints(preset, tmp_path / "unused") == (preset.assets / "target", preset.assets / "drafter")
    other = dataclasses.replace(preset, name="another")  # borrowed assets: seeded weights, not these
    assert preset_checkpoints(other, tmp_path / "seeded")[0] == tmp_path / "seeded" / "target"
    weights = preset.assets / "drafter" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    with pytest.raises(OcriaError, match="drafter/model.safetensors: size"):
        preset_checkpoints(preset, tmp_path / "unused")
    (preset.assets / SHIPPED).unlink()
    with pytest.raises(ConfigError, match="trained weights without SHIPPED.json"):
        preset_checkpoints(preset, tmp_path / "unused")


def test_cli_runs_every_stage_and_mirrors_the_state(tiny_preset, tmp_path, capsys):
    state, out = tmp_path / "state", tmp_path / "out"
    sets = [f"--set={k}={v}" for k, v in dict(preset=tiny_preset, target_steps=2, target_batch=1, drafter_steps=2,
                                              drafter_batch=1, workers=0, eval_docs=1,
                                              eval_batch=1, eval_max_tokens=8, block_size=4,
                                              fixed_point_iters=1, data_kind="line").items()]
    args = ["run", "--state", str(state), "--out", str(out), "--budget-s", "600"]
    assert train_main([*args, "--max-steps", "1", *sets]) == 0  # stops inside the target stage
    first = json.loads((out / "run.json").read_text())
    assert first["stage"] == "target" and first["checkpoint"]["step"] == 1
    assert sorted(p.name for p in out.iterdir()) == ["run.json", *first["checkpoint"]["files"]]
    probe = ["probe", "--state", str(state), "--preset", tiny_preset, "--docs", "1", "--max-tokens", "8"]
    assert train_main([*probe, "--out", str(tmp_path / "mid.json")]) == 0  # the mid-run checkpoint
    mid = json.loads((tmp_path / "mid.json").read_text())
    assert mid["target_step"] == 1 and mid["docs"] == 1 and mid["command"].startswith("python -m ocria.train probe")
    assert train_main(args) == 0  # resumes from the state directory, finishes every stage
    run = json.loads((out / "run.json").read_text())
    assert train_main([*probe, "--out", str(tmp_path / "end.json")]) == 0  # the exported target
    end = json.loads((tmp_path / "end.json").read_text())
    res = run["results"]
    assert end["target_step"] == 2 and end["split"] == "synthetic"
    assert end["cer_ar"] == res["splits"]["synthetic"]["cer_ar"]  # the run's own evaluation of that page
    assert train_main(["probe", "--state", str(tmp_path / "none")]) == 2
    assert run["stage"] == "done" and run["checkpoint"] is None
    assert res["block_size"] == 4 and res["docs"] == 1 and list(res["splits"]) == list(EVAL_SPLITS)
    assert set(run["stages"]["target"]["heldout_cer_quick"]) == set(EVAL_SPLITS)
    assert res["local_conv_off"]["split"] == "synthetic"
    for split, r in res["splits"].items():  # every split: its CER, and spec == ar on each page with its tau
        assert r["docs"] == 1 and 0 <= r["cer_ar"] and r["cer_ar"] == sum(r["edits_ar"]) / sum(r["chars"]), split
        for sel in ("selector_on", "selector_off"):
            assert r["local_conv_on"][sel]["spec_equals_ar"] and 1.0 <= r["local_conv_on"][sel]["tau"] <= 4.0
    for sel in ("selector_on", "selector_off"):
        assert res["local_conv_off"][sel]["spec_equals_ar"] and 1.0 <= res["local_conv_off"][sel]["tau"] <= 4.0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "drafter/config.json", "drafter/model.safetensors", "run.json", "target/config.json",
        "target/model.safetensors"]
    assert len(run["calls"]) == 2 and run["calls"][1]["stage_at_start"] == "target"
    assert run["calls"][0]["command"].startswith("python -m ocria.train run") and run["calls"][0]["wall_s"] > 0
    assert train_main(["run", "--state", str(state), "--set=bogus=1"]) == 2
    assert "bogus" in capsys.readouterr().err


def test_eval_reports_each_split_of_a_built_engine(tiny_preset, tmp_path, capsys):
    """``python -m ocria.train eval``: CER, tau and spec == ar on each evaluation split separately."""
    from ocria.builder.engine import build_engine

    target, drafter = _trained_pair(tiny_preset)
    export_model(target, tmp_path / "target")
    export_model(drafter, tmp_path / "drafter")
    engine = build_engine(tmp_path / "engine", tmp_path / "target", tmp_path / "drafter", preset=tiny_preset,
                          progress=False)
    splits, out = ["independent", "realistic", "heldout_fonts"], tmp_path / "eval.json"
    args = ["eval", "--engine", str(engine), "--docs", "2", "--max-tokens", "6", "--batch", "2", "--out", str(out)]
    assert train_main([*args, "--splits", *splits]) == 0
    res = json.loads(out.read_text())
    assert list(res["splits"]) == splits and res["docs"] == 2 and list(res["summary"]) == splits
    for split, r in res["splits"].items():
        assert r["docs"] == 2 and r["cer_ar"] == sum(r["edits_ar"]) / sum(r["chars"]), split
        assert res["summary"][split] == {"cer_ar": round(r["cer_ar"], 4), "tau": round(r["selector_on"]["tau"], 3),
                                         "spec_equals_ar": True}
        for sel in ("selector_on", "selector_off"):
            assert r[sel]["spec_equals_ar"] and r[sel]["docs_differing"] == 0 and 1.0 <= r[sel]["tau"] <= 6.0
    assert res["splits"]["independent"]["chars"] == res["splits"]["realistic"]["chars"]  # the same pages, larger
    capsys.readouterr()
    assert train_main([*args, "--splits", "bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown evaluation split 'bogus'") and "\n" not in err.strip()


def test_divergences_name_the_first_differing_token():
    spec = [{"tokens": [1, 2, 3]}, {"tokens": [1, 2, 9, 4]}, {"tokens": [1, 2]}]
    ar = [{"tokens": [1, 2, 3]}, {"tokens": [1, 2, 3, 4]}, {"tokens": [1, 2, 5]}]
    assert divergences(spec, ar) == [{"doc": 1, "position": 2, "spec_token": 9, "ar_token": 3},
                                     {"doc": 2, "position": 2, "spec_token": None, "ar_token": 5}]
