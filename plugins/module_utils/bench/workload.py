# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One measured level of a benchmark: its prompts, its run through the load generator, its metrics.

Shared by the modules that measure a server (vllm_bench over concurrency levels, vllm_gate over rounds), so that
both send the same workload and name what they measure alike.
"""

from __future__ import annotations

import json
import os

from ansible_collections.llmops.vllm.plugins.module_utils.bench.error import BenchError
from ansible_collections.llmops.vllm.plugins.module_utils.bench.load_generator import run_level
from ansible_collections.llmops.vllm.plugins.module_utils.bench.prompts import fixed_prompts, random_token_prompts
from ansible_collections.llmops.vllm.plugins.module_utils.bench.statistics import level_metrics

try:
    import tokenizers
except ImportError:
    tokenizers = None


def load_tokenizer(path):
    """The tokenizer of `path` (a model directory or tokenizer.json), or None when it cannot be used here."""
    if not path or tokenizers is None:
        return None
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    return tokenizers.Tokenizer.from_file(file) if os.path.isfile(file) else None


def prompts_for(tokenizer, count, input_len, seed):
    """(prompt, expected prompt tokens) pairs: random tokens of the model's vocabulary with a tokenizer, else the
    fixed text, numbered from seed x count so that another seed never repeats a prompt (nor its cached prefix)."""
    if tokenizer is None:
        return [(prompt, 0) for prompt in fixed_prompts(count, input_len, first=seed * count)]
    return [(prompt, input_len) for prompt in random_token_prompts(tokenizer, count, input_len, seed)]


def measure_level(target, prompts, concurrency, timeout, duration=None, percentiles=(50, 90, 99), slos=None):
    """Send `prompts` at `concurrency` (for `duration` seconds when given) and return the level's metrics, with
    the client's own CPU seconds."""
    results, elapsed, cpu_seconds = run_level(target, prompts, concurrency, timeout, duration)
    metrics = level_metrics(results, elapsed, list(percentiles), slos)
    output_tokens = metrics["total_output_tokens"]
    return {
        "max_concurrency": concurrency,
        "num_requests": len(results),
        **metrics,
        "client_cpu_seconds": cpu_seconds,
        "client_cpu_seconds_per_1k_output_tokens": cpu_seconds / output_tokens * 1000 if output_tokens else None,
    }


def read_saved(saved, what: str) -> dict:
    """A saved result given as its contents (a dict) or as the path of its JSON file; BenchError naming `what`."""
    if isinstance(saved, str):
        try:
            with open(saved, encoding="utf-8") as handle:
                saved = json.load(handle)
        except (OSError, ValueError) as error:
            raise BenchError(f"cannot read the {what} {saved}: {error}") from error
    if not isinstance(saved, dict):
        raise BenchError(f"the {what} must be a saved result (a dict, or the path of its JSON file), got {saved!r}")
    return saved
