"""Bad checkpoints fail with one error naming the file and the tensor."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import hf_vlm, save_hf, vlm_config

from ocria.errors import CheckpointError, ConfigError
from ocria.models import OCRiaForConditionalGeneration

NAME = "model.language_model.layers.1.linear_attn.in_proj_qkv.weight"


@pytest.fixture()
def ckpt(tmp_path):
    return save_hf(hf_vlm(vlm_config()), tmp_path / "ckpt")


def rewrite(path, edit):
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_missing_tensor(ckpt):
    rewrite(ckpt, lambda t: t.pop(NAME))
    with pytest.raises(CheckpointError, match=f"ckpt.*{NAME}.*missing"):
        OCRiaForConditionalGeneration.from_pretrained(ckpt)


def test_wrong_shape(ckpt):
    rewrite(ckpt, lambda t: t.update({NAME: torch.zeros(3, 3)}))
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor .*in_proj_qkv.* has shape \(3, 3\)"):
        OCRiaForConditionalGeneration.from_pretrained(ckpt)


def test_wrong_dtype(ckpt):
    rewrite(ckpt, lambda t: t.update({NAME: t[NAME].to(torch.int32)}))
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor .*in_proj_qkv.* has dtype torch.int32"):
        OCRiaForConditionalGeneration.from_pretrained(ckpt)


def test_unexpected_tensor(ckpt):
    rewrite(ckpt, lambda t: t.update({"model.language_model.layers.9.mlp.up_proj.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match="unexpected tensor .*layers.9"):
        OCRiaForConditionalGeneration.from_pretrained(ckpt)


def test_unknown_model_type(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model_type"] = "llama"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="model_type 'llama' is not supported"):
        OCRiaForConditionalGeneration.from_pretrained(ckpt)


def test_inconsistent_config(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["text_config"]["layer_types"] = cfg["text_config"]["layer_types"][:2]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="layer_types has 2 entries but num_hidden_layers is 4"):
        OCRiaForConditionalGeneration.from_pretrained(ckpt)


def test_truncated_file(ckpt):
    path = ckpt / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="model.safetensors: unreadable safetensors file"):
        OCRiaForConditionalGeneration.from_pretrained(ckpt)


def test_missing_shard(tmp_path):
    ckpt = save_hf(hf_vlm(vlm_config()), tmp_path / "sharded", shards=3)
    shard = sorted(ckpt.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"{shard.name}: shard listed in the index does not exist"):
        OCRiaForConditionalGeneration.from_pretrained(ckpt)


def test_no_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(vlm_config()))
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        OCRiaForConditionalGeneration.from_pretrained(tmp_path)
