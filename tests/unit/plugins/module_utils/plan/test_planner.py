"""The layout planner on the real config.json of MiniMax-M2.5 and Kimi-K2.5, on the seed report's host."""

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.plan.model_shape import PlanInputError, model_shape
from ansible_collections.llmops.vllm.plugins.module_utils.plan.planner import (
    GIB,
    Layout,
    check_kv_heads,
    failure_message,
    kv_bytes_per_token,
    plan,
)


def statuses(result):
    return {check["rule"]: check["status"] for check in result["checks"]}


def test_minimax_tp8_is_rejected_for_fp8_block_alignment_with_tp4_and_ep8_suggested(entry, config, seed_box):
    result = plan(entry("minimax_m25"), config("MiniMax-M2.5"), seed_box, {"tensor_parallel_size": 8})
    assert result["ok"] is False
    assert result["failed_rule"] == "quantization_alignment"
    assert "1536 / TP 8 = 192 is not a multiple of the FP8 weight block 128x128" in result["reason"]
    suggested = [item["layout"] for item in result["passing_layouts"]]
    assert {"tensor_parallel_size": 4} in suggested
    assert {"tensor_parallel_size": 8, "expert_parallel_size": 8} in suggested
    assert {"tensor_parallel_size": 1, "data_parallel_size": 8, "expert_parallel_size": 8} in suggested
    # The catalog's own layouts come first, under their names.
    assert [item["name"] for item in result["passing_layouts"][:3]] == ["default", "ep8", "dp8_ep"]
    message = failure_message(result)
    assert message.startswith("Layout rule quantization_alignment failed for minimax_m25 TP8")
    assert "ep8 {'tensor_parallel_size': 8, 'expert_parallel_size': 8}" in message


def test_minimax_tp4_is_accepted_with_about_56_gib_of_weights_per_gpu(entry, config, seed_box):
    result = plan(entry("minimax_m25"), config("MiniMax-M2.5"), seed_box, "default")
    assert result["ok"] is True, result["checks"]
    assert result["layout"] == {"tensor_parallel_size": 4}
    memory = result["memory"]
    # 230 GB over 4 GPUs: 57.5 GB, 53.6 GiB (the seed measured about 56 GiB with vLLM's buffers).
    assert memory["weights_bytes"] == pytest.approx(230e9 / 4, rel=1e-6)
    assert 52 < memory["weights_bytes"] / GIB < 58
    # GQA: 8 KV heads / TP 4 = 2 per rank, head_dim 128, 62 layers, K and V in bf16.
    assert memory["kv_cache_bytes_per_token"] == 2 * 62 * 2 * 128 * 2
    assert memory["max_concurrency_at_max_model_len"] >= 1
    assert result["layout_warnings"] == []
    assert result["serve_args"][result["serve_args"].index("--tensor-parallel-size") + 1] == "4"
    assert "--enable-expert-parallel" not in result["serve_args"]
    assert result["serve_args"][-4:] == [
        "--tool-call-parser",
        "minimax_m2",
        "--reasoning-parser",
        "minimax_m2_append_think",
    ]


def test_minimax_expert_parallel_layouts_pass_and_split_only_the_experts(entry, config, seed_box):
    ep8 = plan(entry("minimax_m25"), config("MiniMax-M2.5"), seed_box, "ep8")
    dp8 = plan(entry("minimax_m25"), config("MiniMax-M2.5"), seed_box, "dp8_ep")
    assert ep8["ok"] and dp8["ok"]
    assert "--enable-expert-parallel" in ep8["serve_args"]
    assert dp8["serve_args"][dp8["serve_args"].index("--data-parallel-size") + 1] == "8"
    # TP 8 splits everything 8 ways; TP 1 keeps attention and embeddings whole on each GPU.
    assert ep8["memory"]["weights_bytes"] == pytest.approx(230e9 / 8, rel=1e-6)
    assert 230e9 / 8 < dp8["memory"]["weights_bytes"] < 230e9 / 8 * 1.3
    # DP 8 replicas each hold their own KV cache.
    assert dp8["memory"]["max_concurrency_at_max_model_len"] % 8 == 0


