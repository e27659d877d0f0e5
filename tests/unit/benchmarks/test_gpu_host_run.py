"""The GPU host runner's bookkeeping: how a playbook run's time is split, and how vLLM's phases are read per load
from a unit's journal (benchmarks/gpu_host/run.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SPEC = importlib.util.spec_from_file_location("gpu_host_run", ROOT / "benchmarks" / "gpu_host" / "run.py")
run = importlib.util.module_from_spec(SPEC)
sys.modules["gpu_host_run"] = run
SPEC.loader.exec_module(run)


def task(name, seconds, action, **result):
    start = "2026-12-03T10:00:00.000000Z"
    end = f"2026-12-03T10:00:{seconds:09.6f}Z"
    return {
        "task": {"name": name, "duration": {"start": start, "end": end}},
        "hosts": {"h200": {"action": action, **result}},
    }


REPORT = {
    "plays": [
        {
            "tasks": [
                task("llmops.vllm.vllm_preflight : Plan", 2.0, "llmops.vllm.vllm_plan"),
                task(
                    "llmops.vllm.vllm_server : Start the server",
                    41.0,
                    "llmops.vllm.vllm_service",
                    start={"systemd_start": 0.5, "load": 40.0, "elapsed": 40.5},
                    stop=None,
                ),
                task(
                    "llmops.vllm.vllm_swap : Put the old instance to sleep",
                    1.8,
                    "llmops.vllm.vllm_service",
                    start=None,
                    sleep={"elapsed": 1.7},
                ),
                task("llmops.vllm.vllm_bench : Benchmark", 20.0, "llmops.vllm.vllm_bench", levels=[]),
                task("llmops.vllm.vllm_stop : Wait for the GPUs", 0.5, "llmops.vllm.gpu_memory_wait"),
                task("llmops.vllm.vllm_stop : Stop", 3.0, "llmops.vllm.vllm_service", stop={"elapsed": 2.9}),
                task(
                    "llmops.vllm.vllm_status : Show the fleet",
                    0.1,
                    "ansible.builtin.debug",
                    msg=["| host | instance |", "engine died: SIGKILL"],
                ),
                task("llmops.vllm.vllm_swap : Roll back", 0.2, "ansible.builtin.fail", failed=True, msg="no serve"),
                task("llmops.vllm.vllm_swap : Tolerated", 0.2, "ansible.builtin.fail", failed=True, ignored=True),
            ]
        }
    ]
}


def test_the_time_of_a_run_is_split_into_what_vllm_and_the_gpus_took_and_ansibles_own_rest():
    split = run.time_split(REPORT, wall=80.0)
    assert split["load_s"] == 40.5 and split["loads_s"] == [40.5]
    assert (split["sleep_s"], split["stop_s"], split["bench_s"], split["gpu_wait_s"]) == (1.7, 2.9, 20.0, 0.5)
    assert split["ansible_s"] == round(80.0 - 40.5 - 1.7 - 2.9 - 20.0 - 0.5, 2)
    assert split["tasks_s"] == 68.8


def test_a_wait_looped_over_instances_counts_its_tasks_time_once():
    """On the H200, stop.yml's wait for the GPUs of three instances took 2.5 s and was counted three times."""
    items = [{"elapsed": 0.25, "item": name} for name in ("host_a", "host_b", "host_broken")]
    report = {
        "plays": [{"tasks": [task("Wait until the GPUs are free", 2.5, "llmops.vllm.gpu_memory_wait", results=items)]}]
    }
    split = run.time_split(report, wall=4.0)
    assert split["gpu_wait_s"] == 2.5
    assert split["ansible_s"] == 1.5


def test_a_roles_table_and_the_failures_are_read_by_the_tasks_own_names():
    assert run.debug_lines(REPORT, "Show the fleet") == ["| host | instance |", "engine died: SIGKILL"]
    assert run.failures(REPORT) == [{"task": "Roll back", "host": "h200", "msg": "no serve"}]


def test_a_roles_result_is_read_from_the_last_task_that_set_it():
    swap = [
        task("llmops.vllm.vllm_swap : Prepare", 0.1, "ansible.builtin.set_fact", ansible_facts={"vllm_swap_result": 0}),
        task("llmops.vllm.vllm_swap : Keep", 0.1, "ansible.builtin.set_fact", ansible_facts={"other": 1}),
        task(
            "llmops.vllm.vllm_swap : Record the result",
            0.1,
            "ansible.builtin.set_fact",
            ansible_facts={"vllm_swap_result": {"result": "rolled back", "rollback": 1.9}},
        ),
    ]
    report = {"plays": [{"tasks": swap}]}
    assert run.fact_of(report, "vllm_swap_result") == {"result": "rolled back", "rollback": 1.9}
    assert run.fact_of(report, "vllm_tune_result") is None


class Journal:
    def __init__(self, lines):
        self.lines = lines

    def journal(self, since, unit=None):
        return self.lines


def test_vllms_phases_are_read_for_each_start_of_the_unit():
    lines = [
        "Starting vllm-host_a.service - vLLM serving host-a...",
        "Started vllm-host_a.service - vLLM serving host-a.",
        "INFO Model loading took 2.05 GiB memory and 1.8 seconds",
        "INFO init engine (profile, create kv cache, warmup model) took 3.1 seconds",
        "vllm-host_a.service: Main process exited, code=exited, status=0/SUCCESS",
        "Starting vllm-host_a.service - vLLM serving host-a...",
        "Started vllm-host_a.service - vLLM serving host-a.",
        "INFO Model loading took 2.05 GiB memory and 1.2 seconds",
    ]
    loads = run.phases_of_loads(Journal(lines), 0, "vllm-host_a.service")
    assert loads == [
        {"weights_s": 1.8, "weights_gib": 2.05, "engine_init_s": 3.1},
        {"weights_s": 1.2, "weights_gib": 2.05},
    ]


def test_the_journal_scan_leaves_out_what_ansible_logs_of_its_modules_arguments():
    """On the H200 every deploy counted one 'Operation not permitted' alarm: the unit's text, with its
    SystemCallErrorNumber=EPERM line, that the vllm_instance module's invocation logged as its argument."""
    refused = "SHARE child-to-parent failed: pidfd_getfd: Operation not permitted"
    entries = [
        {
            "SYSLOG_IDENTIFIER": "ansible-llmops.vllm.vllm_instance",
            "MESSAGE": "Invoked with\nSystemCallErrorNumber=EPERM",
        },
        {"SYSLOG_IDENTIFIER": "python", "MESSAGE": refused},
        {"SYSLOG_IDENTIFIER": "python", "MESSAGE": [83, 72, 65, 82, 69, 32, 255]},
        {"SYSLOG_IDENTIFIER": "systemd", "MESSAGE": None},
    ]
    messages = run.host_messages("\n".join(json.dumps(entry) for entry in entries))
    assert messages == [refused, "SHARE \ufffd"]
    assert [m for m in messages if run.JOURNAL_ALARMS["operation_not_permitted"].search(m)] == [refused]
