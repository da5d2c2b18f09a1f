"""The TensorRT-LLM deployment (``ocria-build triton-repo --backend tensorrt-llm``) against TensorRT-LLM's llmapi
model contract recorded in ``ocria/serving/trtllm_fields.json``. TensorRT-LLM itself cannot be installed here: a
stand-in ``all_models`` directory plays the container's (its config.pbtxt is the recorded one)."""

import json
import re
import shutil

import pytest
import yaml

from ocria.builder.dflash_export import export_plain_dflash
from ocria.cli import build_main
from ocria.errors import CheckpointError, ConfigError, OcriaError
from ocria.models.config import DrafterConfig
from ocria.serving.repo import parse_config
from ocria.serving.trtllm_repo import (
    FIELDS_FILE,
    TEMPLATES,
    TrtllmRepoOptions,
    check_llm_args,
    recorded,
    tensors,
    validate_trtllm_repo,
    write_trtllm_repo,
)

pytest.importorskip("tritonclient.grpc")


@pytest.fixture(scope="module")
def engine_dir(mini_engine):
    return mini_engine


@pytest.fixture
def all_models(tmp_path):
    """A stand-in for the container's all_models: llmapi/tensorrt_llm/{config.pbtxt, 1/model.py, 1/helpers.py}."""
    model = tmp_path / "all_models" / "llmapi" / "tensorrt_llm"
    (model / "1").mkdir(parents=True)
    shutil.copy(TEMPLATES / "tensorrt-llm" / "tensorrt_llm" / "config.pbtxt", model / "config.pbtxt")
    (model / "1" / "model.py").write_text("from helpers import get_streaming_from_request  # stand-in\n")
    (model / "1" / "helpers.py").write_text("def get_streaming_from_request(request):  # stand-in\n    return False\n")
    return tmp_path / "all_models"


def _write(tmp_path, engine_dir, all_models, **kw):
    return write_trtllm_repo(tmp_path / "out", TrtllmRepoOptions(engine_dir, all_models, **kw))