def test_data_parallel_without_expert_parallel_slices_the_experts_over_every_rank(entry, config, h200_box):
    """vLLM's MoE layers fold DP into TP: without expert parallelism each expert is sliced over TP x DP ranks, so
    TP 4 x DP 2 cuts MiniMax-M2.5's 1536 into the 192 that TP 8 does; with it, the experts stay whole."""
    minimax, shape = entry("minimax_m25"), config("MiniMax-M2.5")
    sliced = plan(minimax, shape, h200_box, {"tensor_parallel_size": 4, "data_parallel_size": 2})
    assert sliced["failed_rules"] == ["quantization_alignment"]
    assert "1536 / TP 4 x DP 2 = 192 is not a multiple of the FP8 weight block 128x128" in sliced["reason"]
    whole = plan(
        minimax, shape, h200_box, {"tensor_parallel_size": 4, "data_parallel_size": 2, "expert_parallel_size": 8}
    )
    tp8_ep8 = plan(minimax, shape, h200_box, "ep8")
    assert whole["ok"]
    # The experts take an eighth of their bytes on each GPU either way; attention and embeddings a quarter at TP 4.
    assert tp8_ep8["memory"]["weights_bytes"] < whole["memory"]["weights_bytes"] < 230e9 / 4


def test_kimi_int4_tp8_is_accepted_with_the_mla_over_pcie_warning(entry, config, seed_box):
    result = plan(entry("kimi_k25"), config("Kimi-K2.5"), seed_box, "default")
    assert result["ok"] is True, result["checks"]
    assert statuses(result)["kv_heads"] == "pass"
    assert "MLA" in next(check["detail"] for check in result["checks"] if check["rule"] == "kv_heads")
    [warning] = result["layout_warnings"]
    assert warning.startswith("MLA model with tensor parallel 8 over PCIe (SYS between GPUs 0 and 1)")
    # One latent head of kv_lora_rank 512 + rope 64 per layer, on every rank.
    assert result["memory"]["kv_cache_bytes_per_token"] == 61 * (512 + 64) * 2
    assert result["memory"]["weights_bytes"] == pytest.approx(595e9 / 8, rel=1e-6)
    assert "INT4 quantisation group 32" in next(
        check["detail"] for check in result["checks"] if check["rule"] == "quantization_alignment"
    )


def test_kimi_on_nvlink_has_no_pcie_warning(entry, config, h200_box):
    result = plan(entry("kimi_k25"), config("Kimi-K2.5"), h200_box, "default")
    assert result["ok"] is True
    assert result["layout_warnings"] == []


def test_attention_heads_not_divisible_are_rejected(entry, config, seed_box):
    result = plan(entry("kimi_k25"), config("Kimi-K2.5"), seed_box, {"tensor_parallel_size": 3})
    assert result["ok"] is False
    assert result["failed_rule"] == "attention_heads"
    assert "64 attention heads are not divisible by tensor_parallel_size 3" in result["reason"]
    assert {"tensor_parallel_size": 8} in [item["layout"] for item in result["passing_layouts"]]


def test_kv_heads_must_divide_tp_or_be_replicated_evenly(config):
    shape = model_shape(config("MiniMax-M2.5"))
    assert check_kv_heads(shape, Layout(tensor=6)) == (False, "8 KV heads are not divisible by tensor_parallel_size 6")
    assert check_kv_heads(shape, Layout(tensor=16)) == (True, "each of the 8 KV heads replicated on 2 ranks")
    assert check_kv_heads(shape, Layout(tensor=4)) == (True, "2 KV heads per rank")
    # Replicated KV heads take their full size on every rank.
    assert kv_bytes_per_token(shape, Layout(tensor=16), 2) == kv_bytes_per_token(shape, Layout(tensor=8), 2)


