# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A model's shape as the layout planner needs it, read from its config.json.

Heads and KV heads, layers, MLA's latent KV, experts and the intermediate size of each MLP part, and the
quantisation that each part's tensor parallel shards must stay aligned to (FP8 blocks, INT4 and NVFP4
groups), from the config.json of the hub's checkpoints; the key that is missing or wrong is named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Representative module names of each MLP part, matched against a checkpoint's list of modules that
# stay unquantised (DeepSeek-style names; the patterns in configs are written against them).
PART_MODULES = {
    "routed experts": "model.layers.1.mlp.experts.0.gate_proj",
    "shared experts": "model.layers.1.mlp.shared_experts.gate_proj",
    "dense MLP": "model.layers.0.mlp.gate_proj",
    "router": "model.layers.1.mlp.gate",
}


class PlanInputError(ValueError):
    """A config.json or GPU facts that the planner cannot read; the message says which key."""


@dataclass(frozen=True)
class ModelShape:
    """What layout planning needs from config.json."""

    attention_heads: int
    kv_heads: int
    head_dim: int
    layers: int
    max_position_embeddings: int | None
    # kv_lora_rank + qk_rope_head_dim for MLA (one latent KV head), None otherwise.
    mla_latent_dim: int | None
    experts: int
    # Intermediate size of each MLP part present ("routed experts", "shared experts", "dense MLP").
    intermediate_sizes: dict
    # (unit, description) that each quantised intermediate shard must be a multiple of, or None.
    quantization_unit: tuple | None
    quantized_parts: frozenset
    # Whether the MoE router (one output per expert) is block-quantised with the rest.
    quantized_router: bool
    quantization: str
    # Share of the checkpoint's bytes held by routed experts (split by EP rather than TP).
    expert_byte_fraction: float


def _text_config(config):
    # Multimodal checkpoints (Kimi-K2.5) keep the language model's shape under text_config.
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def _positive(config, key, default=None):
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanInputError(f"config.json: {key} must be a whole number of at least 1, got {value!r}")
    return value


def _optional_positive(config, key):
    return _positive(config, key) if config.get(key) else None


def _is_ignored(module, patterns):
    """Whether a module stays unquantised: `re:` patterns as compressed-tensors matches them, plain
    names as a whole trailing part of the module's dotted name (`gate` is the router, not gate_proj)."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], module):
                return True
        elif module == pattern or module.endswith("." + pattern):
            return True
    return False


def _block(value, key):
    """A weight block [rows, columns] of whole numbers; PlanInputError for anything else."""
    if not isinstance(value, list) or len(value) != 2 or not all(_is_whole(size) for size in value):
        raise PlanInputError(f"config.json: quantization_config.{key} must be two whole numbers, got {value!r}")
    return value


def _is_whole(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _integer(mapping, key, default, where):
    """A whole number of quantization_config (a negative group size means none); PlanInputError otherwise."""
    value = mapping.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanInputError(f"config.json: quantization_config{where}.{key} must be a whole number, got {value!r}")
    return value


def _quantization(quant):
    """(name, unit, unit description, bits per routed-expert weight, unquantised module patterns)."""
    if not isinstance(quant, dict):
        raise PlanInputError(f"config.json: quantization_config must be a mapping, got {quant!r}")
    method = quant.get("quant_method")
    if method == "fp8":
        block = quant.get("weight_block_size") and _block(quant["weight_block_size"], "weight_block_size")
        unit = (max(block), f"FP8 weight block {block[0]}x{block[1]}") if block else None
        return "fp8", unit, 8, quant.get("modules_to_not_convert") or quant.get("ignored_layers") or []
    if method == "compressed-tensors":
        config_groups = quant.get("config_groups") or {}
        if not isinstance(config_groups, dict) or not all(isinstance(group, dict) for group in config_groups.values()):
            raise PlanInputError(
                f"config.json: quantization_config.config_groups must map names to groups, got {config_groups!r}"
            )
        groups = [group.get("weights") or {} for group in config_groups.values()]
        weights = groups[0] if groups and isinstance(groups[0], dict) else {}
        bits = _integer(weights, "num_bits", 16, ".config_groups.*.weights")
        name = f"{'fp' if weights.get('type') == 'float' else 'int'}{bits}"
        name = "nvfp4" if name == "fp4" else name
        unit = None
        if weights.get("strategy") == "group" and weights.get("group_size"):
            group = _integer(weights, "group_size", 0, ".config_groups.*.weights")
            unit = (group, f"{name.upper()} quantisation group {group}") if group > 0 else None
        elif weights.get("strategy") == "block" and weights.get("block_structure"):
            block = _block(weights["block_structure"], "config_groups.*.weights.block_structure")
            unit = (max(block), f"{name.upper()} weight block {block[0]}x{block[1]}")
        return name, unit, bits, quant.get("ignore") or []
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        bits, group = _integer(quant, "bits", 4, ""), _integer(quant, "group_size", -1, "")
        unit = (group, f"INT{bits} quantisation group {group}") if group and group > 0 else None
        return f"int{bits}", unit, bits, quant.get("modules_to_not_convert") or []
    if method == "modelopt":
        algo = str(quant.get("quant_algo", "")).upper()
        if "FP4" in algo:
            group = _integer(quant, "group_size", 16, "")
            unit = (group, f"NVFP4 quantisation group {group}") if group > 0 else None
            return "nvfp4", unit, 4, quant.get("exclude_modules") or []
        return "fp8", None, 8, quant.get("exclude_modules") or []
    return (method or "none"), None, 16, []


def _attention_params(config, hidden, heads):
    """Parameters of one layer's attention, for the share of the checkpoint that is not experts."""
    if config.get("kv_lora_rank"):
        rope, nope = config.get("qk_rope_head_dim", 0), config.get("qk_nope_head_dim", 0)
        q_lora = config.get("q_lora_rank") or 0
        query = hidden * q_lora + q_lora * heads * (nope + rope) if q_lora else hidden * heads * (nope + rope)
        value = config.get("v_head_dim", 0)
        latent = hidden * (config["kv_lora_rank"] + rope) + config["kv_lora_rank"] * heads * (nope + value)
        return query + latent + heads * value * hidden
    head_dim = config.get("head_dim") or hidden // heads
    return 2 * hidden * head_dim * (heads + config.get("num_key_value_heads", heads))