def test_cli_writes_a_deployment_with_the_llmapi_models_contract(tmp_path, engine_dir, all_models, capsys):
    out = tmp_path / "deploy"
    argv = ["triton-repo", "--backend", "tensorrt-llm", "--engine", str(engine_dir), "--out", str(out),
            "--trtllm-models", str(all_models)]
    assert build_main(argv) == 0
    assert "mount engine/ at /engines/mini" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all_models", "deploy"]  # no temporary left behind
    assert sorted(p.name for p in out.iterdir()) == ["engine", "models"]
    model = out / "models" / "tensorrt_llm"
    cfg = parse_config(model / "config.pbtxt")
    # Triton names, types and dims equal the llmapi model's (recorded from its config.pbtxt at a commit)
    contract = recorded()["llmapi_model"]
    assert tensors(cfg) == {"input": contract["input"], "output": contract["output"]}
    inputs = {t["name"]: t for t in tensors(cfg)["input"]}
    assert inputs["text_input"] == {"name": "text_input", "data_type": "TYPE_STRING", "dims": [-1], "optional": False}
    assert inputs["image_url"] == {"name": "image_url", "data_type": "TYPE_STRING", "dims": [-1], "optional": True}
    assert inputs["streaming"]["data_type"] == "TYPE_BOOL" and inputs["sampling_param_max_tokens"]["dims"] == [1]
    assert not {"max_tokens", "stream", "temperature", "image_bytes_input"} & set(inputs)  # the C++ ensemble's
    assert cfg.max_batch_size == 0 and not cfg.HasField("model_transaction_policy")  # set from model.yaml
    assert (cfg.instance_group[0].count, cfg.instance_group[0].kind) == (1, cfg.instance_group[0].KIND_CPU)
    for name in ("model.py", "helpers.py"):  # copied from the container, byte for byte
        assert (model / "1" / name).read_bytes() == (all_models / "llmapi" / "tensorrt_llm" / "1" / name).read_bytes()

    opts = yaml.safe_load((model / "1" / "model.yaml").read_text())
    assert opts["triton_config"] == {"max_batch_size": 0, "decoupled": True, "multimodal": True}
    assert (opts["model"], opts["tokenizer"], opts["backend"]) == ("/engines/mini/target",) * 2 + ("pytorch",)
    drafter = json.loads((engine_dir / "drafter" / "config.json").read_text())
    assert opts["speculative_config"] == {
        "decoding_type": "DFlash", "max_draft_len": drafter["block_size"] - 1,
        "speculative_model_dir": "/engines/mini/drafter", "mask_token_id": drafter["dflash_config"]["mask_token_id"],
        "target_layer_ids": drafter["dflash_config"]["target_layer_ids"]}
    assert opts["max_batch_size"] == opts["cuda_graph_config"]["max_batch_size"] == 64  # the engine profile's

    target = out / "engine" / "target"
    for name in ("config.json", "model.safetensors"):
        assert (target / name).read_bytes() == (engine_dir / "target" / name).read_bytes()
    for name in ("preprocessor_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (target / name).read_bytes() == (engine_dir / "tokenizer" / name).read_bytes()
    plain = json.loads((out / "engine" / "drafter" / "config.json").read_text())["dflash_config"]
    assert plain == {k: drafter["dflash_config"][k] for k in ("mask_token_id", "target_layer_ids")}

    assert build_main(argv) == 2
    assert "already exists" in capsys.readouterr().err


def test_target_directory_loads_with_transformers(tmp_path, engine_dir, all_models):
    """TensorRT-LLM builds its Qwen3-VL input processor with AutoProcessor.from_pretrained(model); the engine's own
    target/ fails that exactly as issue 64 saw, the exported one loads."""
    import numpy as np
    from PIL import Image
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, PreTrainedTokenizerFast
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    with pytest.raises(OSError, match="Can't load image processor"):
        AutoImageProcessor.from_pretrained(engine_dir / "target")
    target = _write(tmp_path, engine_dir, all_models) / "engine" / "target"
    config = AutoConfig.from_pretrained(target)
    assert PROCESSOR_MAPPING_NAMES[config.model_type] == "Qwen3VLProcessor"
    image = AutoImageProcessor.from_pretrained(target)(Image.fromarray(np.full((64, 96, 3), 200, np.uint8)))
    assert image["image_grid_thw"].tolist() == [[1, 4, 6]]  # 16-pixel patches of the 64 x 96 page
    ours = PreTrainedTokenizerFast.from_pretrained(engine_dir / "tokenizer")
    theirs = AutoTokenizer.from_pretrained(target)
    text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|># Report\n| a | b |<|im_end|>\n"
    assert theirs(text)["input_ids"] == ours(text)["input_ids"]


def test_mount_point_and_max_batch(tmp_path, engine_dir, all_models):
    out = _write(tmp_path, engine_dir, all_models, mount="/srv/ocria/", max_batch=4)
    opts = validate_trtllm_repo(out)
    assert (opts["model"], opts["speculative_config"]["speculative_model_dir"]) == \
        ("/srv/ocria/target", "/srv/ocria/drafter")
    assert opts["max_batch_size"] == 4 and opts["triton_config"]["max_batch_size"] == 0
    for bad in ("engines/mini", "/engines/../etc", "/engines/${x}", "/my engines"):
        with pytest.raises(OcriaError, match="--mount must be an absolute container path"):
            write_trtllm_repo(tmp_path / "bad", TrtllmRepoOptions(engine_dir, all_models, mount=bad))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all_models", "out"]


def test_the_containers_llmapi_model_is_required_and_checked(tmp_path, engine_dir, all_models, capsys):
    argv = ["triton-repo", "--backend", "tensorrt-llm", "--engine", str(engine_dir), "--out", str(tmp_path / "o")]
    assert build_main(argv) == 2
    err = capsys.readouterr().err
    assert "needs --trtllm-models DIR" in err and len(err.strip().splitlines()) == 1
    (all_models / "llmapi" / "tensorrt_llm" / "1" / "helpers.py").unlink()
    assert build_main(argv + ["--trtllm-models", str(all_models)]) == 2
    assert re.search(r"not TensorRT-LLM's all_models directory \(missing .*1/helpers\.py\)", capsys.readouterr().err)
    (all_models / "llmapi" / "tensorrt_llm" / "1" / "helpers.py").write_text("")
    theirs = all_models / "llmapi" / "tensorrt_llm" / "config.pbtxt"
    recorded_cfg = theirs.read_text()
    # an older container: no image_url input
    theirs.write_text(re.sub(r'  \{ name: "image_url"[^\n]*\n', "", recorded_cfg))
    with pytest.raises(OcriaError, match="input 'image_url' missing or of another type/shape"):
        _write(tmp_path, engine_dir, all_models)
    # a container whose model requires an input the recorded one does not have
    new_input = '  { name: "new_one" data_type: TYPE_BOOL dims: [ 1 ] },\n'
    theirs.write_text(recorded_cfg.replace("input [\n", "input [\n" + new_input))
    with pytest.raises(OcriaError, match=r"requires inputs \['new_one'\]"):
        _write(tmp_path, engine_dir, all_models)
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()
    # options the llmapi model would ignore (--instances auto is 1 to 8)
    for ocria_only in (["--gpus", "0"], ["--device", "gpu"], ["--instances", "9"]):
        assert build_main(argv + ["--trtllm-models", str(all_models), *ocria_only]) == 2
        assert "are for --backend ocria" in capsys.readouterr().err


def test_model_yaml_keys_are_checked_against_tensorrt_llms_fields(tmp_path, engine_dir, all_models):
    data = json.loads(FIELDS_FILE.read_text())
    assert re.fullmatch(r"[0-9a-f]{40}", data["llm_args"]["commit"])
    assert re.fullmatch(r"[0-9a-f]{40}", data["llmapi_model"]["commit"])
    check_llm_args({"model": "m", "speculative_config": {"decoding_type": "DFlash", "speculative_model_dir": "d",
                                                         "speculative_model": "d"}}, "x")
    with pytest.raises(ConfigError, match="'max_tokens' is not an LLM\\(\\) argument"):
        check_llm_args({"model": "m", "max_tokens": 5}, "x")
    with pytest.raises(ConfigError, match="speculative_config.local_conv_kernel is not a field of DFlashDecoding"):
        check_llm_args({"speculative_config": {"decoding_type": "DFlash", "local_conv_kernel": 3}}, "x")
    with pytest.raises(ConfigError, match="kv_cache_config.free_gpu_memory is not a field of KvCacheConfig"):
        check_llm_args({"kv_cache_config": {"free_gpu_memory": 0.5}}, "x")

    out = _write(tmp_path, engine_dir, all_models)
    path = out / "models" / "tensorrt_llm" / "1" / "model.yaml"
    good = path.read_text()
    path.write_text(good + "stream_interval: 2\n")  # a real TorchLlmArgs field
    validate_trtllm_repo(out)
    path.write_text(good + "max_tokens: 64\n")
    with pytest.raises(ConfigError, match="'max_tokens' is not an LLM"):
        validate_trtllm_repo(out)
    path.write_text(good.replace("multimodal: true", "multimodal: false"))
    with pytest.raises(ConfigError, match="multimodal true"):
        validate_trtllm_repo(out)
    path.write_text(good.replace("  decoupled: true", "  decoupled: true\n  output_config: {}"))
    with pytest.raises(ConfigError, match="triton_config key 'output_config' is not read"):
        validate_trtllm_repo(out)
    path.write_text(good)
    cfg = out / "models" / "tensorrt_llm" / "config.pbtxt"
    good = cfg.read_text()
    cfg.write_text(good.replace('"sampling_param_max_tokens"', '"max_tokens"'))
    with pytest.raises(ConfigError, match=r"inputs differ from the llmapi model's .*'max_tokens'"):
        validate_trtllm_repo(out)
    cfg.write_text(good.replace("kind: KIND_CPU", "kind: KIND_GPU"))
    with pytest.raises(ConfigError, match="instance_group must be one KIND_CPU instance"):
        validate_trtllm_repo(out)


def test_plain_dflash_export_drops_dflash2s_parts_only(tmp_path, engine_dir):
    from safetensors.torch import load_file

    src = engine_dir / "drafter"
    export_plain_dflash(src, tmp_path / "plain")
    before, after = load_file(src / "model.safetensors"), load_file(tmp_path / "plain" / "model.safetensors")
    dropped = sorted(set(before) - set(after))
    assert dropped and all(re.fullmatch(r"layers\.\d+\.local_conv\.weight|selector_head\.(weight|bias)", k)
                           for k in dropped)
    assert all(after[k].equal(before[k]) for k in after)
    cfg = DrafterConfig.from_dict(json.loads((tmp_path / "plain" / "config.json").read_text()))
    was = DrafterConfig.from_dict(json.loads((src / "config.json").read_text()))
    assert (was.local_conv_kernel, was.selector_head) == (3, True)
    assert (cfg.local_conv_kernel, cfg.selector_head, cfg.mask_token_id, cfg.target_layer_ids, cfg.block_size) == \
        (0, False, was.mask_token_id, was.target_layer_ids, was.block_size)
    with pytest.raises(FileExistsError):  # never writes over an existing directory
        export_plain_dflash(src, tmp_path / "plain")
    with pytest.raises(CheckpointError, match="needs config.json and a single model.safetensors"):
        export_plain_dflash(tmp_path / "nothing", tmp_path / "p2")
