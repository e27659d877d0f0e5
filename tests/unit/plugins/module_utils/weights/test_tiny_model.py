import json

import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from ansible_collections.llmops.vllm.plugins.module_utils.weights.tiny_model import (
    MANIFEST_NAME,
    TinyModelError,
    check_shape,
    generate,
    is_intact,
    parameter_count,
    read_manifest,
    weight_shapes,
)

PARAMS = {
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "dtype": "bfloat16",
    "weights": True,
    "seed": 0,
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny")
    written = generate(str(directory), PARAMS)
    return directory, written


def test_default_shape_has_head_dim_64():
    assert check_shape(PARAMS) == 64


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden_size": 250}, "hidden_size 250 is not divisible by num_attention_heads 4"),
        ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
        ({"vocab_size": 100}, "vocab_size must hold the 256 bytes"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be at least 1"),
    ],
)
def test_invalid_shapes(changes, message):
    with pytest.raises(TinyModelError, match=message):
        check_shape({**PARAMS, **changes})


def test_weight_shapes_follow_grouped_query_attention():
    shapes = weight_shapes(PARAMS, vocab_size=512)
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (256, 256)
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (128, 256)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (256, 512)
    assert len(shapes) == 3 + 9 * PARAMS["num_hidden_layers"]
    # embeddings and head 2 x 512 x 256, norms, and per layer attention 2 x 256^2 + 2 x 128 x 256,
    # MLP 3 x 256 x 512, two norms.
    per_layer = 2 * 256 * 256 + 2 * 128 * 256 + 3 * 256 * 512 + 2 * 256
    assert parameter_count(shapes) == 2 * 512 * 256 + 256 + 2 * per_layer


def test_checkpoint_matches_its_config(checkpoint):
    directory, written = checkpoint
    config = json.loads((directory / "config.json").read_text())
    assert config == written["config"]
    assert config["architectures"] == ["LlamaForCausalLM"]
    tensors = load_file(str(directory / "model.safetensors"))
    assert {name: tensor.shape for name, tensor in tensors.items()} == weight_shapes(PARAMS, config["vocab_size"])
    assert written["num_parameters"] == sum(tensor.size for tensor in tensors.values())


def test_tokenizer_round_trips_text_and_knows_its_special_tokens(checkpoint):
    directory, written = checkpoint
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    text = "The server streams every token, even unseen ones: Zürich 42!"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    assert tokenizer.get_vocab_size() == written["config"]["vocab_size"] <= PARAMS["vocab_size"]
    assert tokenizer.token_to_id("</s>") == written["config"]["eos_token_id"]
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "add_generation_prompt" in tokenizer_config["chat_template"]


def test_same_seed_gives_the_same_files(checkpoint, tmp_path):
    directory = checkpoint[0]
    generate(str(tmp_path), PARAMS)
    assert read_manifest(str(tmp_path))["files"] == read_manifest(str(directory))["files"]


def test_manifest_detects_changed_params_and_files(tmp_path):
    generate(str(tmp_path), PARAMS)
    manifest = read_manifest(str(tmp_path))
    assert is_intact(str(tmp_path), manifest, PARAMS)
    assert not is_intact(str(tmp_path), manifest, {**PARAMS, "seed": 1})
    (tmp_path / "config.json").write_text("{}")
    assert not is_intact(str(tmp_path), manifest, PARAMS)


def test_without_weights_a_stale_weights_file_goes(tmp_path):
    generate(str(tmp_path), PARAMS)
    generate(str(tmp_path), {**PARAMS, "weights": False})
    assert not (tmp_path / "model.safetensors").exists()
    assert set(read_manifest(str(tmp_path))["files"]) == {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    }
    assert (tmp_path / MANIFEST_NAME).exists()
