# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The winner of a tune: each candidate's figures from its vllm_bench levels, its score against the objective
(a concurrency, or the best throughput within an SLO), and the Pareto front of throughput against TTFT."""

from __future__ import annotations

import numbers

from ansible_collections.llmops.vllm.plugins.module_utils.tune.candidates import TuneError, is_whole

# The figures of a level that the report keeps, as vllm_bench names them.
LEVEL_FIELDS = (
    "max_concurrency", "completed", "failed", "duration", "output_throughput", "request_throughput",
    "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_e2el_ms",
)  # fmt: skip


def level_figures(levels):
    """The figures of each vllm_bench level that the report keeps."""
    return [{field: level.get(field) for field in LEVEL_FIELDS if field in level} for level in levels or []]


def check_objective(concurrency, slo, levels):
    """Refuse an objective that cannot be scored: a level not benchmarked, an SLO on no latency."""
    if not isinstance(levels, list) or not levels or not all(is_whole(level) for level in levels):
        raise TuneError(f"the concurrency levels must be a non-empty list of whole numbers, got {levels!r}")
    if concurrency and slo:
        raise TuneError("choose an objective: a concurrency (throughput there) or an SLO (the highest level it meets)")
    if concurrency and concurrency not in levels:
        raise TuneError(f"the objective's concurrency {concurrency} is not one of the levels benchmarked, {levels}")
    if not isinstance(slo, dict):
        raise TuneError(f"the SLO must map latency fields (median_ttft_ms, p99_itl_ms, ...) to ms, got {slo!r}")
    for metric, limit in slo.items():
        if not metric.endswith("_ms") or metric not in LEVEL_FIELDS:
            known = [field for field in LEVEL_FIELDS if field.endswith("_ms")]
            raise TuneError(f"the SLO's {metric!r} is not a latency the tune keeps; one of {known}")
        if isinstance(limit, bool) or not isinstance(limit, numbers.Real) or limit <= 0:
            raise TuneError(f"the SLO's {metric} must be a number of ms above 0, got {limit!r}")


def score(levels, concurrency=0, slo=None):
    """(level, output tok/s, why) of one candidate's levels under the objective; level None when none counts."""
    by_level = {level["max_concurrency"]: level for level in levels}
    if slo:
        meeting = [
            level for level in levels if all(level.get(metric, float("inf")) <= limit for metric, limit in slo.items())
        ]
        if not meeting:
            return None, 0.0, "no level meets the SLO"
        best = max(meeting, key=lambda level: level["max_concurrency"])
        return best["max_concurrency"], best["output_throughput"], f"meets the SLO up to C={best['max_concurrency']}"
    chosen = concurrency or max(by_level)
    if chosen not in by_level:
        return None, 0.0, f"C={chosen} was not measured"
    return chosen, by_level[chosen]["output_throughput"], f"at C={chosen}"


def slo_text(slo):
    return " and ".join(f"{metric} <= {limit:g}" for metric, limit in slo.items())


def winner(candidates, concurrency=0, slo=None):
    """The measured candidate with the highest output throughput under the objective, and why; None when none."""
    scored = []
    for candidate in candidates:
        if candidate.get("verdict") != "measured":
            continue
        level, throughput, why = score(candidate["levels"], concurrency, slo)
        if level is not None:
            ttft = next(item["median_ttft_ms"] for item in candidate["levels"] if item["max_concurrency"] == level)
            scored.append((throughput, -ttft, candidate, level, why))
    if not scored:
        objective = f"the SLO {slo_text(slo)}" if slo else "the objective"
        return {"name": None, "key": None, "reason": f"no candidate was measured that meets {objective}"}
    scored.sort(key=lambda item: item[:2], reverse=True)
    throughput, best, level, why = scored[0][0], *scored[0][2:]
    runner_up = ""
    if len(scored) > 1:
        second = scored[1]
        runner_up = f"; next {second[2]['name']} with {second[0]:.0f} tok/s ({second[4]})"
    objective = f"under the SLO {slo_text(slo)}" if slo else "the highest output throughput"
    reason = f"{best['name']}: {throughput:.0f} output tok/s {why}, {objective}{runner_up}"
    return {"name": best["name"], "key": best["key"], "level": level, "output_throughput": throughput, "reason": reason}


def pareto_front(points):
    """The points (ttft_ms, tok_s, ...) that no other point beats on both: lower TTFT and higher throughput."""
    front = []
    for point in sorted(points, key=lambda item: (item[0], -item[1])):
        if not front or point[1] > front[-1][1]:
            front.append(point)
    return front