def model_shape(config):
    """The ModelShape of a config.json, or PlanInputError naming the key that is missing or wrong."""
    if not isinstance(config, dict):
        raise PlanInputError(f"config.json must be a JSON object, got {type(config).__name__}")
    config = _text_config(config)
    heads = _positive(config, "num_attention_heads")
    hidden = _positive(config, "hidden_size")
    layers = _positive(config, "num_hidden_layers")
    kv_lora_rank = _optional_positive(config, "kv_lora_rank")
    mla_latent_dim = kv_lora_rank + _positive(config, "qk_rope_head_dim") if kv_lora_rank else None
    expert_keys = ("n_routed_experts", "num_local_experts", "num_experts")
    experts = next((config[key] for key in expert_keys if config.get(key)), 0)
    intermediate = _optional_positive(config, "intermediate_size")
    sizes = {}
    dense_layers = layers
    if experts:
        # Mixtral-style configs (MiniMax) give the expert's width as intermediate_size and have no dense MLP.
        sizes["routed experts"] = _optional_positive(config, "moe_intermediate_size") or intermediate
        shared = (config.get("n_shared_experts") or 0) * sizes["routed experts"]
        shared = shared or config.get("shared_intermediate_size")
        if shared:
            sizes["shared experts"] = shared
        dense_layers = config.get("first_k_dense_replace", 0) if config.get("moe_intermediate_size") else 0
        if dense_layers and intermediate:
            sizes["dense MLP"] = intermediate
    elif intermediate:
        sizes["dense MLP"] = intermediate

    quant = config.get("quantization_config") or {}
    name, unit, expert_bits, unquantized = _quantization(quant) if quant else ("none", None, 16, [])
    quantized = frozenset(part for part in sizes if quant and not _is_ignored(PART_MODULES[part], unquantized))

    # Bytes of the routed experts against the rest, in the proportions that the shapes imply
    # (embeddings and attention counted at 16 bits: an estimate of a few percent of the checkpoint).
    moe_layers = layers - dense_layers
    mlp_layers = {"routed experts": moe_layers * experts, "shared experts": moe_layers, "dense MLP": dense_layers}
    mlp_bytes = {
        part: mlp_layers[part] * 3 * hidden * size * (expert_bits if part in quantized else 16) / 8
        for part, size in sizes.items()
    }
    expert_bytes = mlp_bytes.get("routed experts", 0)
    other_params = 2 * config.get("vocab_size", 0) * hidden + layers * _attention_params(config, hidden, heads)
    total_bytes = sum(mlp_bytes.values()) + other_params * 2
    return ModelShape(
        attention_heads=heads,
        kv_heads=_positive(config, "num_key_value_heads", heads),
        head_dim=config.get("head_dim") or hidden // heads,
        layers=layers,
        max_position_embeddings=config.get("max_position_embeddings"),
        mla_latent_dim=mla_latent_dim,
        experts=experts,
        intermediate_sizes=sizes,
        quantization_unit=unit,
        quantized_parts=quantized,
        quantized_router=bool(
            experts and unit and "block" in unit[1] and not _is_ignored(PART_MODULES["router"], unquantized)
        ),
        quantization=name,
        expert_byte_fraction=expert_bytes / total_bytes if total_bytes else 0.0,
    )
