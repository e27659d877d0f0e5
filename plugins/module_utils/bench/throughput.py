# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tokens per second of vLLM servers without Prometheus: their token counters read twice, some seconds apart."""

from __future__ import annotations

import math
import time

from ansible_collections.llmops.vllm.plugins.module_utils.observability.queries import GENERATION_TOKENS, PROMPT_TOKENS
from ansible_collections.llmops.vllm.plugins.module_utils.service.vllm_api import get, metric_total

# Each rate and the counter it comes from.
COUNTERS = {"generation_tokens_per_second": GENERATION_TOKENS, "prompt_tokens_per_second": PROMPT_TOKENS}


def counters(metrics_text: str) -> dict:
    """The token counters, summed over the engines; None for one that is absent or not a number."""
    values = {}
    for rate, name in COUNTERS.items():
        try:
            total = metric_total(metrics_text, name)
        except ValueError:
            total = None
        values[rate] = total if total is not None and math.isfinite(total) else None
    return values


def rates(first: dict, second: dict, seconds: float) -> dict:
    """Per second between two reads of the counters; None where a read lacks one or it went back (a restart)."""
    found = {}
    for rate in COUNTERS:
        before, after = first.get(rate), second.get(rate)
        usable = before is not None and after is not None and after >= before and seconds > 0
        found[rate] = round((after - before) / seconds, 1) if usable else None
    return found


def read_counters(url: str, timeout: float) -> tuple[dict | None, float]:
    """The counters at the server's /metrics, None when it did not answer 200, and when they were read."""
    reply = get(url, "/metrics", timeout=timeout)
    return (counters(reply.body) if reply.status == 200 else None), time.monotonic()


def measure(urls: dict, seconds: float, timeout: float, read=read_counters, sleep=time.sleep) -> dict:
    """Each server's rates (name: URL), from reads `seconds` apart; all None for one that did not answer twice."""
    first = {name: read(url, timeout) for name, url in urls.items()}
    sleep(seconds)
    measured = {}
    for name, url in urls.items():
        before, before_at = first[name]
        after, after_at = read(url, timeout)
        if before is None or after is None:
            measured[name] = dict.fromkeys(COUNTERS)
        else:
            measured[name] = rates(before, after, after_at - before_at)
        measured[name]["seconds"] = round(after_at - before_at, 2)
    return measured


def with_throughput(rows: list[dict], instances: list[dict]) -> list[dict]:
    """Status rows (one per instance of a host) with its rates as `gen_tok_s` and `prompt_tok_s`.

    `instances`: what llmops.vllm.vllm_throughput_info returns for the host; None for an instance it lacks.
    """
    measured = {item["instance"]: item for item in instances or []}
    return [
        {
            **row,
            "gen_tok_s": measured.get(row["instance"], {}).get("generation_tokens_per_second"),
            "prompt_tok_s": measured.get(row["instance"], {}).get("prompt_tokens_per_second"),
        }
        for row in rows
    ]
