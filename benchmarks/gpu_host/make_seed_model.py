# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A seed-shaped model directory for one H200: MiniMax-M2.5's own config.json with its layers cut.

The architecture, the 256 experts (8 active), the attention shape (48 heads of 128, 8 KV heads), the vocabulary
(200,064) and the FP8 128x128 weight blocks stay as they are; only `num_hidden_layers` changes (16 of 62 make about
57 GiB of weights, the size of one TP4 shard of the real model). The tokenizer is borrowed from another model
directory (vLLM reads only the token ids it produces, all below the vocabulary). A DST already written for the same
config is left alone.

`checkpoint_tensors` lists the cut's checkpoint tensor by tensor, named and typed as MiniMax's safetensors store
them: FP8 projections with one float32 scale per 128x128 block (`weight_scale_inv`), the router (`gate`) in bf16
with its float32 score correction bias, norms, embeddings and lm_head in bf16. `checkpoint_bytes` is their sum, the
catalog entry's `checkpoint_size` for a cut without weights (its unit test keeps them equal).

Without --weights no weights are written: the server loads random ones (`--load-format dummy`). With --weights
(torch and safetensors needed) every tensor is written with random values, drawn on the GPU where there is one: one
safetensors file per layer, one for the rest, and the index, as a checkpoint on the hub is laid out, so that a
start reads them from disk.

usage: python3 make_seed_model.py CONFIG TOKENIZER_DIR DST [--layers N] [--weights]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
DEFAULT_LAYERS = 16
INDEX = "model.safetensors.index.json"
# Bytes per element of each kind of tensor; a weight_scale_inv is a float32.
ELEMENT_BYTES = {"fp8": 1, "bf16": 2, "fp32": 4}


def cut_config(config: dict, layers: int) -> dict:
    if not 1 <= layers <= config["num_hidden_layers"]:
        raise ValueError(f"layers must be 1 to {config['num_hidden_layers']}, got {layers}")
    return {**config, "num_hidden_layers": layers}


def _fp8_linear(name: str, rows: int, columns: int, block: list) -> dict:
    """An FP8 weight and its float32 scale per block."""
    scales = (math.ceil(rows / block[0]), math.ceil(columns / block[1]))
    return {f"{name}.weight": ((rows, columns), "fp8"), f"{name}.weight_scale_inv": (scales, "fp32")}


def layer_tensors(config: dict, layer: int) -> dict:
    """One decoder layer's tensors: {name: (shape, kind)}."""
    hidden, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim, expert_width = config["head_dim"], config["intermediate_size"]
    block = config["quantization_config"]["weight_block_size"]
    prefix = f"model.layers.{layer}"
    tensors = {
        **_fp8_linear(f"{prefix}.self_attn.q_proj", heads * head_dim, hidden, block),
        **_fp8_linear(f"{prefix}.self_attn.k_proj", kv_heads * head_dim, hidden, block),
        **_fp8_linear(f"{prefix}.self_attn.v_proj", kv_heads * head_dim, hidden, block),
        **_fp8_linear(f"{prefix}.self_attn.o_proj", hidden, heads * head_dim, block),
        f"{prefix}.self_attn.q_norm.weight": ((heads * head_dim,), "bf16"),
        f"{prefix}.self_attn.k_norm.weight": ((kv_heads * head_dim,), "bf16"),
        f"{prefix}.input_layernorm.weight": ((hidden,), "bf16"),
        f"{prefix}.post_attention_layernorm.weight": ((hidden,), "bf16"),
        # The router stays in bf16 (modules_to_not_convert: gate), its score correction bias in float32.
        f"{prefix}.block_sparse_moe.gate.weight": ((config["num_local_experts"], hidden), "bf16"),
        f"{prefix}.block_sparse_moe.e_score_correction_bias": ((config["num_local_experts"],), "fp32"),
    }
    for expert in range(config["num_local_experts"]):
        name = f"{prefix}.block_sparse_moe.experts.{expert}"
        tensors |= _fp8_linear(f"{name}.w1", expert_width, hidden, block)  # gate projection
        tensors |= _fp8_linear(f"{name}.w3", expert_width, hidden, block)  # up projection
        tensors |= _fp8_linear(f"{name}.w2", hidden, expert_width, block)  # down projection
    return tensors


