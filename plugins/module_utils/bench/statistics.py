# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The statistics of a benchmark level under `vllm bench serve`'s field names, and their comparison with a baseline.

`level_metrics` aggregates the requests of one concurrency level with numpy's conventions (population std,
linear percentiles, 0 for an empty list). Standard library only.
"""

from __future__ import annotations

import math

from ansible_collections.llmops.vllm.plugins.module_utils.bench.error import BenchError
from ansible_collections.llmops.vllm.plugins.module_utils.bench.streamed_response import RequestResult

# How many failed requests' error texts a level keeps: enough to see the pattern, small enough for a report.
KEPT_ERRORS = 5


def percentile(values: list, p: float) -> float:
    """numpy.percentile(values, p) with its default linear interpolation."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * p / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def describe(values: list, percentiles: list) -> dict:
    """Mean, median, population std and percentiles, as numpy computes them; an empty list counts as [0]."""
    values = values or [0.0]
    mean = math.fsum(values) / len(values)
    stats = {
        "mean": mean,
        "median": percentile(values, 50),
        "std": math.sqrt(math.fsum((value - mean) ** 2 for value in values) / len(values)),
    }
    for p in percentiles:
        stats[percentile_name(p)] = percentile(values, p)
    return stats


def percentile_name(p: float) -> str:
    """`p99`, `p99.9`: vLLM's names."""
    return f"p{int(p)}" if int(p) == p else f"p{p}"


def level_metrics(results: list, duration: float, percentiles: list, slos: dict | None = None) -> dict:
    """The metrics of one level, named as `vllm bench serve` names them (times in ms)."""
    good = [r for r in results if r.success]
    failed = [r for r in results if not r.success]
    output = sum(r.output_tokens or 1 for r in good)
    total_input = sum(r.prompt_tokens for r in good)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in good if r.output_tokens > 1]
    samples = {
        "ttft": [r.ttft for r in good],
        "tpot": tpots,
        "itl": [gap for r in good for gap in r.itl],
        "e2el": [r.latency for r in good],
    }
    metrics = {
        "duration": duration,
        "completed": len(good),
        "failed": len(failed),
        "errors": [r.error for r in failed[:KEPT_ERRORS]],
        "total_input_tokens": total_input,
        "total_output_tokens": output,
        "request_throughput": len(good) / duration,
        "request_goodput": None,
        "output_throughput": output / duration,
        "total_token_throughput": (total_input + output) / duration,
    }
    if slos:
        metrics["request_goodput"] = sum(1 for r in good if meets_slos(r, slos)) / duration
    for name, values in samples.items():
        for stat, value in describe(values, percentiles).items():
            metrics[f"{stat}_{name}_ms"] = value * 1000
    return metrics


def meets_slos(result: RequestResult, slos: dict) -> bool:
    """vLLM's goodput rule: every given SLO (ms) met; a one-token request has a TPOT of 0."""
    tpot = (result.latency - result.ttft) / (result.output_tokens - 1) if result.output_tokens > 1 else 0.0
    measured = {"ttft": result.ttft, "tpot": tpot, "e2el": result.latency}
    return all(measured[name] * 1000 <= limit for name, limit in slos.items())


def is_higher_better(metric: str) -> bool:
    """Throughputs and goodput grow when things get better; latencies shrink."""
    return metric.endswith(("_throughput", "_goodput"))


def regressions(levels: list, baseline_levels: list, metrics: list, max_percent: float) -> tuple[list, list]:
    """Compare each level with the baseline level of the same concurrency.

    Returns (comparisons, regressions): one dict per (concurrency, metric) found in both, and those worse than
    `max_percent`.
    """
    baseline_by_concurrency = {level["max_concurrency"]: level for level in baseline_levels}
    comparisons = []
    for level in levels:
        base = baseline_by_concurrency.get(level["max_concurrency"])
        if base is None:
            continue
        for metric in metrics:
            if base.get(metric) is None or level.get(metric) is None:
                raise BenchError(f"metric {metric} is missing from the result or from the baseline")
            before, now = float(base[metric]), float(level[metric])
            change = (now - before) / before * 100 if before else 0.0
            worse = -change if is_higher_better(metric) else change
            comparisons.append(
                {
                    "max_concurrency": level["max_concurrency"],
                    "metric": metric,
                    "baseline": before,
                    "current": now,
                    "change_percent": change,
                    "regressed": worse > max_percent,
                }
            )
    if not comparisons:
        raise BenchError(
            f"the baseline has none of the levels {[level['max_concurrency'] for level in levels]}"
            f" (it has {sorted(baseline_by_concurrency)})"
        )
    return comparisons, [c for c in comparisons if c["regressed"]]


def describe_regression(item: dict, max_percent: float) -> str:
    return (
        f"C={item['max_concurrency']} {item['metric']}: {item['current']:.2f} against the baseline's "
        f"{item['baseline']:.2f} ({item['change_percent']:+.1f}%, allowed {max_percent:g}% worse)"
    )
