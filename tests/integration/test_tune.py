"""tune.yml on the local host: a real tune of tiny_tune (tests/integration/catalog) beside the session's tiny.

Six candidates: TP 1 and TP 3 times max_num_seqs 4, 16 and 64 at max_num_batched_tokens 32. The planner refuses the
three of TP 3 (tiny has 4 attention heads); vLLM refuses max_num_seqs 64 at start (more sequences than batched
tokens); the other two are measured. The first run is killed mid-tune, as a lost controller would leave it; the
second measures only what the first did not, and the host ends as it began: tiny_tune serving from its own unit,
tiny never touched. A third run with vllm_tune_apply measures nothing and keeps the winner, which the next
deploy.yml then finds in the overlay.

tiny_tune comes from a gated hub repository (the hub stand-in inside the host, behind a token): the overlay keeps
that source, so the winner's swap plans it and checks its weights at the hub, with the tune's token and endpoint.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest
import yaml

from .conftest import ROOT, hub_standin, remove_instances

CATALOG = ROOT / "tests" / "integration" / "catalog"
INSTANCE = "tiny_tune"
GUARD = "llmops-vllm-tune-guard-tiny_tune.timer"
HUB_ROOT, HUB_PORT, HUB_TOKEN = "/srv/hub-tune", 8095, "hf_tune_gated_7c41"
REPO = "llmops/tiny-tune"
TUNE = {
    "vllm_tune_grid": {"max_num_seqs": [4, 16, 64], "max_num_batched_tokens": [32]},
    "vllm_tune_bench_concurrency": [1, 4],
    "vllm_tune_bench_num_requests": 8,
    "vllm_tune_bench_input_len": 32,
    "vllm_tune_bench_output_len": 16,
}
# A tune of six candidates: four loads of tiny at most, each well under a minute here.
TUNE_TIMEOUT = 900


def deploy_vars(hub, catalog_paths):
    return {**hub, "vllm_catalog_paths": catalog_paths, "vllm_instances": [{"model": INSTANCE, "port": 8001}]}


def unit_state(host, unit, *properties):
    proc = host.sh(f"systemctl show {unit} " + " ".join(f"-p {name}" for name in properties))
    return dict(line.split("=", 1) for line in proc.stdout.splitlines())


@pytest.fixture(scope="module")
def hub(deployed, tmp_path_factory):
    """tiny_tune in a gated hub repository: the settings that reach it, its catalog entry's directory, the hub's
    endpoint and the token. The entry is catalog/tiny_tune.yml with its source at the hub."""
    generated = deployed.module("llmops.vllm.tiny_model", path=f"{HUB_ROOT}/{REPO}", python="/opt/vllm/venv/bin/python")
    assert not generated.get("failed"), generated
    catalog = tmp_path_factory.mktemp("catalog")
    entry = yaml.safe_load((CATALOG / f"{INSTANCE}.yml").read_text())
    entry["source"] = {"kind": "hub", "repo": REPO, "revision": "main"}
    (catalog / f"{INSTANCE}.yml").write_text(yaml.safe_dump(entry))
    with hub_standin(deployed, HUB_ROOT, HUB_PORT, HUB_TOKEN) as endpoint:
        yield {"vllm_catalog_paths": [str(catalog)], "vllm_hub_token": HUB_TOKEN, "vllm_hub_endpoint": endpoint}


@pytest.fixture(scope="module")
def tune_host(deployed, hub):
    """tiny_tune deployed beside tiny from the hub, on port 8001; it and its candidate removed afterwards."""
    proc = deployed.playbook("playbooks/deploy.yml", "-e", json.dumps(deploy_vars(hub, hub["vllm_catalog_paths"])))
    assert proc.returncode == 0, f"deploy.yml failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    yield deployed
    remove_instances(deployed, INSTANCE, f"{INSTANCE}-tune")


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    """The report of the resumed tune, which the tune with vllm_tune_apply reads back."""
    return tmp_path_factory.mktemp("tune") / "report"


def tune_command(host, hub, report_dir, **extra):
    variables = json.dumps({**hub, **TUNE, "vllm_tune_report_dir": str(report_dir), **extra})
    return ["ansible-playbook", "-i", str(host.inventory), "--limit", host.name, "playbooks/tune.yml",
            "-e", f"model={INSTANCE}", "-e", variables]  # fmt: skip


def run_tune(host, hub, report_dir, *args, **extra):
    command = tune_command(host, hub, report_dir, **extra) + list(args)
    return subprocess.run(command, capture_output=True, text=True, timeout=TUNE_TIMEOUT, cwd=ROOT, check=False)


def report(host, report_dir):
    return json.loads((report_dir / f"{host.name}.json").read_text())


def serves(host, instance):
    [info] = host.module("llmops.vllm.vllm_instance_info", instances=[instance], metrics=True)["instances"]
    return info["active_state"] == "active" and info["serving"] is True


def test_the_guard_stops_the_candidate_and_starts_the_tuned_instance_when_it_fires(local_host):
    """The guard as the tune arms it, let fire: two units of the host stand for the candidate (running, enabled at
    boot) and the tuned instance (stopped)."""
    host, guard = local_host, "llmops-vllm-tune-guard-guardtest"
    candidate, tuned = "llmops-guard-candidate.service", "llmops-guard-tuned.service"
    for unit in (candidate, tuned):
        host.sh(f"printf '[Service]\\nExecStart=/bin/sleep 600\\n[Install]\\nWantedBy=multi-user.target\\n'"
                f" > /etc/systemd/system/{unit}")  # fmt: skip
    host.sh(f"systemctl daemon-reload && systemctl enable --now {candidate}")
    try:
        variables = {"guard_instance": "guardtest", "guard_after": 1, "guard_candidate_unit": candidate,
                     "guard_tuned_unit": tuned}  # fmt: skip
        proc = host.playbook("tests/integration/playbooks/tune_guard.yml", "-e", json.dumps(variables))
        assert proc.returncode == 0, proc.stdout[-4000:]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = unit_state(host, candidate, "ActiveState", "UnitFileState"), unit_state(host, tuned, "ActiveState")
            if states == ({"ActiveState": "inactive", "UnitFileState": "disabled"}, {"ActiveState": "active"}):
                break
            time.sleep(0.5)
        assert states == ({"ActiveState": "inactive", "UnitFileState": "disabled"}, {"ActiveState": "active"})
    finally:
        host.sh(
            f"systemctl stop {guard}.timer {guard}.service {candidate} {tuned}; systemctl reset-failed {guard}.service"
            f" {guard}.timer; systemctl disable {candidate}; rm -f /etc/systemd/system/{candidate}"
            f" /etc/systemd/system/{tuned}; systemctl daemon-reload",
            check=False,
        )


def test_check_mode_lists_the_candidates_and_the_planner_s_verdicts_and_changes_nothing(tune_host, hub, tmp_path):
    before = unit_state(tune_host, "vllm-tiny_tune.service", "MainPID")
    proc = run_tune(tune_host, hub, tmp_path / "report", "--check")
    assert proc.returncode == 0, proc.stdout[-6000:]
    # The table, as the play shows it: the callback folds long lines.
    table = re.sub(r"\n\s+", " ", proc.stdout)
    rows = re.findall(r"'\| ([^|]+ max_num_batched_tokens=32) \| (\w+) \|[^']*'", table)
    assert [verdict for _name, verdict in rows] == ["pending"] * 3 + ["refused"] * 3
    assert table.count("tiny_tune TP3: 4 attention heads are not divisible by tensor_parallel_size 3") == 3
    assert not (tmp_path / "report").exists()
    assert unit_state(tune_host, "vllm-tiny_tune.service", "MainPID") == before


def test_a_killed_tune_resumes_measures_nothing_twice_and_ends_as_the_host_began(tune_host, hub, report_dir, tmp_path):
    other = unit_state(tune_host, "vllm-tiny.service", "MainPID", "ActiveEnterTimestampMonotonic")
    unit_file = tune_host.sh("sha256sum /etc/systemd/system/vllm-tiny_tune.service").stdout

    # 1. Killed once a candidate is measured: the controller is gone, the host is mid-tune.
    started = time.monotonic()
    log = tmp_path / "first-run.log"
    with log.open("w") as output:
        first = subprocess.Popen(tune_command(tune_host, hub, report_dir), cwd=ROOT, stdout=output,
                                 stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + TUNE_TIMEOUT
        while time.monotonic() < deadline and first.poll() is None:
            saved = (report_dir / f"{tune_host.name}.json").exists() and report(tune_host, report_dir)
            if saved and any(row["verdict"] == "measured" for row in saved["candidates"]):
                break
            time.sleep(2)
        assert first.poll() is None, f"the tune ended before it could be interrupted:\n{log.read_text()[-6000:]}"
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    interrupted = report(tune_host, report_dir)
    assert interrupted["state"] == {"in_progress": True, "serving": True}
    [measured_first] = [row for row in interrupted["candidates"] if row["verdict"] == "measured"]
    assert tune_host.sh(f"systemctl is-active {GUARD}", check=False).stdout.strip() == "active", "the guard is armed"

    # 2. Run again: the candidate measured is not measured again, the rest is, and the host ends as it began.
    proc = run_tune(tune_host, hub, report_dir)
    output = re.sub(r"\n\s+", " ", proc.stdout + proc.stderr)
    assert proc.returncode == 0, output[-8000:]
    elapsed = time.monotonic() - started
    final = report(tune_host, report_dir)
    rows = {row["name"]: row for row in final["candidates"]}
    print(f"tune of {len(rows)} candidates, killed and resumed: {elapsed:.0f} s; this run: {final['runs'][-1]}")
    print((report_dir / f"{tune_host.name}.md").read_text())
    assert [row["verdict"] for row in final["candidates"]] == ["measured", "measured", "failed"] + ["refused"] * 3
    resumed = rows[measured_first["name"]]
    assert resumed["resumed"] and resumed["levels"] == measured_first["levels"], "measured once, kept as it was"
    assert final["runs"][-1]["resumed"] == 1 and final["runs"][-1]["measured"] == 2
    failed = rows["default max_num_seqs=64 max_num_batched_tokens=32"]
    assert "max_num_batched_tokens (32) must be greater than or equal to max_num_seqs (64)" in failed["reason"]
    refused = rows["tp3 max_num_seqs=4 max_num_batched_tokens=32"]
    assert "4 attention heads are not divisible by tensor_parallel_size 3" in refused["reason"]
    assert refused["load_s"] is None, "a refused candidate is never deployed"
    for row in final["candidates"][:2]:
        assert [level["max_concurrency"] for level in row["levels"]] == [1, 4]
        assert all(level["completed"] == 8 and level["output_throughput"] > 0 for level in row["levels"])
        assert row["load_s"] > 0
    winner = final["winner"]
    assert winner["name"] in rows and f"Winner of {INSTANCE} on {tune_host.name}: {winner['reason']}" in output
    split = final["runs"][-1]
    parts = split["loads_s"] + split["benchmarks_s"] + split["stops_s"] + split["overhead_s"]
    assert split["loads_s"] > 0 and split["benchmarks_s"] > 0 and abs(parts - split["total_s"]) < 0.5
    table = (report_dir / f"{tune_host.name}.md").read_text()
    assert f"**{winner['name']}**" in table and "| C=4 tok/s (TTFT ms) |" in table
    plot = (report_dir / f"{tune_host.name}.svg").read_text()
    assert plot.count("<polyline ") == 3 and 'class="pareto"' in plot and f"{winner['name']} (winner)" in plot
    assert final["state"] == {"in_progress": False, "serving": True}

    # The host as it began: tiny_tune serving from its own unit, the candidate stopped and disabled, the guard
    # disarmed, and the other instance never touched.
    assert serves(tune_host, INSTANCE)
    assert tune_host.sh("sha256sum /etc/systemd/system/vllm-tiny_tune.service").stdout == unit_file
    candidate = unit_state(tune_host, "vllm-tiny_tune-tune.service", "ActiveState", "UnitFileState")
    assert candidate == {"ActiveState": "inactive", "UnitFileState": "disabled"}
    assert tune_host.sh(f"systemctl is-active {GUARD}", check=False).stdout.strip() == "inactive"
    assert unit_state(tune_host, "vllm-tiny.service", "MainPID", "ActiveEnterTimestampMonotonic") == other


def test_the_winner_applied_serves_and_the_next_deploy_finds_it(tune_host, hub, report_dir, tmp_path):
    """After the resumed tune: the same workload measures nothing, and the winner is kept. The overlay keeps the
    model's source, the gated hub repository: the swap that deploys the winner plans it and checks its weights there
    with the tune's token and endpoint."""
    assert (report_dir / f"{tune_host.name}.json").exists(), "runs after the resumed tune, whose report it reads"
    overlay = tmp_path / "catalog"
    overlay.mkdir()
    paths = [str(overlay), *hub["vllm_catalog_paths"]]
    proc = run_tune(tune_host, hub, report_dir, vllm_tune_apply=True, vllm_catalog_paths=paths)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-8000:]
    assert HUB_TOKEN not in proc.stdout + proc.stderr
    final = report(tune_host, report_dir)
    # The two measured and the one that failed are taken from the runs before; only the winner loads, once.
    assert final["runs"][-1]["measured"] == 0 and final["runs"][-1]["resumed"] == 3
    settings = next(row for row in final["candidates"] if row["key"] == final["winner"]["key"])["settings"]
    entry = (overlay / f"{INSTANCE}.yml").read_text()
    assert f"max_num_seqs: {settings['max_num_seqs']}" in entry and "- '32'" in entry and f"repo: {REPO}" in entry
    assert "applied" in final and final["applied"].startswith(final["winner"]["name"])
    exec_start = tune_host.sh("systemctl show -p ExecStart vllm-tiny_tune.service").stdout
    assert f"--max-num-seqs {settings['max_num_seqs']} " in exec_start and "--max-num-batched-tokens 32" in exec_start
    assert serves(tune_host, INSTANCE)
    deploy = tune_host.playbook("playbooks/deploy.yml", "-e", json.dumps(deploy_vars(hub, paths)))
    assert deploy.returncode == 0 and "changed=0" in deploy.stdout, deploy.stdout[-4000:]
