"""A benchmark's prompts: fixed words, and random tokens that encode back to the asked length."""

import statistics

import tokenizers

from ansible_collections.llmops.vllm.plugins.module_utils.bench.prompts import fixed_prompts, random_token_prompts
from ansible_collections.llmops.vllm.plugins.module_utils.weights.tiny_model import train_tokenizer


def test_fixed_prompts_differ_from_the_first_word_and_have_the_asked_word_count():
    prompts = fixed_prompts(3, 40)
    assert len({prompt.split()[0] for prompt in prompts}) == 3
    assert all(len(prompt.split()) == 40 for prompt in prompts)


def test_random_token_prompts_encode_back_to_the_asked_length():
    tokenizer = tokenizers.Tokenizer.from_str(train_tokenizer(300).to_str())
    prompts = random_token_prompts(tokenizer, 5, 48, seed=1)
    assert prompts == random_token_prompts(tokenizer, 5, 48, seed=1) and len(set(prompts)) == 5
    lengths = [len(tokenizer.encode(prompt, add_special_tokens=False).ids) for prompt in prompts]
    # Random byte-level tokens may merge when encoded again; vLLM's random dataset has the same slack.
    assert all(abs(length - 48) <= 2 for length in lengths), lengths


def test_random_token_prompts_leave_room_for_the_bos_that_the_server_adds():
    tokenizer = tokenizers.Tokenizer.from_str(train_tokenizer(300).to_str())
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    prompts = random_token_prompts(tokenizer, 5, 48, seed=1)
    encoded = [tokenizer.encode(prompt).ids for prompt in prompts]
    assert all(ids[0] == bos for ids in encoded)
    assert statistics.median(len(ids) for ids in encoded) == 48, [len(ids) for ids in encoded]