def test_nvfp4_needs_blackwell(entry, config, h200_box, seed_box):
    # Kimi-K2.5's own config stands in for the NVFP4 checkpoint's: the architecture is the same.
    refused = plan(entry("kimi_k25_nvfp4"), config("Kimi-K2.5"), h200_box, "default")
    assert refused["failed_rule"] == "compute_capability"
    assert "needs compute capability 10.0 or above; NVIDIA H200 has 9.0" in refused["reason"]
    assert refused["passing_layouts"] == []
    accepted = plan(entry("kimi_k25_nvfp4"), config("Kimi-K2.5"), seed_box, "default")
    assert accepted["ok"] is True
    assert accepted["memory"]["weights_bytes"] == pytest.approx(540e9 / 8, rel=1e-6)
    assert "the catalog says quantization nvfp4, config.json says int4" in accepted["layout_warnings"]


def test_full_context_that_does_not_fit_names_the_length_that_does(entry, config, seed_box, h200_box):
    kimi = entry("kimi_k25", max_model_len=262144)
    result = plan(kimi, config("Kimi-K2.5"), seed_box, "default")
    assert result["failed_rule"] == "memory"
    tokens = result["memory"]["kv_cache_tokens"]
    assert 0 < tokens < 262144
    assert f"set max_model_len to {tokens} or less" in result["reason"]
    assert plan(kimi, config("Kimi-K2.5"), h200_box, "default")["ok"] is True


def test_weights_that_do_not_fit_are_rejected(entry, config, seed_box):
    result = plan(entry("minimax_m25"), config("MiniMax-M2.5"), seed_box, {"tensor_parallel_size": 2})
    assert result["failed_rule"] == "memory"
    assert "exceed the" in result["reason"]


def test_more_gpus_than_the_host_has(entry, config, seed_box):
    seed_box["gpus"] = seed_box["gpus"][:4]
    seed_box["count"] = 4
    result = plan(entry("kimi_k25"), config("Kimi-K2.5"), seed_box, "default")
    assert result["failed_rule"] == "gpu_count"
    assert "TP8 needs 8 GPUs; this host has 4" in result["reason"]


def test_max_model_len_above_the_models_positions(entry, config, seed_box):
    result = plan(entry("minimax_m25"), config("MiniMax-M2.5"), seed_box, "default", max_model_len=300000)
    assert result["failed_rule"] == "max_model_len"
    assert "--max-model-len" in result["serve_args"]


def test_expert_parallel_needs_experts(entry, seed_box):
    dense = {"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "num_hidden_layers": 32}
    result = plan(entry("tiny"), dense, seed_box, {"tensor_parallel_size": 2, "expert_parallel_size": 2})
    assert result["failed_rule"] == "expert_parallel"
    assert "has no experts" in result["reason"]


def test_auto_takes_the_first_layout_that_passes(entry, config, seed_box):
    minimax = entry("minimax_m25", layout={"tensor_parallel_size": 8})
    result = plan(minimax, config("MiniMax-M2.5"), seed_box, "auto")
    assert result["ok"] is True
    assert result["layout_name"] == "ep8"


def test_fp8_kv_cache_halves_the_bytes_per_token(entry, config, seed_box):
    plain = plan(entry("minimax_m25"), config("MiniMax-M2.5"), seed_box, "default")
    fp8 = plan(
        entry("minimax_m25", extra_args=["--kv-cache-dtype", "fp8"]), config("MiniMax-M2.5"), seed_box, "default"
    )
    assert fp8["memory"]["kv_cache_bytes_per_token"] * 2 == plain["memory"]["kv_cache_bytes_per_token"]


def test_memory_in_use_is_a_warning(entry, config, seed_box):
    seed_box["gpus"][1]["memory_used_mib"] = 60000
    result = plan(entry("minimax_m25"), config("MiniMax-M2.5"), seed_box, "default")
    assert result["ok"] is True
    assert any("memory is in use on GPU 1 (60000 MiB)" in warning for warning in result["layout_warnings"])


def test_a_cpu_host_skips_the_gpu_rules(entry):
    result = plan(entry("tiny"), None, {"present": False, "count": 0, "gpus": []}, "default")
    assert result["ok"] is True
    assert statuses(result) == {"model": "skipped", "gpus": "skipped"}
    assert result["memory"] is None
    assert result["summary"] == "tiny TP1; not checked: model, gpus"


def test_gpu_rules_without_a_checkpoint_size_skip_memory(entry, config, seed_box):
    result = plan(entry("minimax_m25", checkpoint_size=None), config("MiniMax-M2.5"), seed_box, "default")
    assert result["ok"] is True
    assert statuses(result)["memory"] == "skipped"


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ({"present": True, "gpus": "eight"}, "gpus must be a list"),
        ({"present": True, "gpus": [{"index": 0}]}, "GPU 0 has no memory_total_mib"),
    ],
)
def test_malformed_gpu_facts_are_named(entry, config, gpus, message):
    with pytest.raises(PlanInputError, match=message):
        plan(entry("minimax_m25"), config("MiniMax-M2.5"), gpus, "default")


