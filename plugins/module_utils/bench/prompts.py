# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A benchmark's prompts: fixed words, or random tokens of the vocabulary as `vllm bench serve` builds them."""

from __future__ import annotations

import random

FIXED_PROMPT = (
    "The quick brown fox jumps over the lazy dog while the inference server streams tokens back to its clients"
)


def fixed_prompts(count: int, input_len: int, first: int = 0) -> list:
    """Prompts of about `input_len` words (about a token each), numbered from `first`: distinct from the first
    word on so that prefix caching does not make them cheaper than real traffic."""
    sentence = FIXED_PROMPT.split()
    words = (sentence * (input_len // len(sentence) + 1))[: max(input_len - 1, 0)]
    return [" ".join([f"{index}:", *words]) for index in range(first, first + count)]


def added_special_tokens(tokenizer) -> int:
    """How many special tokens (a BOS, typically) the tokenizer adds to every prompt when the server encodes it."""
    processor = tokenizer.post_processor
    return processor.num_special_tokens_to_add(False) if processor is not None else 0


def random_token_prompts(tokenizer, count: int, input_len: int, seed: int) -> list:
    """Prompts that the server encodes to `input_len` tokens, built as `vllm bench serve --dataset-name random`
    builds them: from a random offset, consecutive tokens of the model's vocabulary (special tokens left
    out), as text that encodes back to their number, plus the special tokens that the tokenizer adds.

    The workload is vLLM's, not only its length: at the same token count, prompts of random single tokens
    (bytes that decode to broken UTF-8) took 12-61 % longer to prefill than these on the tiny model's server
    (vllm:request_prefill_time_seconds, C=8, three rounds).
    """
    special = set(tokenizer.get_added_tokens_decoder())
    vocabulary = [token_id for token_id in range(tokenizer.get_vocab_size()) if token_id not in special]
    length = max(input_len - added_special_tokens(tokenizer), 1)
    rng = random.Random(seed)
    prompts = []
    for index in range(count):
        offset = rng.randrange(len(vocabulary))
        ids = [vocabulary[(offset + index + position) % len(vocabulary)] for position in range(length)]
        text = tokenizer.decode(ids)
        # Decoding and encoding again may merge or split tokens: trim, or pad with random tokens, until the
        # length holds.
        for _attempt in range(10):
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            if len(ids) == length:
                break
            ids = ids[:length] + [rng.choice(vocabulary) for _position in range(length - len(ids))]
            text = tokenizer.decode(ids)
        prompts.append(text)
    return prompts
