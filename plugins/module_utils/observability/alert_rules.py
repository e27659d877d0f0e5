# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus alert rules for vLLM instances, from the queries of observability.queries and settings that say how long.

The failures that operators fear first: an instance down, an instance that restarted (vLLM exits 0 when its engine
dies, and systemd starts it again: the clients saw errors), an engine that hangs while /health still answers 200
(vLLM issue 39863), a KV cache near full, a queue that keeps growing, a latency above the SLO that a catalog entry
sets (`slo: {p99_ttft_ms: 500}`), a router in front of the instances that has no healthy worker left, and in a
multi-host group a rank that does not compute and a member that its guard restarted, each named with the host that
failed. Every duration and threshold is a setting, so that a test waits seconds.
"""

from __future__ import annotations

import copy
import re

from ansible_collections.llmops.vllm.plugins.module_utils.observability.queries import (
    LATENCY_HISTOGRAMS,
    LATENCY_TITLES,
    TARGETS,
    Queries,
)

# A Prometheus duration: 90s, 5m, 1h30m.
DURATION = re.compile(r"(?:[0-9]+(?:ms|s|m|h|d|w|y))+\Z")
# A catalog entry's SLO key: the quantile and the latency, in milliseconds, as vllm_bench names its results.
SLO_KEY = re.compile(r"p([0-9]{1,2}(?:\.[0-9]+)?)_(" + "|".join(LATENCY_HISTOGRAMS) + r")_ms\Z")
GROUP = "llmops-vllm"
SLO_GROUP = "llmops-vllm-slo"
ROUTER_GROUP = "llmops-vllm-router"
GROUP_GUARD_GROUP = "llmops-vllm-group"
# The Prometheus job of the group guards' metrics (roles/vllm_server/files/llmops_vllm_group_guard.py).
GROUP_GUARD_JOB = "vllm-group-guard"
# The Prometheus job of the routers' metrics (the vllm_prometheus role's, fed by the vllm_targets role).
ROUTER_JOB = "vllm-router"

# Each alert's settings and their defaults: `for` (how long the condition holds before it fires), `window`
# (how far back it looks), and thresholds.
DEFAULTS = {
    "instance_down": {"for": "1m"},
    "instance_restarted": {"window": "15m"},
    "engine_hung": {"window": "5m", "for": "1m"},
    "kv_cache_full": {"threshold": 0.9, "for": "10m"},
    "queue_growing": {"window": "10m", "min_waiting": 10, "for": "5m"},
    "latency_slo": {"window": "5m", "for": "5m"},
    "router_no_healthy_worker": {"for": "1m"},
    "group_rank_failing": {"for": "1m"},
    "group_member_restarted": {"window": "15m"},
}
# Thresholds: (lowest, highest) allowed.
THRESHOLDS = {"threshold": (0, 1), "min_waiting": (0, float("inf"))}

# Prometheus' templates in the annotations: the alert's labels and its value.
INSTANCE = "{{ $labels.vllm_instance }} on {{ $labels.host }}"
ROUTER = "The router on {{ $labels.host }}"
MODEL = "{{ $labels.model }}"
VALUE = "{{ $value }}"


class AlertSettingsError(ValueError):
    """Alert settings or an SLO that cannot make a rule; the message names the key."""


def check_settings(settings: dict | None) -> dict:
    """The defaults with `settings` (alert: {key: value}) over them; AlertSettingsError names a bad one."""
    if settings is None:
        settings = {}
    if not isinstance(settings, dict):
        raise AlertSettingsError(f"alert settings must map an alert to its settings, got {settings!r}")
    merged = copy.deepcopy(DEFAULTS)
    for alert, values in settings.items():
        if alert not in DEFAULTS:
            raise AlertSettingsError(f"unknown alert {alert!r}; the alerts are {', '.join(DEFAULTS)}")
        if not isinstance(values, dict):
            raise AlertSettingsError(f"the settings of {alert} must be a mapping, got {values!r}")
        for key, value in values.items():
            if key not in DEFAULTS[alert]:
                raise AlertSettingsError(f"{alert} has no setting {key!r}; it has {', '.join(DEFAULTS[alert])}")
            merged[alert][key] = _checked(alert, key, value)
    return merged


def _checked(alert: str, key: str, value):
    if key in THRESHOLDS:
        low, high = THRESHOLDS[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            upper = "" if high == float("inf") else f" and at most {high}"
            raise AlertSettingsError(f"{alert}.{key} must be a number of at least {low}{upper}, got {value!r}")
        return value
    if not isinstance(value, str) or not DURATION.match(value):
        raise AlertSettingsError(f"{alert}.{key} must be a Prometheus duration such as 30s or 5m, got {value!r}")
    return value


def check_slo(slo) -> dict:
    """A catalog entry's SLO, {pNN_LATENCY_ms: milliseconds}; ValueError says what is wrong."""
    if not isinstance(slo, dict):
        raise ValueError(f"must map a latency such as p99_ttft_ms to milliseconds, got {slo!r}")
    for key, value in slo.items():
        match = SLO_KEY.match(str(key))
        if not match or not 0 < float(match.group(1)) < 100:
            raise ValueError(
                f"has an unknown key {key!r}; keys are pNN_LATENCY_ms with NN a percentile (50, 99, 99.9) and "
                f"LATENCY one of {', '.join(LATENCY_HISTOGRAMS)}, such as p99_ttft_ms"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{key} must be a number of milliseconds above 0, got {value!r}")
    return dict(slo)


def _indent(expr: str) -> str:
    return "\n".join("  " + line for line in expr.splitlines())


def _rule(name: str, expr: str, hold: str, severity: str, summary: str, description: str, **labels) -> dict:
    rule = {"alert": name, "expr": expr}
    if hold not in ("0s", "0m"):
        rule["for"] = hold
    rule["labels"] = {"severity": severity, **labels}
    rule["annotations"] = {"summary": summary, "description": description}
    return rule


def instance_rules(settings: dict) -> list[dict]:
    """The rules that every instance gets."""
    queries = Queries()
    down, restarted, hung = settings["instance_down"], settings["instance_restarted"], settings["engine_hung"]
    kv_cache, queue = settings["kv_cache_full"], settings["queue_growing"]
    return [
        _rule(
            "VllmInstanceDown",
            f"{queries.up()} == 0",
            down["for"],
            "critical",
            f"vLLM instance {INSTANCE} is down",
            f"Prometheus has not read the /metrics of {INSTANCE} ({MODEL}) for {down['for']}: the server is not "
            "running, is loading, or is out of reach. playbooks/status.yml shows its unit and how its engine died.",
        ),
        _rule(
            "VllmInstanceRestarted",
            f"{queries.restarts(restarted['window'])} > 0",
            "0s",
            "warning",
            f"vLLM instance {INSTANCE} restarted",
            f"The server of {INSTANCE} ({MODEL}) started anew {VALUE} time(s) within {restarted['window']}: vLLM exits "
            "when its engine dies and systemd starts it again, and the requests in flight failed. playbooks/status.yml "
            "says how the engine died.",
        ),
        _rule(
            "VllmEngineHung",
            f"(\n{_indent(queries.requests_in_engine())}\n) > 0\n"
            f"and (\n{_indent(queries.tokens_processed(hung['window']))}\n) == 0",
            hung["for"],
            "critical",
            f"The vLLM engine of {INSTANCE} makes no progress",
            f"{VALUE} requests are in the engine of {INSTANCE} ({MODEL}) and it has processed no token for "
            f"{hung['window']}, while /health may still answer 200 (vLLM issue 39863). Restart the instance.",
        ),
        _rule(
            "VllmKvCacheNearlyFull",
            f"{queries.kv_cache_usage()} > {kv_cache['threshold']:g}",
            kv_cache["for"],
            "warning",
            f"The KV cache of {INSTANCE} is {{{{ $value | humanizePercentage }}}} full",
            f"The KV cache of {INSTANCE} ({MODEL}) has been above {kv_cache['threshold']:.0%} for {kv_cache['for']}: "
            "new requests wait and running ones are preempted. Give the model more GPUs, or a smaller max_model_len or "
            "max_num_seqs.",
        ),
        _rule(
            "VllmQueueGrowing",
            f"({queries.requests_waiting()}) >= {queue['min_waiting']:g}"
            f"\nand ({queries.waiting_growth(queue['window'])}) > 0",
            queue["for"],
            "warning",
            f"The queue of {INSTANCE} keeps growing",
            f"{VALUE} requests wait in the queue of {INSTANCE} ({MODEL}), which has grown over the last "
            f"{queue['window']}: requests arrive faster than the instance serves them. Add instances, or tune the "
            "model (playbooks/tune.yml).",
        ),
    ]


def router_rules(settings: dict) -> list[dict]:
    """The rules of the routers in front of the instances (the job vllm-router, one target per router host)."""
    hold = settings["router_no_healthy_worker"]["for"]
    health = f'vllm_router_worker_health{{job="{ROUTER_JOB}"}}'
    return [
        _rule(
            "VllmRouterNoHealthyWorker",
            # Every worker it knows unhealthy, or it knows none: a router that is up and has no worker to send to.
            f"sum by (host) ({health}) < 1\n"
            f'or (max by (host) (up{{job="{ROUTER_JOB}"}}) == 1 unless on (host) count by (host) ({health}))',
            hold,
            "critical",
            f"{ROUTER} has no healthy worker",
            f"{ROUTER} has had no healthy worker for {hold}: every request it takes fails. The instances behind it are "
            "down, loading, or out of its reach; playbooks/status.yml shows the router, its workers and their health.",
        ),
    ]


def group_rules(settings: dict) -> list[dict]:
    """The rules of multi-host groups, from their members' guards (the job vllm-group-guard): each names the host
    whose member failed."""
    failing, restarted = settings["group_rank_failing"], settings["group_member_restarted"]
    ranks = f'llmops_vllm_group_rank_computes{{job="{GROUP_GUARD_JOB}"}}'
    restarts = f'llmops_vllm_group_restarts_total{{job="{GROUP_GUARD_JOB}"}}'
    return [
        _rule(
            "VllmGroupRankFailing",
            f"{ranks} == 0",
            failing["for"],
            "critical",
            "Rank {{ $labels.rank }} of the group {{ $labels.vllm_instance }} fails on {{ $labels.rank_host }}",
            "Data parallel rank {{ $labels.rank }} of the multi-host group {{ $labels.vllm_instance }} ("
            + MODEL
            + "), on {{ $labels.rank_host }}, has answered no one-token completion of the head's guard for "
            f"{failing['for']}: the requests handed to it wait or fail. The guard restarts the head after its failed "
            "checks; journalctl -u llmops-vllm-guard-{{ $labels.vllm_instance }} on {{ $labels.host }} says why.",
        ),
        _rule(
            "VllmGroupMemberRestarted",
            f"increase({restarts}[{restarted['window']}]) > 0",
            "0s",
            "warning",
            "The group {{ $labels.vllm_instance }} restarted: its member on {{ $labels.failed_host }} failed",
            "Within "
            + restarted["window"]
            + ", the guard of the multi-host group member {{ $labels.vllm_instance }} on {{ $labels.host }} (the "
            "{{ $labels.role }}) restarted it because the group's member on {{ $labels.failed_host }} stopped "
            "serving: the group's requests in flight failed. journalctl -u llmops-vllm-guard-{{ $labels.vllm_instance "
            "}} on {{ $labels.host }} names the rank and the error.",
        ),
    ]


def slo_rules(slos: dict, settings: dict) -> list[dict]:
    """A rule for each latency SLO of each catalog entry (model name: its `slo`), the models sorted by name."""
    latency = settings["latency_slo"]
    rules = []
    for model in sorted(slos):
        try:
            slo = check_slo(slos[model])
        except ValueError as error:
            raise AlertSettingsError(f"the slo of catalog entry {model} {error}") from None
        queries = Queries(f'{TARGETS}, model="{model}"')
        for key in sorted(slo):
            match = SLO_KEY.match(key)
            percentile, histogram = match.group(1), match.group(2)
            quantile = float(percentile) / 100
            rules.append(
                _rule(
                    "VllmLatencyAboveSlo",
                    f"{queries.latency_quantile(histogram, quantile, latency['window'])} > {slo[key] / 1000:g}",
                    latency["for"],
                    "warning",
                    f"The p{percentile} {LATENCY_TITLES[histogram]} of {INSTANCE} is above its SLO",
                    f"Over the last {latency['window']}, the p{percentile} {LATENCY_TITLES[histogram]} of {INSTANCE} "
                    f"was {{{{ $value | humanizeDuration }}}}, above the {slo[key]:g} ms that catalog entry {model} "
                    f"sets ({key}), for {latency['for']}.",
                    slo=key,
                )
            )
    return rules


def alert_rules(settings: dict | None = None, slos: dict | None = None) -> dict:
    """The rules file: one group for every instance, one for the routers, one for multi-host groups, one for the
    catalog's SLOs when any entry sets one."""
    checked = check_settings(settings)
    groups = [
        {"name": GROUP, "rules": instance_rules(checked)},
        {"name": ROUTER_GROUP, "rules": router_rules(checked)},
        {"name": GROUP_GUARD_GROUP, "rules": group_rules(checked)},
    ]
    latency = slo_rules(slos or {}, checked)
    if latency:
        groups.append({"name": SLO_GROUP, "rules": latency})
    return {"groups": groups}
