"""The alert rules: Prometheus' own promtool checks them and runs their unit tests (*.test.yml beside this file).

promtool is the fixture of conftest.py: Debian's, unpacked by `make unit`.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ansible_collections.llmops.vllm.plugins.module_utils.observability.alert_rules import (
    DEFAULTS,
    AlertSettingsError,
    alert_rules,
    check_settings,
    check_slo,
)
from ansible_collections.llmops.vllm.plugins.module_utils.plan.catalog import CatalogError, check_entry

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SCRIPT = ROOT / "scripts" / "observability.py"


def run(promtool, *args, cwd=None):
    proc = subprocess.run([promtool, *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def rules_by_name(document):
    return {rule["alert"]: rule for group in document["groups"] for rule in group["rules"]}


def test_the_shipped_files_are_what_their_definition_generates():
    spec = importlib.util.spec_from_file_location("observability_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for path, text in script.generated().items():
        assert path.read_text() == text, f"{path.name} is stale: run .venv/bin/python scripts/observability.py"


def test_promtool_accepts_the_rules(promtool, tmp_path):
    assert "SUCCESS: 8 rules found" in run(promtool, "check", "rules", str(ROOT / "observability" / "alert-rules.yml"))
    settings = {"engine_hung": {"window": "10s", "for": "0s"}, "instance_down": {"for": "5s"}}
    slos = {"tiny": {"p99_ttft_ms": 500, "p50_itl_ms": 20}, "big": {"p99.9_e2el_ms": 60000}}
    written = tmp_path / "rules.yml"
    written.write_text(yaml.safe_dump(alert_rules(settings, slos)))
    assert "SUCCESS: 11 rules found" in run(promtool, "check", "rules", str(written))


def test_the_rules_fire_and_clear_as_their_tests_say(promtool):
    assert "SUCCESS" in run(promtool, "test", "rules", "alert-rules.test.yml", cwd=HERE)


def test_a_catalog_slo_fires_for_its_model_alone(promtool, tmp_path):
    shutil.copy(HERE / "slo-rules.test.yml", tmp_path)
    (tmp_path / "slo-rules.yml").write_text(yaml.safe_dump(alert_rules(slos={"tiny": {"p99_ttft_ms": 500}})))
    assert "SUCCESS" in run(promtool, "test", "rules", "slo-rules.test.yml", cwd=tmp_path)


def test_settings_reach_the_expressions_and_the_texts():
    rules = rules_by_name(
        alert_rules({"engine_hung": {"window": "8s", "for": "3s"}, "kv_cache_full": {"threshold": 0.8}})
    )
    hung = rules["VllmEngineHung"]
    assert 'increase(vllm:generation_tokens_total{vllm_instance!=""}[8s])' in hung["expr"]
    assert hung["for"] == "3s"
    assert "processed no token for 8s" in hung["annotations"]["description"]
    assert rules["VllmKvCacheNearlyFull"]["expr"].endswith("> 0.8")
    assert "above 80% for 10m" in rules["VllmKvCacheNearlyFull"]["annotations"]["description"]
    # An alert that holds for no time carries no `for`; the restart alert fires at once.
    assert "for" not in rules_by_name(alert_rules({"instance_down": {"for": "0s"}}))["VllmInstanceDown"]
    assert "for" not in rules["VllmInstanceRestarted"]
    group = rules_by_name(
        alert_rules({"group_rank_failing": {"for": "6s"}, "group_member_restarted": {"window": "2m"}})
    )
    assert group["VllmGroupRankFailing"]["for"] == "6s"
    assert "completion of the head's guard for 6s" in group["VllmGroupRankFailing"]["annotations"]["description"]
    assert group["VllmGroupMemberRestarted"]["expr"].endswith("[2m]) > 0")
    assert group["VllmGroupMemberRestarted"]["annotations"]["description"].startswith("Within 2m,")


def test_without_slos_there_is_no_slo_group():
    groups = ["llmops-vllm", "llmops-vllm-router", "llmops-vllm-group"]
    assert [group["name"] for group in alert_rules()["groups"]] == groups
    assert [group["name"] for group in alert_rules(slos={"tiny": {"p99_ttft_ms": 1}})["groups"]] == [
        *groups,
        "llmops-vllm-slo",
    ]


def test_one_slo_rule_per_objective_and_model():
    document = alert_rules(slos={"tiny": {"p99_ttft_ms": 500, "p50_itl_ms": 25}, "big": {"p99.9_e2el_ms": 60000}})
    slo_rules = document["groups"][3]["rules"]
    assert [(rule["labels"]["slo"], rule["expr"]) for rule in slo_rules] == [
        (
            "p99.9_e2el_ms",
            "histogram_quantile(0.999, sum by (host, vllm_instance, model, le) "
            "(rate(vllm:e2e_request_latency_seconds_bucket"
            '{vllm_instance!="", model="big"}[5m]))) > 60',
        ),
        (
            "p50_itl_ms",
            "histogram_quantile(0.5, sum by (host, vllm_instance, model, le) "
            "(rate(vllm:inter_token_latency_seconds_bucket"
            '{vllm_instance!="", model="tiny"}[5m]))) > 0.025',
        ),
        (
            "p99_ttft_ms",
            "histogram_quantile(0.99, sum by (host, vllm_instance, model, le) "
            "(rate(vllm:time_to_first_token_seconds_bucket"
            '{vllm_instance!="", model="tiny"}[5m]))) > 0.5',
        ),
    ]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"engine_stuck": {}}, "unknown alert 'engine_stuck'; the alerts are instance_down, instance_restarted"),
        ({"engine_hung": {"after": "5m"}}, "engine_hung has no setting 'after'; it has window, for"),
        ({"engine_hung": {"window": "5 minutes"}}, "engine_hung.window must be a Prometheus duration"),
        (
            {"engine_hung": {"window": 300}},
            "engine_hung.window must be a Prometheus duration such as 30s or 5m, got 300",
        ),
        ({"kv_cache_full": {"threshold": 90}}, "kv_cache_full.threshold must be a number of at least 0 and at most 1"),
        ({"queue_growing": {"min_waiting": -1}}, "queue_growing.min_waiting must be a number of at least 0, got -1"),
        ({"instance_down": "1m"}, "the settings of instance_down must be a mapping"),
        (["instance_down"], "alert settings must map an alert to its settings"),
    ],
)
def test_bad_settings_are_refused_by_name(settings, message):
    with pytest.raises(AlertSettingsError, match=message):
        check_settings(settings)


def test_settings_change_nothing_but_what_they_name():
    merged = check_settings({"engine_hung": {"window": "30s"}})
    assert merged["engine_hung"] == {"window": "30s", "for": "1m"}
    assert {key: value for key, value in merged.items() if key != "engine_hung"} == {
        key: value for key, value in DEFAULTS.items() if key != "engine_hung"
    }


@pytest.mark.parametrize(
    ("slo", "message"),
    [
        ({"p99_ttft": 500}, "unknown key 'p99_ttft'"),
        ({"p100_ttft_ms": 500}, "unknown key 'p100_ttft_ms'"),
        ({"p0_ttft_ms": 500}, "unknown key 'p0_ttft_ms'"),
        ({"p99_tpot_ms": 500}, "LATENCY one of ttft, itl, e2el"),
        ({"p99_ttft_ms": 0}, "p99_ttft_ms must be a number of milliseconds above 0, got 0"),
        ({"p99_ttft_ms": "fast"}, "got 'fast'"),
        ([500], "must map a latency such as p99_ttft_ms to milliseconds"),
    ],
)
def test_bad_slos_are_refused(slo, message):
    with pytest.raises(ValueError, match=message):
        check_slo(slo)


def test_a_catalog_entry_with_a_bad_slo_is_refused_before_any_rule():
    with pytest.raises(CatalogError, match=r"catalog entry 'tiny': slo has an unknown key 'p99_ttft'"):
        check_entry("tiny", {"source": {"kind": "generated"}, "served_name": "tiny", "slo": {"p99_ttft": 1}})
    entry = check_entry("tiny", {"source": {"kind": "generated"}, "served_name": "tiny", "slo": {"p99_ttft_ms": 250}})
    assert entry["slo"] == {"p99_ttft_ms": 250}
    assert check_entry("tiny", {"source": {"kind": "generated"}, "served_name": "tiny"})["slo"] == {}


def test_a_bad_slo_reaching_the_rules_names_its_model():
    with pytest.raises(AlertSettingsError, match="the slo of catalog entry tiny must map a latency"):
        alert_rules(slos={"tiny": 500})
