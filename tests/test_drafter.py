"""DFlash2 drafter: z-lab format loads; block logits equal an independent re-implementation."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from tiny_models import drafter_config, hf_vlm, save_hf, vlm_config, write_drafter

from ocria.errors import ConfigError
from ocria.models import DFlash2Drafter, DrafterCache, OCRiaForConditionalGeneration
from ocria.plugins.policy import ALL_KERNELS, REFERENCE


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    cfg = vlm_config()
    return OCRiaForConditionalGeneration.from_pretrained(save_hf(hf_vlm(cfg), tmp_path_factory.mktemp("t"))), cfg


def rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = pos[:, None].float() * inv
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos[:, None] + torch.cat([-x2, x1], -1) * sin[:, None]


def reference_block_logits(t: dict, cfg: dict, embed: torch.Tensor, lm_head: torch.Tensor, feats: torch.Tensor,
                           last_token: int) -> torch.Tensor:
    """Straight from the DFlash description: one sequence, no cache. feats [L, n*H]."""
    dc = cfg["dflash_config"]
    L, Bs, hd = feats.shape[0], cfg["block_size"], cfg["head_dim"]
    heads, kvh = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    ctx = rms(feats @ t["fc.weight"].T, t["hidden_norm.weight"])
    block = torch.tensor([last_token] + [dc["mask_token_id"]] * (Bs - 1))
    x = embed[block]
    pos = torch.arange(L + Bs)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        if dc.get("local_conv_kernel"):
            w = t[p + "local_conv.weight"][:, 0]  # [H, Kc]
            kc = w.shape[1]
            padded = torch.cat([torch.zeros(kc - 1, x.shape[1]), x])
            x = x + torch.stack([(padded[j:j + kc] * w.T).sum(0) for j in range(Bs)])
        hn = rms(x, t[p + "input_layernorm.weight"])
        q = rms((hn @ t[p + "self_attn.q_proj.weight"].T).view(Bs, heads, hd), t[p + "self_attn.q_norm.weight"])
        kv_in = torch.cat([ctx, hn])
        k = rms((kv_in @ t[p + "self_attn.k_proj.weight"].T).view(L + Bs, kvh, hd), t[p + "self_attn.k_norm.weight"])
        v = (kv_in @ t[p + "self_attn.v_proj.weight"].T).view(L + Bs, kvh, hd)
        q, k = rope(q, pos[L:], cfg["rope_theta"]), rope(k, pos, cfg["rope_theta"])
        k, v = k.repeat_interleave(heads // kvh, 1), v.repeat_interleave(heads // kvh, 1)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / hd**0.5, -1)
        o = torch.einsum("hqk,khd->qhd", att, v).reshape(Bs, -1)
        x = x + o @ t[p + "self_attn.o_proj.weight"].T
        hn = rms(x, t[p + "post_attention_layernorm.weight"])
        x = x + (F.silu(hn @ t[p + "mlp.gate_proj.weight"].T) * (hn @ t[p + "mlp.up_proj.weight"].T)) @ t[
            p + "mlp.down_proj.weight"].T
    out = rms(x, t["norm.weight"])
    return out[1:] @ lm_head.T


def target_features(model, ids, layer_ids):
    pos = torch.arange(ids.numel()).expand(3, 1, -1)
    _, feats = model.text(model.text.embed_tokens(ids[None]), pos, capture=tuple(layer_ids))
    return torch.cat(feats, -1)[0]


@pytest.mark.parametrize("ext", [{}, {"local_conv_kernel": 3}, {"selector_head": True},
                                 {"local_conv_kernel": 2, "selector_head": True}])
def test_drafter_matches_reference(target, tmp_path, ext):
    model, cfg = target
    dcfg = drafter_config(cfg["text_config"], **ext)
    tensors = write_drafter(tmp_path / "d", dcfg, seed=3)
    drafter = DFlash2Drafter.from_pretrained(tmp_path / "d", model)
    ids = torch.randint(7, 96, (11,))
    with torch.no_grad():
        feats = target_features(model, ids, dcfg["dflash_config"]["target_layer_ids"])
        ref = reference_block_logits(tensors, dcfg, model.text.embed_tokens.weight, model.lm_head.weight, feats, 42)
        cache = DrafterCache.allocate(2, 2, 8, num_slots=2, max_len=32, dtype=torch.float32)
        slots = torch.tensor([1])
        # context arrives in two pieces, the second padded beyond its count (like a partial accept)
        drafter.append_context(feats[None, :7], torch.tensor([7]), cache, slots)
        padded = torch.cat([feats[7:], torch.randn(2, feats.shape[1])])[None]
        drafter.append_context(padded, torch.tensor([4]), cache, slots)
        logits, conf = drafter.draft(torch.tensor([42]), cache, slots)
    assert int(cache.ctx_len[1]) == 11
    assert float((logits[0] - ref).abs().max() / ref.abs().max()) <= 1e-5
    assert (conf is not None) == bool(ext.get("selector_head"))
    if conf is not None:
        budget = drafter.verify_budget(conf)
        expect = (conf >= 0.5).int().cumprod(1).sum(1)
        assert torch.equal(budget, expect) and conf.shape == (1, dcfg["block_size"] - 1)


def test_extensions_change_output(target, tmp_path):
    model, cfg = target
    ids = torch.randint(7, 96, (9,))
    outs = {}
    for name, ext in {"plain": {}, "conv": {"local_conv_kernel": 3}}.items():
        dcfg = drafter_config(cfg["text_config"], **ext)
        write_drafter(tmp_path / name, dcfg, seed=3)  # same seed: same shared weights
        drafter = DFlash2Drafter.from_pretrained(tmp_path / name, model)
        with torch.no_grad():
            feats = target_features(model, ids, [0, 2])
            cache = DrafterCache.allocate(2, 2, 8, num_slots=1, max_len=32, dtype=torch.float32)
            drafter.append_context(feats[None], torch.tensor([9]), cache, torch.tensor([0]))
            outs[name] = drafter.draft(torch.tensor([11]), cache, torch.tensor([0]))[0]
    assert not torch.allclose(outs["plain"], outs["conv"], atol=1e-4)


def test_draft_batch_rows_are_independent(target, tmp_path):
    model, cfg = target
    dcfg = drafter_config(cfg["text_config"])
    write_drafter(tmp_path / "d", dcfg)
    drafter = DFlash2Drafter.from_pretrained(tmp_path / "d", model)
    a, b = torch.randint(7, 96, (5,)), torch.randint(7, 96, (9,))
    with torch.no_grad():
        fa, fb = target_features(model, a, [0, 2]), target_features(model, b, [0, 2])
        alone = []
        for f in (fa, fb):
            cache = DrafterCache.allocate(2, 2, 8, num_slots=1, max_len=32, dtype=torch.float32)
            drafter.append_context(f[None], torch.tensor([f.shape[0]]), cache, torch.tensor([0]))
            alone.append(drafter.draft(torch.tensor([13]), cache, torch.tensor([0]))[0])
        cache = DrafterCache.allocate(2, 2, 8, num_slots=3, max_len=32, dtype=torch.float32)
        padded = torch.stack([torch.cat([fa, torch.zeros(4, fa.shape[1])]), fb])
        slots = torch.tensor([2, 0])
        drafter.append_context(padded, torch.tensor([5, 9]), cache, slots)
        both = drafter.draft(torch.tensor([13, 13]), cache, slots, attn_len=16)[0]
    assert torch.allclose(both[0], alone[0][0], atol=1e-5) and torch.allclose(both[1], alone[1][0], atol=1e-5)


def test_draft_vocabulary_is_the_heads_first_rows(target, tmp_path):
    model, cfg = target
    for name, ext in {"full": {}, "prefix": {"draft_vocab_size": 40}}.items():
        write_drafter(tmp_path / name, drafter_config(cfg["text_config"], **ext), seed=5)
    full, prefix = (DFlash2Drafter.from_pretrained(tmp_path / n, model) for n in ("full", "prefix"))
    assert prefix.config.draft_vocab_size == 40 and prefix.config.to_hf()["dflash_config"]["draft_vocab_size"] == 40
    ids = torch.randint(7, 96, (9,))
    with torch.no_grad():
        feats = target_features(model, ids, [0, 2])
        logits = {}
        for name, drafter in (("full", full), ("prefix", prefix)):
            cache = DrafterCache.allocate(2, 2, 8, num_slots=1, max_len=32, dtype=torch.float32)
            drafter.append_context(feats[None], torch.tensor([9]), cache, torch.tensor([0]))
            logits[name] = drafter.draft(torch.tensor([11]), cache, torch.tensor([0]))[0]
    assert logits["prefix"].shape[-1] == 40
    torch.testing.assert_close(logits["prefix"], logits["full"][..., :40])
    drafts = prefix.propose(logits["prefix"], None, torch.tensor([0]))
    assert drafts.max() < 40 and torch.equal(drafts, logits["full"][..., :40].argmax(-1))


@pytest.mark.parametrize("bad", [-1, 3, 10_000])
def test_draft_vocabulary_size_is_checked(target, tmp_path, bad):
    model, cfg = target
    write_drafter(tmp_path / "d", drafter_config(cfg["text_config"], draft_vocab_size=bad))
    with pytest.raises(ConfigError, match="draft_vocab_size"):
        DFlash2Drafter.from_pretrained(tmp_path / "d", model)


def test_draft_vocabulary_needs_a_plain_head(target, tmp_path):
    model, cfg = target
    write_drafter(tmp_path / "d", drafter_config(cfg["text_config"], draft_vocab_size=40))
    drafter = DFlash2Drafter.from_pretrained(tmp_path / "d", model)
    with pytest.raises(ConfigError, match="plain linear"):
        drafter.bind(model.text.embed_tokens, torch.nn.Sequential(model.lm_head))


def test_drafter_rejects_mismatched_target(target, tmp_path):
    model, cfg = target
    dcfg = drafter_config(cfg["text_config"], target_layer_ids=[0, 9])
    write_drafter(tmp_path / "d", dcfg)
    with pytest.raises(ConfigError, match="target_layer_ids"):
        DFlash2Drafter.from_pretrained(tmp_path / "d", model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_plugin_path_matches_reference_path(dtype):
    """Kernels on: every norm is one ``ocria::`` launch, the residual adds fused into the norms that
    follow them, and the drafted logits, selector and written K/V match the eager path's. The cached attention
    stays on its reference (its kernel is tested on its own) so that the norms are what differs: in bf16 the
    kernels keep the eager rounding chain and this seeded draft comes out bit for bit."""
    from torch.profiler import ProfilerActivity, profile

    from ocria.builder.presets import load_preset, random_models

    _, drafter = random_models(load_preset("ocria-mini"), "cpu", dtype)
    drafter.fuse_projections()
    dc = drafter.config
    feats = torch.randn(2, 7, len(dc.target_layer_ids) * dc.hidden_size).to(dtype)
    slots, counts, last = torch.tensor([1, 0]), torch.tensor([7, 4]), torch.tensor([13, 42])
    out = {}
    for on in (False, True):
        policy = replace(ALL_KERNELS, disabled=frozenset({"decode_attention", "kv_write"})) if on else REFERENCE
        cache = DrafterCache.allocate(dc.num_hidden_layers, dc.num_key_value_heads, dc.head_dim, 2, 48, dtype)
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            drafter.append_context(feats, counts, cache, slots, policy)
            out[on] = (*drafter.draft(last, cache, slots, attn_len=32, policy=policy), cache.k[-1].clone())
        calls = [e.name for e in prof.events()]
        layers = dc.num_hidden_layers
        assert calls.count("ocria::plain_rms_norm") == (1 if on else 0)  # context: hidden_norm
        # context: k_norm per layer; block: q_norm, k_norm per layer, each with its rotary embedding
        assert calls.count("ocria::rms_norm_rope") == (3 * layers if on else 0)
        # block: input norm (with the conv's residual add), post-attention norm per layer, final norm
        assert calls.count("ocria::add_plain_rms_norm") == (2 * layers + 1 if on else 0)
    tol = 1e-5 if dtype == torch.float32 else 0.0
    for got, want in zip(out[True], out[False]):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_fused_projections_are_the_same_drafter_with_fewer_gemms():
    """fuse_projections: q/k/v of the block and k/v of the context are one GEMM per layer each."""
    import copy

    from torch.profiler import ProfilerActivity, profile

    from ocria.builder.presets import load_preset, random_models

    _, plain = random_models(load_preset("ocria-mini"), "cpu", torch.float32)
    fused = copy.deepcopy(plain).bind(plain.embed_tokens, plain.lm_head)
    fused.fuse_projections()
    dc = plain.config
    feats = torch.randn(2, 7, len(dc.target_layer_ids) * dc.hidden_size)
    slots, counts, last = torch.tensor([1, 0]), torch.tensor([7, 4]), torch.tensor([13, 42])
    out, gemms = {}, {}
    for name, drafter in (("plain", plain), ("fused", fused)):
        cache = DrafterCache.allocate(dc.num_hidden_layers, dc.num_key_value_heads, dc.head_dim, 2, 48, torch.float32)
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            drafter.append_context(feats, counts, cache, slots)
            out[name] = (*drafter.draft(last, cache, slots, attn_len=32), cache.k[-1].clone(), cache.v[-1].clone())
        gemms[name] = sum(e.name == "aten::linear" for e in prof.events())
    for got, want in zip(out["fused"], out["plain"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    layers = dc.num_hidden_layers
    assert gemms["plain"] - gemms["fused"] == 4 * layers  # per layer: q,k,v 3 -> 1, gate,up 2 -> 1, context k,v 2 -> 1


def test_cached_rope_is_the_computed_rope():
    """The per-cache-length cos/sin table gathers exactly what the per-call computation gives."""
    from ocria.builder.presets import load_preset, random_models

    _, drafter = random_models(load_preset("ocria-mini"), "cpu", torch.float32)
    dc = drafter.config
    cache = DrafterCache.allocate(dc.num_hidden_layers, dc.num_key_value_heads, dc.head_dim, 2, 300, torch.float32)
    pos = torch.tensor([[0, 1, 2], [297, 298, 299]])
    for dtype in (torch.float32, torch.bfloat16):
        got, want = drafter._cached_rope(pos, dtype, cache), drafter._rope(pos, dtype)
        assert all(torch.equal(g, w) and g.dtype == dtype for g, w in zip(got, want))
