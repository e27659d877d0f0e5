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


def journal_json(entries):
    """`journalctl -o json` lines of (seconds, writer, message)."""
    return "\n".join(
        json.dumps({"__REALTIME_TIMESTAMP": str(int(seconds * 1e6)), "SYSLOG_IDENTIFIER": writer, "MESSAGE": message})
        for seconds, writer, message in entries
    )


class JsonJournal:
    def __init__(self, entries):
        self.output = journal_json(entries)

    def exec(self, *command, check=True, timeout=120):
        assert command[:5] == ("journalctl", "--no-pager", "-o", "json", "-u")
        return self.output


START = [
    (100.0, "systemd", "Starting vllm-seed.service - vLLM serving minimax-m2.5-16l..."),
    (100.2, "systemd", "Started vllm-seed.service - vLLM serving minimax-m2.5-16l."),
    (124.5, "python", "INFO 12-04 19:00:24 [api_server.py:1] vLLM API server version 0.26.0"),
    (125.0, "python", "INFO 12-04 19:00:25 [model.py:623] Resolved architecture: MiniMaxM2ForCausalLM"),
    (150.1, "python", "(EngineCore pid=77) INFO 12-04 19:00:50 [core.py:1] Initializing a V1 LLM engine"),
    (163.0, "python", "(EngineCore pid=77) INFO Model loading took 57.1 GiB memory and 12.9 seconds"),
    (191.0, "python", "(EngineCore pid=77) INFO [monitor.py:53] torch.compile took 21.5 s in total"),
    (245.0, "python", "(EngineCore pid=77) INFO [gpu_worker.py:561] Available KV cache memory: 63.2 GiB"),
    (245.1, "python", "(EngineCore pid=77) INFO [kv_cache_utils.py:2177] GPU KV cache size: 1,035,264 tokens"),
    (245.2, "python", "(EngineCore pid=77) INFO Maximum concurrency for 32,768 tokens per request: 31.59x"),
    (386.0, "python", "(EngineCore pid=77) INFO Graph capturing finished in 12 secs, took 0.9 GiB"),
    (387.0, "python", "(EngineCore pid=77) INFO init engine (profile, create kv cache, warmup model) took 222.4 s"),
    (401.3, "python", "INFO:     Application startup complete."),
]  # fmt: skip


def test_a_start_is_timed_from_the_units_started_line_to_each_of_vllms_marks():
    timeline = run.start_timeline(START)
    assert timeline == {
        "api_server_first_line": 24.3,
        "config_resolved": 24.8,
        "engine_first_line": 49.9,
        "weights_loaded": 62.8,
        "compiled": 90.8,
        "kv_cache_sized": 144.8,
        "graphs_captured": 285.8,
        "engine_ready": 286.8,
        "serving": 301.1,
    }
    assert run.start_timeline(START[2:]) == {}


def test_each_start_of_the_unit_has_its_own_phases_figures_and_timeline():
    restart = [(500.0 + seconds, writer, message) for seconds, writer, message in START]
    stop = [(450.0, "systemd", "Stopping vllm-seed.service - vLLM serving minimax-m2.5-16l...")]
    starts = run.starts_of(run.unit_journal(JsonJournal([*START, *stop, *restart[:4]]), 0, "vllm-seed.service"))
    assert len(starts) == 2
    first, second = starts
    assert first["weights_gib"] == 57.1 and first["kv_cache_gib"] == 63.2
    assert first["kv_cache_tokens"] == 1035264 and first["max_concurrency"] == 31.59
    assert first["timeline"]["serving"] == 301.1
    assert second == {"timeline": {"api_server_first_line": 24.3, "config_resolved": 24.8}}


def test_the_plan_is_set_beside_what_vllm_reported_and_how_far_off_it_is():
    memory = {
        "weights_bytes": int(57.0 * 2**30),
        "kv_cache_bytes": int(60.0 * 2**30),
        "kv_cache_tokens": 983040,
        "max_model_len": 32768,
    }
    phases = {"weights_gib": 57.1, "kv_cache_gib": 63.2, "kv_cache_tokens": 1035264, "max_concurrency": 31.59}
    compared = run.plan_against_vllm(memory, phases)
    assert compared["weights_gib"] == {"plan": 57.0, "vllm": 57.1, "off_percent": -0.2}
    assert compared["kv_cache_gib"]["off_percent"] == -5.1
    assert compared["kv_cache_tokens"] == {"plan": 983040, "vllm": 1035264, "off_percent": -5.0}
    assert compared["max_concurrency"] == {"plan": 30.0, "vllm": 31.59, "off_percent": -5.0}
    assert run.plan_against_vllm(memory, {})["weights_gib"]["off_percent"] is None


def test_importtime_is_summed_by_package_and_its_slowest_top_level_imports():
    text = "\n".join([
        "import time: self [us] | cumulative | imported package",
        "import time:      2000 |       2000 |   torch._C",
        "import time:    500000 |    9000000 | torch",
        "import time:       300 |        300 |     vllm.envs",
        "import time:   1000000 |    4000000 | vllm",
        "import time:       100 |        100 | json",
    ])  # fmt: skip
    summary = run.importtime_summary(text)
    assert summary["modules"] == 5
    assert summary["total_own_s"] == 1.5
    assert list(summary["top_level_cumulative_s"]) == ["torch", "vllm", "json"]
    assert summary["own_s_by_package"] == {"vllm": 1.0, "torch": 0.5, "json": 0.0}


def test_vllm_bench_startup_gets_the_units_engine_arguments_without_the_api_servers():
    argv = ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/a",
            "--host", "0.0.0.0", "--port=8001", "--middleware", "guard.Guard", "--max-model-len", "4096",
            "--enforce-eager", "--shutdown-timeout", "5"]  # fmt: skip
    assert run.engine_arguments(argv) == [
        "--model", "/models/a", "--max-model-len", "4096", "--enforce-eager", "--shutdown-timeout", "5",
    ]  # fmt: skip


def test_a_starts_journal_is_listed_from_its_started_line_with_seconds_since():
    restart = [(500.0 + seconds, writer, message) for seconds, writer, message in START]
    lines = run.journal_lines([*START, *restart], last=3)
    assert len(lines) == 3
    assert lines[0].split(maxsplit=1) == ["0.00", START[1][2]]
    assert lines[2].split(maxsplit=1)[0] == f"{START[3][0] - START[1][0]:.2f}"
    assert run.journal_lines(START[2:]) == []
