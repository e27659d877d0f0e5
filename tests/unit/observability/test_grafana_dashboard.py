"""The Grafana dashboard: one row per instance, each query valid PromQL (promtool parses it), the same queries as
the alert rules where both show one thing. That every metric it reads exists on a real vLLM's /metrics is shown
in tests/integration/test_observability.py."""

from __future__ import annotations

import re
import subprocess

import yaml

from ansible_collections.llmops.vllm.plugins.module_utils.observability.alert_rules import alert_rules
from ansible_collections.llmops.vllm.plugins.module_utils.observability.grafana_dashboard import WIDTH, dashboard

# What Grafana puts in place of its variables before Prometheus sees a query.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$host": ".*", "$instance": ".*"}


def panel_queries(model):
    return [target["expr"] for panel in model["panels"] for target in panel.get("targets", [])]


def test_one_repeated_row_per_instance_with_its_panels():
    model = dashboard()
    row, *panels = model["panels"]
    assert (row["type"], row["repeat"], row["title"]) == ("row", "instance", "$instance")
    assert [panel["title"] for panel in panels] == [
        "Token throughput",
        "Requests in the engine",
        "KV cache use",
        "Time to first token",
        "Inter-token latency",
        "End-to-end request latency",
        "Scraped",
        "Restarts",
        "Sleep state",
        "Finished requests",
        "Preemptions",
    ]
    assert len({panel["id"] for panel in model["panels"]}) == len(model["panels"])
    # The panels tile the row: within its width, none over another.
    cells = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= WIDTH
        area = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & area, panel["title"]
        cells |= area
    variables = {variable["name"]: variable for variable in model["templating"]["list"]}
    assert list(variables) == ["datasource", "host", "instance"]
    assert variables["instance"]["definition"] == 'label_values(up{vllm_instance!="", host=~"$host"}, vllm_instance)'


def test_every_query_selects_one_instance_and_its_targets_alone():
    for expr in panel_queries(dashboard()):
        selectors = re.findall(r"\{([^}]*)\}", expr)
        assert selectors, expr
        for selector in selectors:
            assert selector.startswith('vllm_instance!="", host=~"$host", vllm_instance=~"$instance"'), expr


def test_latency_panels_show_three_percentiles_in_seconds():
    panels = {panel["title"]: panel for panel in dashboard()["panels"]}
    ttft = panels["Time to first token"]
    assert ttft["fieldConfig"]["defaults"]["unit"] == "s"
    assert [target["legendFormat"] for target in ttft["targets"]] == ["p50 {{host}}", "p90 {{host}}", "p99 {{host}}"]
    assert ttft["targets"][2]["expr"].startswith("histogram_quantile(0.99, sum by (host, vllm_instance, model, le)")
    assert panels["KV cache use"]["fieldConfig"]["defaults"] == {"unit": "percentunit", "min": 0, "max": 1}


def test_a_panel_and_an_alert_that_show_one_thing_read_one_query():
    """The rules' expressions without their comparison are the panels' with the targets' selector alone."""
    rules = {rule["alert"]: rule["expr"] for rule in alert_rules()["groups"][0]["rules"]}
    panels = {panel["title"]: panel for panel in dashboard()["panels"]}

    def generic(expr):
        return expr.replace(', host=~"$host", vllm_instance=~"$instance"', "")

    assert rules["VllmInstanceDown"] == generic(panels["Scraped"]["targets"][0]["expr"]) + " == 0"
    assert rules["VllmKvCacheNearlyFull"] == generic(panels["KV cache use"]["targets"][0]["expr"]) + " > 0.9"
    assert generic(panels["Requests in the engine"]["targets"][1]["expr"]) in rules["VllmQueueGrowing"]
    assert (
        generic(panels["Restarts"]["targets"][0]["expr"]).replace("$__range", "15m") + " > 0"
        == rules["VllmInstanceRestarted"]
    )


def test_promtool_parses_every_query(promtool, tmp_path):
    model = dashboard()
    queries = panel_queries(model) + [
        re.sub(r"^label_values\((.*), \w+\)$", r"\1", variable["definition"])
        for variable in model["templating"]["list"]
        if "definition" in variable
    ]
    rules = []
    for index, query in enumerate(queries):
        for variable, value in GRAFANA_VARIABLES.items():
            query = query.replace(variable, value)
        rules.append({"record": f"dashboard:query_{index}", "expr": query})
    rules_file = tmp_path / "queries.yml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run([promtool, "check", "rules", str(rules_file)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(queries)} rules found" in proc.stdout