def outer_tensors(config: dict) -> dict:
    """The tensors outside the layers: embeddings, the final norm, lm_head."""
    vocabulary, hidden = config["vocab_size"], config["hidden_size"]
    return {
        "model.embed_tokens.weight": ((vocabulary, hidden), "bf16"),
        "model.norm.weight": ((hidden,), "bf16"),
        "lm_head.weight": ((vocabulary, hidden), "bf16"),
    }


def checkpoint_files(config: dict) -> dict:
    """{file name: its tensors}: one file per layer, then one for the tensors outside the layers."""
    layers = config["num_hidden_layers"]
    total = layers + 1
    names = [f"model-{index:05d}-of-{total:05d}.safetensors" for index in range(1, total + 1)]
    contents = [*(layer_tensors(config, layer) for layer in range(layers)), outer_tensors(config)]
    return dict(zip(names, contents, strict=True))


def tensor_bytes(shape: tuple, kind: str) -> int:
    return math.prod(shape) * ELEMENT_BYTES[kind]


def checkpoint_bytes(config: dict) -> int:
    """Bytes of the checkpoint of a MiniMax-M2-style FP8 config (one GPU holds all of it at TP 1)."""
    return sum(tensor_bytes(*spec) for tensors in checkpoint_files(config).values() for spec in tensors.values())


def write_weights(config: dict, target: Path) -> dict:
    """Random values for every tensor of checkpoint_files, written file by file, and the index."""
    import torch  # pylint: disable=import-outside-toplevel
    from safetensors.torch import save_file  # pylint: disable=import-outside-toplevel

    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(0)
    started, drawn_s, weight_map, written = time.monotonic(), 0.0, {}, 0
    for file_name, tensors in checkpoint_files(config).items():
        drawing = time.monotonic()
        values = {}
        for name, (shape, kind) in tensors.items():
            if name.endswith("norm.weight"):
                values[name] = torch.ones(shape, dtype=torch.bfloat16)
            elif name.endswith("weight_scale_inv"):
                # FP8 values drawn at a standard deviation of one, scaled back to the 0.02 of the other weights.
                values[name] = torch.full(shape, 0.02, dtype=torch.float32)
            elif kind == "fp32":
                values[name] = torch.zeros(shape, dtype=torch.float32)
            else:
                drawn = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
                drawn = drawn.to(torch.float8_e4m3fn) if kind == "fp8" else (drawn * 0.02).to(torch.bfloat16)
                values[name] = drawn.cpu()
        drawn_s += time.monotonic() - drawing
        save_file(values, str(target / file_name), metadata={"format": "pt"})
        written += (target / file_name).stat().st_size
        weight_map |= dict.fromkeys(tensors, file_name)
    (target / INDEX).write_text(json.dumps({"metadata": {"total_size": checkpoint_bytes(config)},
                                            "weight_map": weight_map}, indent=1) + "\n")  # fmt: skip
    return {"device": device, "drawn_s": round(drawn_s, 1), "written_s": round(time.monotonic() - started - drawn_s, 1),
            "file_bytes": written}  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path, help="the model's own config.json")
    parser.add_argument("tokenizer", type=Path, help="a model directory whose tokenizer files are borrowed")
    parser.add_argument("target", type=Path)
    parser.add_argument("--layers", type=int, default=DEFAULT_LAYERS)
    parser.add_argument("--weights", action="store_true", help="write random weights (torch and safetensors needed)")
    args = parser.parse_args()
    config = cut_config(json.loads(args.config.read_text()), args.layers)
    written = args.target / "config.json"
    complete = written.exists() and json.loads(written.read_text()) == config
    if complete and args.weights:
        complete = (args.target / INDEX).exists()
    printed = {"path": str(args.target), "layers": args.layers, "checkpoint_bytes": checkpoint_bytes(config),
               "checkpoint_gib": round(checkpoint_bytes(config) / 2**30, 2)}  # fmt: skip
    if complete:
        print(f"{args.target} already holds this config" + (" and its weights" if args.weights else ""))
    else:
        # The index last: a directory with it holds every file before it.
        (args.target / INDEX).unlink(missing_ok=True)
        args.target.mkdir(parents=True, exist_ok=True)
        args.target.chmod(0o755)
        for name in TOKENIZER_FILES:
            if (args.tokenizer / name).exists():
                shutil.copyfile(args.tokenizer / name, args.target / name)
        written.write_text(json.dumps(config, indent=2) + "\n")
        if args.weights:
            printed |= write_weights(config, args.target)
        for path in args.target.iterdir():
            path.chmod(0o644)
    print(json.dumps(printed))


if __name__ == "__main__":
    main()
