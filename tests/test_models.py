"""Target model: parity with HF transformers' Qwen3.5, incremental == full, batching, loading."""

import pytest
import torch
from tiny_models import IMAGE_TOKEN, hf_vlm, image_prompt, pixels, save_hf, text_config, vlm_config

from ocria.models import OCRiaForCausalLM, OCRiaForConditionalGeneration, TargetCache

CONFIGS = {
    "default": vlm_config(),
    "tied_gqa1": vlm_config(text_config(tie_word_embeddings=True, num_key_value_heads=4, linear_num_key_heads=4)),
    "attn_first": vlm_config(text_config(
        num_hidden_layers=5, layer_types=["full_attention", "linear_attention", "linear_attention",
                                          "full_attention", "linear_attention"])),
    "wide_vision": vlm_config(text_config(hidden_size=48, num_attention_heads=2, head_dim=24, rope_parameters={
        "rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 1]}),
        depth=1, hidden_size=24, num_heads=3, num_position_embeddings=36),
}
GRIDS = {"default": (4, 6), "tied_gqa1": (6, 4), "attn_first": (2, 2), "wide_vision": (8, 6)}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name, cfg in CONFIGS.items():
        hf = hf_vlm(cfg, seed=len(name))
        out[name] = (cfg, hf, save_hf(hf, tmp_path_factory.mktemp(name), shards=2 if name == "default" else 1))
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parity_with_hf_image_prompt(checkpoints, name):
    cfg, hf, path = checkpoints[name]
    model = OCRiaForConditionalGeneration.from_pretrained(path)
    ids, grid = image_prompt(GRIDS[name])
    pv = pixels(grid, cfg["vision_config"])
    with torch.no_grad():
        ref = hf(input_ids=ids[None], pixel_values=pv, image_grid_thw=grid,
                 mm_token_type_ids=(ids == IMAGE_TOKEN).long()[None]).logits
        out = model(ids[None], pv, grid)
    assert out.shape == ref.shape
    assert rel_err(out, ref) <= 1e-4


def test_parity_two_images_in_batch(checkpoints):
    cfg, hf, path = checkpoints["default"]
    model = OCRiaForConditionalGeneration.from_pretrained(path)
    ids, grid = image_prompt((4, 4))
    batch, grids = torch.stack([ids, ids]), torch.cat([grid, grid])
    pv = pixels(grids, cfg["vision_config"])
    with torch.no_grad():
        ref = hf(input_ids=batch, pixel_values=pv, image_grid_thw=grids,
                 mm_token_type_ids=(batch == IMAGE_TOKEN).long()).logits
        out = model(batch, pv, grids)
    assert rel_err(out, ref) <= 1e-4
    assert not torch.allclose(out[0], out[1])  # different pixels per image


def _positions_for(model, ids, grid):
    pos, _ = model.positions(ids[None], grid)
    return pos  # [3, 1, L]


def _prefill(model, cache, slot, embeds, pos, n):
    slots = torch.tensor([slot])
    hidden, _ = model.forward_cached(embeds[:, :n], pos[:, :, :n], cache, slots, "prefill")
    cache.kv_len[slots] += n
    cache.pending_len[slots] = 0
    return model.logits(hidden)


def _verify(model, cache, slot, embeds, pos, start, T, accept):
    slots = torch.tensor([slot])
    hidden, _ = model.forward_cached(embeds[:, start:start + T], pos[:, :, start:start + T], cache, slots, "verify")
    cache.commit(slots, torch.tensor([accept]))
    return model.logits(hidden)


@pytest.mark.parametrize("chunk", [1, 3, 4])
def test_incremental_equals_full(checkpoints, chunk):
    cfg, _, path = checkpoints["default"]
    model = OCRiaForConditionalGeneration.from_pretrained(path)
    ids, grid = image_prompt((4, 6), text_after=(9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21))
    pv = pixels(grid, cfg["vision_config"])
    with torch.no_grad():
        full = model(ids[None], pv, grid)
        embeds = model.embed(ids[None], pv, grid)
        pos = _positions_for(model, ids, grid)
        cache = TargetCache.allocate(model.text_config, num_slots=3, max_len=64, max_chunk=4, dtype=torch.float32)
        n0 = 12
        parts = [_prefill(model, cache, 2, embeds, pos, n0)]
        start = n0
        while start < ids.numel():
            T = min(chunk, ids.numel() - start)
            parts.append(_verify(model, cache, 2, embeds, pos, start, T, T))
            start += T
    assert rel_err(torch.cat(parts, dim=1), full) <= 1e-5


def test_rejected_tokens_leave_no_trace(checkpoints):
    """Verify 4 tokens, keep 1, then continue: identical to a model that only saw the kept ones."""
    cfg, _, path = checkpoints["default"]
    model = OCRiaForConditionalGeneration.from_pretrained(path)
    ids, grid = image_prompt((4, 4), text_after=(9, 10, 11, 12, 13, 14, 15, 16))
    pv = pixels(grid, cfg["vision_config"])
    with torch.no_grad():
        full = model(ids[None], pv, grid)
        embeds = model.embed(ids[None], pv, grid)
        pos = _positions_for(model, ids, grid)
        junk = torch.randn_like(embeds)
        cache = TargetCache.allocate(model.text_config, num_slots=1, max_len=64, max_chunk=4, dtype=torch.float32)
        _prefill(model, cache, 0, embeds, pos, 8)
        mixed = embeds.clone()
        mixed[:, 9:12] = junk[:, 9:12]  # positions 9..11 are rejected drafts
        first = _verify(model, cache, 0, mixed, pos, 8, 4, accept=1)
        rest = _verify(model, cache, 0, embeds, pos, 9, 4, accept=4)
    assert rel_err(first[:, :1], full[:, 8:9]) <= 1e-5
    assert rel_err(rest, full[:, 9:13]) <= 1e-5


def test_batch_of_different_lengths_matches_alone(checkpoints):
    cfg, _, path = checkpoints["tied_gqa1"]
    model = OCRiaForConditionalGeneration.from_pretrained(path)
    seqs = [image_prompt((4, 4), text_after=tuple(range(9, 9 + k))) for k in (2, 7, 4)]
    with torch.no_grad():
        alone, prepared = [], []
        for ids, grid in seqs:
            pv = pixels(grid, cfg["vision_config"], torch.Generator().manual_seed(ids.numel()))
            alone.append(model(ids[None], pv, grid))
            prepared.append((model.embed(ids[None], pv, grid), _positions_for(model, ids, grid)))
        cache = TargetCache.allocate(model.text_config, num_slots=4, max_len=64, max_chunk=2, dtype=torch.float32)
        slots = torch.tensor([3, 0, 1])
        for (emb, pos), slot, (ids, _) in zip(prepared, slots.tolist(), seqs):
            _prefill(model, cache, slot, emb, pos, ids.numel() - 2)
        # last two tokens of every sequence in one batched verify step
        emb = torch.cat([e[:, -2:] for e, _ in prepared])
        pos = torch.cat([p[:, :, -2:] for _, p in prepared], dim=1)
        hidden, _ = model.forward_cached(emb, pos, cache, slots, "verify", attn_len=int(cache.kv_len.max()) + 2)
        batched = model.logits(hidden)
    for i, full in enumerate(alone):
        assert rel_err(batched[i:i + 1], full[:, -2:]) <= 1e-5


def test_text_only_checkpoint_loads(tmp_path):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(0)
    hf = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**text_config())).eval()
    hf.save_pretrained(tmp_path)
    model = OCRiaForCausalLM.from_pretrained(tmp_path)
    ids = torch.randint(0, 96, (2, 9))
    with torch.no_grad():
        assert rel_err(model(ids), hf(input_ids=ids).logits) <= 1e-4


