"""The seed-shaped model of the GPU host's runs (benchmarks/gpu_host/make_seed_model.py): MiniMax-M2.5's own
config.json cut to fewer layers, and the bytes its FP8 checkpoint would hold, which the catalog entry gives the
planner."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "gpu_host" / "make_seed_model.py"
SPEC = importlib.util.spec_from_file_location("make_seed_model", SCRIPT)
seed = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(seed)

CONFIG = ROOT / "tests" / "unit" / "fixtures" / "configs" / "MiniMax-M2.5.config.json"
ENTRY = ROOT / "benchmarks" / "gpu_host" / "catalog" / "h200" / "seed.yml"


def test_the_whole_model_comes_to_the_size_of_minimax_m25s_checkpoint():
    """62 layers come to the 230 GB that the hub lists for MiniMax-M2.5 (models/minimax_m25.yml)."""
    config = json.loads(CONFIG.read_text())
    assert round(seed.checkpoint_bytes(config) / 1e9) == 230


def test_the_cut_keeps_everything_but_the_layer_count():
    config = json.loads(CONFIG.read_text())
    cut = seed.cut_config(config, 16)
    assert cut["num_hidden_layers"] == 16
    assert {key: value for key, value in cut.items() if key != "num_hidden_layers"} == {
        key: value for key, value in config.items() if key != "num_hidden_layers"
    }


def test_the_catalog_entry_gives_the_planner_the_bytes_of_its_cut():
    entry = yaml.safe_load(ENTRY.read_text())
    cut = seed.cut_config(json.loads(CONFIG.read_text()), 16)
    assert entry["checkpoint_size"] == seed.checkpoint_bytes(cut)
    # About one TP4 shard of the real model: it fits one H200 with room for the KV cache.
    assert 56 < entry["checkpoint_size"] / 2**30 < 58


def test_the_directory_has_the_cut_config_and_the_borrowed_tokenizer_and_no_weights(tmp_path):
    tokenizer = tmp_path / "tiny"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text('{"model": {}}')
    (tokenizer / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    target = tmp_path / "seed"
    command = [sys.executable, str(SCRIPT), str(CONFIG), str(tokenizer), str(target), "--layers", "15"]
    printed = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    assert sorted(path.name for path in target.iterdir()) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    assert json.loads((target / "config.json").read_text())["num_hidden_layers"] == 15
    assert printed["checkpoint_bytes"] == seed.checkpoint_bytes(json.loads((target / "config.json").read_text()))
    again = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert "already holds this config" in again


def test_the_checkpoint_is_laid_out_as_minimaxs_a_file_a_layer_every_projection_fp8_with_its_block_scales():
    config = seed.cut_config(json.loads(CONFIG.read_text()), 2)
    files = seed.checkpoint_files(config)
    assert list(files) == [f"model-0000{index}-of-00003.safetensors" for index in (1, 2, 3)]
    outside = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    assert list(files["model-00003-of-00003.safetensors"]) == outside
    names = [name for tensors in files.values() for name in tensors]
    assert len(names) == len(set(names))
    layer = files["model-00002-of-00003.safetensors"]
    assert {name.split(".")[2] for name in layer} == {"1"}
    assert layer["model.layers.1.block_sparse_moe.experts.255.w2.weight"] == ((3072, 1536), "fp8")
    assert layer["model.layers.1.block_sparse_moe.experts.255.w2.weight_scale_inv"] == ((24, 12), "fp32")
    assert layer["model.layers.1.self_attn.q_proj.weight"] == ((48 * 128, 3072), "fp8")
    fp8 = [name for name, (_shape, kind) in layer.items() if kind == "fp8"]
    # q, k, v, o and each of the 256 experts' w1, w2, w3; each with its scales.
    assert len(fp8) == 4 + 256 * 3
    assert all(layer[f"{name}_scale_inv"][1] == "fp32" for name in fp8)


def test_what_the_config_leaves_unconverted_is_not_fp8():
    config = seed.cut_config(json.loads(CONFIG.read_text()), 1)
    kept = config["quantization_config"]["modules_to_not_convert"]
    found = {
        module: kind
        for tensors in seed.checkpoint_files(config).values()
        for name, (_shape, kind) in tensors.items()
        for module in kept
        if module in name.split(".")
    }
    assert found == {"gate": "bf16", "e_score_correction_bias": "fp32", "lm_head": "bf16"}