def test_config_without_heads_is_named(entry, seed_box):
    with pytest.raises(PlanInputError, match="num_attention_heads must be a whole number"):
        plan(entry("tiny"), {"hidden_size": 256, "num_hidden_layers": 2}, seed_box, "default")


def test_unknown_layout_name_lists_the_choices(entry, config, seed_box):
    with pytest.raises(PlanInputError, match=r"layout 'ep4' is not auto, default, a mapping, or one of \['default', "):
        plan(entry("minimax_m25"), config("MiniMax-M2.5"), seed_box, "ep4")


def test_int4_group_alignment_of_expert_shards(entry, config, seed_box):
    coarse = config("Kimi-K2.5")
    coarse["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 512
    result = plan(entry("kimi_k25"), coarse, seed_box, "default")
    assert result["failed_rule"] == "quantization_alignment"
    assert result["reason"].endswith(
        "the routed experts' intermediate shard 2048 / TP 8 = 256 is not a multiple of the INT4 quantisation group "
        "512; vLLM would fail only while loading the weights"
    )


def test_a_requirement_that_the_facts_cannot_answer_fails(entry, config, h200_box):
    for gpu in h200_box["gpus"]:
        gpu["name"] = "Prototype accelerator"
    result = plan(entry("kimi_k25_nvfp4"), config("Kimi-K2.5"), h200_box, "default")
    assert result["reason"].endswith("needs compute capability 10.0; the GPU facts lack it")


def test_the_small_fp8_moe_breaks_the_block_at_tp2_and_keeps_it_with_expert_parallelism(gpu_layout_model, h200s):
    two_h200 = h200s(2)
    entry, config = gpu_layout_model("gpu_moe_fp8")
    tp2 = plan(entry, config, two_h200, "tp2")
    assert tp2["failed_rules"] == ["quantization_alignment"]
    assert "384 / TP 2 = 192 is not a multiple of the FP8 weight block 128x128" in tp2["reason"]
    assert "tp2_ep" in [item["name"] for item in tp2["passing_layouts"]]
    tp2_ep = plan(entry, config, two_h200, "tp2_ep")
    assert tp2_ep["ok"] and "--enable-expert-parallel" in tp2_ep["serve_args"]
    detail = {check["rule"]: check["detail"] for check in tp2_ep["checks"]}
    assert detail["quantization_alignment"].startswith("intermediate shards routed experts 384 are multiples")
    assert plan(entry, config, two_h200, "default")["ok"]


def test_the_tp2_shard_as_a_whole_model_fails_the_same_rule_on_one_gpu(gpu_layout_model, h200s):
    entry, config = gpu_layout_model("gpu_moe_fp8_shard")
    result = plan(entry, config, h200s(1), "default")
    assert result["failed_rules"] == ["quantization_alignment"]
    # vLLM counts a shard of TP 1 as it counts one of TP 2: the same words for the same 192.
    assert "192 / TP 1 = 192 is not a multiple" in result["reason"]
    assert "(whole experts)" not in result["reason"]


def test_one_kv_head_is_replicated_at_tp2_and_tp3_fails_for_the_heads(gpu_layout_model, h200s):
    entry, config = gpu_layout_model("gpu_gqa")
    three = h200s(3)
    tp2 = plan(entry, config, three, "tp2")
    assert tp2["ok"]
    kv_heads = next(check["detail"] for check in tp2["checks"] if check["rule"] == "kv_heads")
    assert kv_heads == "each of the 1 KV heads replicated on 2 ranks"
    assert plan(entry, config, three, "tp3")["failed_rules"] == ["attention_heads"]


def test_a_block_quantised_router_of_8_experts_is_refused_as_vllm_failed_it(gpu_layout_model, h200s):
    """The first gpu_moe_fp8 had 8 experts: the planner passed it, and vLLM 0.26 on the H200 failed its profiling
    pass in triton_scaled_mm (`assert scale_a.shape[1] == 1 ...`, AssertionError), where the 8-wide FP8 router
    left CUTLASS. With 128 experts it served; so does a router kept unquantised, as MiniMax-M2.5 keeps it."""
    entry, config = gpu_layout_model("gpu_moe_fp8")
    eight = {**config, "num_experts": 8, "num_experts_per_tok": 2}
    refused = plan(entry, eight, h200s(1), "default")
    assert refused["failed_rules"] == ["router"]
    assert "the router's 8 outputs (one per expert) are block-quantised" in refused["reason"]
    assert "AssertionError in triton_scaled_mm" in refused["reason"]
    kept = {"modules_to_not_convert": ["gate", "lm_head"]}
    unquantised = {**eight, "quantization_config": {**config["quantization_config"], **kept}}
    assert plan(entry, unquantised, h200s(1), "default")["ok"]
    assert plan(entry, config, h200s(1), "default")["ok"]


# vLLM 0.26.0's own figures on one H200 under the unit (benchmarks/results/h200-startup.json): the model loading
# memory, the available KV cache memory and the KV cache's tokens, for the random 1.1B Llama (bf16, eager, 0.4 of
# the GPU) and for MiniMax-M2.5 cut to 16 layers (FP8, torch.compile and CUDA graphs, 0.9 of the GPU).
LLAMA_1B = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 4096,
}  # fmt: skip
MEASURED = {
    "llama_1b": {"weights_gib": 2.06, "kv_cache_gib": 53.14, "kv_cache_tokens": 1741168},
    "seed": {"weights_gib": 57.06, "kv_cache_gib": 66.62, "kv_cache_tokens": 1091504},
}


