"""A model's shape from the real config.json of MiniMax-M2.5 and Kimi-K2.5: the parts and what is quantised."""

from ansible_collections.llmops.vllm.plugins.module_utils.plan.model_shape import model_shape


def test_ignore_lists_decide_which_parts_are_quantized(config):
    kimi = model_shape(config("Kimi-K2.5"))
    assert kimi.intermediate_sizes == {"routed experts": 2048, "shared experts": 2048, "dense MLP": 18432}
    # Kimi's ignore list keeps attention, shared experts and the dense first layer in BF16.
    assert kimi.quantized_parts == {"routed experts"}
    assert (kimi.quantization, kimi.quantization_unit[0], kimi.mla_latent_dim) == ("int4", 32, 576)
    minimax = model_shape(config("MiniMax-M2.5"))
    # "gate" in modules_to_not_convert is the router, not the experts' gate_proj.
    assert (minimax.intermediate_sizes, minimax.quantized_parts) == ({"routed experts": 1536}, {"routed experts"})
    assert minimax.expert_byte_fraction > 0.95
