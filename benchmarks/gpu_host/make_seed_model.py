# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A seed-shaped model directory for one H200: MiniMax-M2.5's own config.json with its layers cut.

The architecture, the 256 experts (8 active), the attention shape (48 heads of 128, 8 KV heads), the vocabulary
(200,064) and the FP8 128x128 weight blocks stay as they are; only `num_hidden_layers` changes (16 of 62 make about
57 GiB of weights, the size of one TP4 shard of the real model). The tokenizer is borrowed from another model
directory (vLLM reads only the token ids it produces, all below the vocabulary). No weights are written: the
server loads random ones (`--load-format dummy`). A DST already written for the same config is left alone.

`checkpoint_bytes` is what the cut's checkpoint would hold, tensor by tensor as MiniMax's safetensors store it:
FP8 projections with one float32 scale per 128x128 block, the router (`gate`), norms, embeddings and lm_head in
bf16. The catalog entry's `checkpoint_size` is this figure (its unit test keeps them equal).

usage: python3 make_seed_model.py CONFIG TOKENIZER_DIR DST [--layers N]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
DEFAULT_LAYERS = 16
BF16, FP32, FP8 = 2, 4, 1


def cut_config(config: dict, layers: int) -> dict:
    if not 1 <= layers <= config["num_hidden_layers"]:
        raise ValueError(f"layers must be 1 to {config['num_hidden_layers']}, got {layers}")
    return {**config, "num_hidden_layers": layers}


def _fp8_linear(rows: int, columns: int, block: list) -> int:
    """An FP8 weight and its float32 scale per block (weight_scale_inv)."""
    return rows * columns * FP8 + math.ceil(rows / block[0]) * math.ceil(columns / block[1]) * FP32


def checkpoint_bytes(config: dict) -> int:
    """Bytes of the checkpoint of a MiniMax-M2-style FP8 config (one GPU holds all of it at TP 1)."""
    hidden, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim, experts, expert_width = config["head_dim"], config["num_local_experts"], config["intermediate_size"]
    block = config["quantization_config"]["weight_block_size"]
    attention = (
        _fp8_linear(heads * head_dim, hidden, block)  # q_proj
        + 2 * _fp8_linear(kv_heads * head_dim, hidden, block)  # k_proj, v_proj
        + _fp8_linear(hidden, heads * head_dim, block)  # o_proj
        + (heads + kv_heads) * head_dim * BF16  # q_norm, k_norm
    )
    expert = 2 * _fp8_linear(expert_width, hidden, block) + _fp8_linear(hidden, expert_width, block)
    # The router stays in bf16 (modules_to_not_convert: gate), its score correction bias in float32.
    router = experts * hidden * BF16 + experts * FP32
    layer = attention + experts * expert + router + 2 * hidden * BF16
    return config["num_hidden_layers"] * layer + 2 * config["vocab_size"] * hidden * BF16 + hidden * BF16


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path, help="the model's own config.json")
    parser.add_argument("tokenizer", type=Path, help="a model directory whose tokenizer files are borrowed")
    parser.add_argument("target", type=Path)
    parser.add_argument("--layers", type=int, default=DEFAULT_LAYERS)
    args = parser.parse_args()
    config = cut_config(json.loads(args.config.read_text()), args.layers)
    written = args.target / "config.json"
    if written.exists() and json.loads(written.read_text()) == config:
        print(f"{args.target} already holds this config")
    else:
        args.target.mkdir(parents=True, exist_ok=True)
        args.target.chmod(0o755)
        for name in TOKENIZER_FILES:
            if (args.tokenizer / name).exists():
                shutil.copyfile(args.tokenizer / name, args.target / name)
        written.write_text(json.dumps(config, indent=2) + "\n")
        for path in args.target.iterdir():
            path.chmod(0o644)
    size = checkpoint_bytes(config)
    print(json.dumps({"path": str(args.target), "layers": args.layers, "checkpoint_bytes": size,
                      "checkpoint_gib": round(size / 2**30, 2)}))  # fmt: skip


if __name__ == "__main__":
    main()
