# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A Grafana dashboard of the vLLM instances, from the queries of observability.queries that the alert rules read too.

One row per instance (Grafana repeats it for each value of the `instance` variable): token throughput, requests
running and waiting, KV cache use, the TTFT, ITL and end-to-end latency percentiles, whether Prometheus reaches
it, its restarts, its sleep state, finished requests and preemptions. The data source is a variable, so the same
JSON imports into any Grafana with a Prometheus that scrapes the targets of llmops.vllm.vllm_targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ansible_collections.llmops.vllm.plugins.module_utils.observability.queries import TARGETS, Queries

UID = "llmops-vllm"
TITLE = "vLLM instances (llmops.vllm)"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana's schema of the JSON model written here (Grafana 10 and 11 read it).
SCHEMA_VERSION = 39
PERCENTILES = (0.5, 0.9, 0.99)
WIDTH = 24


@dataclass
class Panel:
    title: str
    # Grafana's panel type: timeseries or stat.
    kind: str
    unit: str
    # (legend, PromQL expression) for each series.
    targets: list[tuple[str, str]]
    width: int = 8
    height: int = 8
    description: str = ""
    # Value mappings of a stat panel: value -> text.
    mappings: dict[str, str] = field(default_factory=dict)


def _percentiles(queries: Queries, latency: str) -> list[tuple[str, str]]:
    return [
        (f"p{quantile * 100:g} {{{{host}}}}", queries.latency_quantile(latency, quantile)) for quantile in PERCENTILES
    ]


def instance_panels(queries: Queries) -> list[Panel]:
    """The panels of one instance's row, left to right and top to bottom."""
    return [
        Panel(
            "Token throughput",
            "timeseries",
            "short",
            [
                ("generated tok/s {{host}}", queries.generation_tokens_per_second()),
                ("prompt tok/s {{host}}", queries.prompt_tokens_per_second()),
            ],
            description="Tokens per second that the engine generated, and prompt tokens it processed.",
        ),
        Panel(
            "Requests in the engine",
            "timeseries",
            "short",
            [("running {{host}}", queries.requests_running()), ("waiting {{host}}", queries.requests_waiting())],
            description="Requests in the running batch, and requests queued for it.",
        ),
        Panel(
            "KV cache use",
            "timeseries",
            "percentunit",
            [("KV cache {{host}}", queries.kv_cache_usage())],
            description="The fraction of the KV cache in use (the fullest engine's).",
        ),
        Panel("Time to first token", "timeseries", "s", _percentiles(queries, "ttft")),
        Panel("Inter-token latency", "timeseries", "s", _percentiles(queries, "itl")),
        Panel("End-to-end request latency", "timeseries", "s", _percentiles(queries, "e2el")),
        Panel(
            "Scraped",
            "stat",
            "none",
            [("{{host}}", queries.up())],
            width=4,
            description="Whether Prometheus reads the instance's /metrics.",
            mappings={"0": "down", "1": "up"},
        ),
        Panel(
            "Restarts",
            "stat",
            "none",
            [("{{host}}", queries.restarts("$__range"))],
            width=4,
            description="How often the server started anew within the dashboard's time range.",
        ),
        Panel(
            "Sleep state",
            "stat",
            "none",
            [("{{host}}", queries.asleep())],
            width=4,
            description="vLLM's sleep mode: asleep while a sleep swap keeps the instance for a fast rollback.",
            mappings={"0": "awake", "1": "asleep"},
        ),
        Panel(
            "Finished requests",
            "timeseries",
            "reqps",
            [("{{finished_reason}} {{host}}", queries.requests_finished_per_second())],
            width=6,
            description="Requests per second that finished, by why: stop, length, abort.",
        ),
        Panel(
            "Preemptions",
            "timeseries",
            "short",
            [("preempted/s {{host}}", queries.preemptions_per_second())],
            width=6,
            description="Requests per second that the engine preempted for want of KV cache.",
        ),
    ]


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict:
    targets = [
        {"refId": chr(ord("A") + index), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
        for index, (legend, expr) in enumerate(panel.targets)
    ]
    defaults = {"unit": panel.unit}
    if panel.mappings:
        defaults["mappings"] = [
            {"type": "value", "options": {value: {"text": text} for value, text in panel.mappings.items()}}
        ]
    if panel.unit == "percentunit":
        defaults.update(min=0, max=1)
    options = (
        {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}, "tooltip": {"mode": "multi"}}
        if panel.kind == "timeseries"
        else {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "value"}
    )
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": targets,
    }


def _variable(name: str, label: str, query: str) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "current": {"text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def dashboard() -> dict:
    """The dashboard's JSON model, as Grafana imports it."""
    queries = Queries(f'{TARGETS}, host=~"$host", vllm_instance=~"$instance"', window="$__rate_interval")
    panels = [
        {
            "id": 1,
            "type": "row",
            "title": "$instance",
            "repeat": "instance",
            "collapsed": False,
            "gridPos": {"h": 1, "w": WIDTH, "x": 0, "y": 0},
            "panels": [],
        }
    ]
    x, y, row_height = 0, 1, 0
    for panel in instance_panels(queries):
        if x + panel.width > WIDTH:
            x, y, row_height = 0, y + row_height, 0
        panels.append(_panel_json(panel, len(panels) + 1, x, y))
        x, row_height = x + panel.width, max(row_height, panel.height)
    return {
        "uid": UID,
        "title": TITLE,
        "description": "The vLLM instances that llmops.vllm deploys, one row each; generated by the collection.",
        "tags": ["vllm", "llmops.vllm"],
        "editable": True,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "templating": {
            "list": [
                {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
                _variable("host", "Host", f"label_values(up{{{TARGETS}}}, host)"),
                _variable("instance", "Instance", f'label_values(up{{{TARGETS}, host=~"$host"}}, vllm_instance)'),
            ]
        },
        "panels": panels,
        "annotations": {"list": []},
    }