@pytest.mark.parametrize("model", ["llama_1b", "seed"])
def test_the_memory_plan_is_within_5_percent_of_what_vllm_reported_on_an_h200_and_never_above_it(
    model, entry, config, h200s
):
    if model == "llama_1b":
        planned = entry("tiny", max_model_len=4096, gpu_memory_utilization=0.4)
        shape, weights = LLAMA_1B, 2208453080  # the safetensors' size on the host
    else:
        planned = entry("minimax_m25", max_model_len=32768, max_num_seqs=256, extra_args=[])
        shape = {**config("MiniMax-M2.5"), "num_hidden_layers": 16}
        weights = 61185030144  # benchmarks/gpu_host/make_seed_model.py's bytes of the 16 layers
    memory = plan(planned, shape, h200s(1), {"tensor_parallel_size": 1}, checkpoint_bytes=weights)["memory"]
    measured = MEASURED[model]
    for planned_value, reported in [
        (memory["weights_bytes"] / GIB, measured["weights_gib"]),
        (memory["kv_cache_bytes"] / GIB, measured["kv_cache_gib"]),
        (memory["kv_cache_tokens"], measured["kv_cache_tokens"]),
    ]:
        assert abs(planned_value - reported) / reported <= 0.05, (planned_value, reported)
    # The plan may promise less KV cache than vLLM gives, never more: a layout it passes must start.
    assert memory["kv_cache_bytes"] / GIB <= measured["kv_cache_gib"]


def test_a_multi_host_entry_is_not_planned_on_one_host(entry, config, h200_box):
    group = {"hosts": "h200_pair", "data_parallel_size_local": 1}
    layout = {"tensor_parallel_size": 8, "data_parallel_size": 2, "expert_parallel_size": 16}
    pair = entry("minimax_m25", layout=layout, alternatives={}, group=group)
    with pytest.raises(
        PlanInputError, match=r"minimax_m25 is a multi-host entry \(group.hosts h200_pair\): it is planned"
    ):
        plan(pair, config("MiniMax-M2.5"), h200_box, "default")