def test_text_decoder_loads_from_vlm_checkpoint(checkpoints):
    _, hf, path = checkpoints["default"]
    model = OCRiaForCausalLM.from_pretrained(path)
    ids = torch.randint(7, 96, (1, 6))
    with torch.no_grad():
        assert rel_err(model(ids), hf(input_ids=ids).logits) <= 1e-4


def test_prefill_captures_requested_layers(checkpoints):
    cfg, hf, path = checkpoints["default"]
    model = OCRiaForConditionalGeneration.from_pretrained(path)
    ids = torch.randint(7, 96, (1, 5))
    with torch.no_grad():
        ref = hf(input_ids=ids, output_hidden_states=True).hidden_states
        pos = torch.arange(5).expand(3, 1, 5)
        _, feats = model.text(model.text.embed_tokens(ids), pos, capture=(2, 0))
    assert rel_err(feats[0], ref[3]) <= 1e-5 and rel_err(feats[1], ref[1]) <= 1e-5


def test_fused_projections_compute_the_same(checkpoints):
    cfg, _, path = checkpoints["attn_first"]
    model = OCRiaForConditionalGeneration.from_pretrained(path)
    ids, grid = image_prompt(GRIDS["attn_first"])
    pv = pixels(grid, cfg["vision_config"])
    with torch.no_grad():
        plain = model(ids[None], pv, grid)
        names = set(model.state_dict())
        model.text.fuse_projections()
        fused = model(ids[None], pv, grid)
    assert set(model.state_dict()) == names  # checkpoints keep their HF names
    assert "_fused" in model.text.layers[0].self_attn.__dict__
    assert rel_err(fused, plain) <= 1e-5


def test_chunked_prefill_recurrence_matches(checkpoints, monkeypatch):
    """The chunked GDN recurrence (used for long CUDA prefills) gives the sequential loop's logits."""
    from ocria.models import gdn

    cfg, _, path = checkpoints["default"]
    model = OCRiaForConditionalGeneration.from_pretrained(path)
    ids, grid = image_prompt((4, 6), text_after=tuple(range(9, 40)))
    pv = pixels(grid, cfg["vision_config"])
    with torch.no_grad():
        sequential = model(ids[None], pv, grid)
        monkeypatch.setattr(gdn, "gated_delta_rule", lambda *a: gdn.chunk_gated_delta_rule(*a, chunk=16))
        chunked = model(ids[None], pv, grid)
    assert rel_err(chunked, sequential) <= 1e-5
