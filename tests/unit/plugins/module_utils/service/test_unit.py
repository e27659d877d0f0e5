import os
import subprocess
from pathlib import Path

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import (
    Unit,
    UnitError,
    cgroup_pids,
    drop_in_dir_names,
    drop_ins_on_disk,
    engine_death,
    error_lines,
    exec_start_argv,
    flag_value,
    journal_messages,
    last_engine_death,
    needs_daemon_reload,
    parse_show,
    without_flags,
)

# `systemctl show vllm-tiny.service -p ...` of a server that was stopped, as systemd 252 prints it.
SHOW_STOPPED = """MainPID=0
Result=success
ExecMainStartTimestampMonotonic=8756968409
ExecMainPID=2613
ExecMainCode=1
ExecMainStatus=0
ExecStart={ path=/opt/vllm/venv/bin/python ; argv[]=/opt/vllm/venv/bin/python -m vllm.entrypoints.openai.api_server \
--model /var/lib/vllm/models/tiny --served-model-name tiny --port 8000 --shutdown-timeout 10 ; ignore_errors=no ; \
start_time=[Mon 2026-11-30 05:17:34 UTC] ; stop_time=[Mon 2026-11-30 05:24:00 UTC] ; pid=2613 ; code=exited ; status=0 }
ControlGroup=
LoadState=loaded
ActiveState=inactive
SubState=dead
NeedDaemonReload=no
InvocationID=fa924c79fc214835b8428a2cbf86cf96
"""


def test_parse_show_of_a_stopped_unit():
    state = parse_show("vllm-tiny.service", SHOW_STOPPED)
    assert state.exists and state.stopped and not state.crashed and not state.needs_daemon_reload
    assert (state.main_pid, state.last_main_pid, state.main_started_us) == (0, 2613, 8756968409)
    assert state.outcome() == "result success, main process exited with status 0"
    assert exec_start_argv(state.exec_start)[-2:] == ["--shutdown-timeout", "10"]


@pytest.mark.parametrize(
    ("lines", "exists", "stopped", "crashed"),
    [
        ("LoadState=not-found\nActiveState=inactive\n", False, True, False),
        ("LoadState=loaded\nActiveState=activating\nSubState=auto-restart\n", True, False, True),
        ("LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code\n", True, True, True),
        ("LoadState=loaded\nActiveState=deactivating\nSubState=stop-sigterm\n", True, False, False),
    ],
)
def test_unit_states(lines, exists, stopped, crashed):
    state = parse_show("x.service", lines)
    assert (state.exists, state.stopped, state.crashed) == (exists, stopped, crashed)


def test_outcome_of_a_killed_main_process():
    state = parse_show("x.service", "Result=signal\nExecMainCode=2\nExecMainStatus=9\n")
    assert state.outcome() == "result signal, main process killed with status 9"


@pytest.mark.parametrize(
    ("argv", "value"),
    [
        (["--shutdown-timeout", "10"], "10"),
        (["--shutdown-timeout=30"], "30"),
        (["--shutdown-timeout", "10", "--shutdown-timeout", "0"], "0"),
        (["--port", "8000"], None),
        (["--shutdown-timeout"], None),
    ],
)
def test_flag_value(argv, value):
    assert flag_value(argv, "--shutdown-timeout") == value


def test_flags_are_left_out_with_their_values_in_either_spelling():
    argv = ["--model", "/m", "--host", "0.0.0.0", "--port=8000", "--hostname-like", "x", "--max-model-len", "4096"]
    assert without_flags(argv, ("--host", "--port")) == [
        "--model",
        "/m",
        "--hostname-like",
        "x",
        "--max-model-len",
        "4096",
    ]


def test_exec_start_argv_without_a_command():
    assert exec_start_argv("") == []


def test_cgroup_pids_walks_sub_cgroups(tmp_path):
    unit = tmp_path / "unified" / "system.slice" / "vllm-tiny.service"
    (unit / "payload").mkdir(parents=True)
    (unit / "cgroup.procs").write_text("101\n102\n")
    (unit / "payload" / "cgroup.procs").write_text("103\n")
    roots = (str(tmp_path / "unified"), str(tmp_path / "systemd"))
    assert cgroup_pids("/system.slice/vllm-tiny.service", roots) == [101, 102, 103]
    assert cgroup_pids("/system.slice/gone.service", roots) == []
    assert cgroup_pids("", roots) == []


def test_error_lines_keeps_the_first_of_each_and_their_order():
    journal = [
        "INFO loading weights",
        # vLLM's warning at every start on these hosts names an error, but is none.
        "Dec 01 15:44:52 host python[2626]: WARNING 12-01 15:44:52 [system_utils.py:180] Found ulimit of 20000"
        " and failed to automatically increase with error current limit exceeds maximum limit.",
        "ERROR 11-30 [core.py] EngineCore failed to start.",
        "Traceback (most recent call last):",
        "ERROR 11-30 [core.py] EngineCore failed to start.",
        "torch.OutOfMemoryError: CUDA out of memory.",
        "INFO shutting down",
    ]
    assert error_lines(journal) == [journal[2], journal[3], journal[5]]


def test_error_lines_skip_a_traceback_s_frames_and_source_lines():
    """The API server's traceback after the engine's died echoes `raise RuntimeError(` and paths with cuda in them;
    the exceptions' own lines, each process's, are what name the cause."""
    journal = [
        "(EngineCore pid=978) ERROR 12-06 12:24:40 [core.py:1100] EngineCore failed to start.",
        "(EngineCore pid=978) Traceback (most recent call last):",
        '(EngineCore pid=978)   File "/opt/vllm/venv/lib/python3.12/site-packages/vllm/v1/worker/gpu/cuda_graph.py",'
        " line 80, in capture",
        "(EngineCore pid=978)     raise CudaError(",
        "(EngineCore pid=978)            ^^^^^^^^^^",
        "(EngineCore pid=978) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "(APIServer pid=838)     raise RuntimeError(",
        "    raise RuntimeError(",
        "(APIServer pid=838) RuntimeError: Engine core initialization failed. See root cause above.",
    ]
    assert error_lines(journal) == [journal[0], journal[1], journal[5], journal[8]]


def run_for_real(command):
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def test_unit_reports_a_failed_systemctl_with_its_words():
    if not os.path.exists("/usr/bin/systemctl") and not os.path.exists("/bin/systemctl"):
        pytest.skip("systemctl is not installed here")
    with pytest.raises(UnitError, match=r"systemctl start --no-block vllm-x\.service failed"):
        Unit("vllm-x.service", run_for_real).start()


def test_unit_journal_reads_one_run():
    seen = []

    def runner(command):
        seen.append(command)
        return 0, "line one\nline two\n", ""

    assert Unit("vllm-tiny.service", runner).journal("fa924c79", 40) == ["line one", "line two"]
    matches = ["_SYSTEMD_INVOCATION_ID=fa924c79", "+", "INVOCATION_ID=fa924c79"]
    assert seen == [["journalctl", *matches, "--lines", "40", "--no-pager", "--output", "cat"]]


def test_a_drop_in_added_or_removed_since_loading_needs_a_reload(tmp_path):
    unit_dirs = (str(tmp_path / "etc"), str(tmp_path / "run"))
    drop_in = tmp_path / "etc" / "vllm-tiny.service.d" / "test.conf"
    loaded = parse_show("vllm-tiny.service", "LoadState=loaded\nNeedDaemonReload=no\nDropInPaths=\n")
    assert not needs_daemon_reload(loaded, unit_dirs)
    drop_in.parent.mkdir(parents=True)
    drop_in.write_text("[Service]\nKillMode=process\n")
    assert needs_daemon_reload(loaded, unit_dirs)
    reloaded = parse_show("vllm-tiny.service", f"NeedDaemonReload=no\nDropInPaths={drop_in}\n")
    assert not needs_daemon_reload(reloaded, unit_dirs)
    drop_in.unlink()
    assert needs_daemon_reload(reloaded, unit_dirs)
    assert needs_daemon_reload(parse_show("vllm-tiny.service", "NeedDaemonReload=yes\n"), unit_dirs)


def test_drop_ins_of_a_name_prefix_and_of_the_unit_type_count_too(tmp_path):
    """A fleet-wide vllm-.service.d/ (the integration tests' own core binding) is read by systemd for every vllm-*
    unit: a module that did not count it reloaded systemd and said `changed` at every run."""
    assert drop_in_dir_names("vllm-tiny_v2-0.31.0.service") == [
        "vllm-tiny_v2-0.31.0.service.d", "vllm-tiny_v2-.service.d", "vllm-.service.d", "service.d"
    ]  # fmt: skip
    assert drop_in_dir_names("vllm.service") == ["vllm.service.d", "service.d"]
    unit_dirs = (str(tmp_path / "etc"), str(tmp_path / "lib"))
    for path in ("etc/vllm-.service.d/core.conf", "lib/service.d/10-type.conf", "lib/vllm-.service.d/core.conf"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("[Service]\n")
    expected = (str(tmp_path / "etc/vllm-.service.d/core.conf"), str(tmp_path / "lib/service.d/10-type.conf"))
    assert drop_ins_on_disk("vllm-tiny.service", unit_dirs) == expected
    loaded = parse_show("vllm-tiny.service", f"NeedDaemonReload=no\nDropInPaths={' '.join(expected)}\n")
    assert not needs_daemon_reload(loaded, unit_dirs)


def test_reset_failed_of_a_unit_that_is_not_loaded_is_no_error():
    answers = {
        "vllm-new.service": (
            1,
            "",
            "Failed to reset failed state of unit vllm-new.service: Unit vllm-new.service not loaded.",
        ),
        "vllm-odd.service": (1, "", "Access denied"),
    }
    Unit("vllm-new.service", lambda command: answers[command[-1]]).reset_failed()
    with pytest.raises(UnitError, match="Access denied"):
        Unit("vllm-odd.service", lambda command: answers[command[-1]]).reset_failed()


# ---- engine deaths in the journal ------------------------------------------------------------------------

JOURNAL = (Path(__file__).parents[3] / "fixtures" / "journal" / "engine-deaths.json").read_text()
SIGILL = "the engine died: Worker proc VllmWorker-0 died unexpectedly (exit code: -4, SIGILL)"
ENGINE_KILLED = "the engine died: engine core exited unexpectedly"


def test_journal_messages_are_sorted_oldest_first():
    # systemd 252 printed them newest first: --grep with --lines ignores the order.
    messages = journal_messages(JOURNAL)
    assert len(messages) == 16
    assert messages[0].startswith("Started ") and messages[-1].startswith("Stopping ")
    assert "restart counter is at 1" in messages[13]


def test_journal_messages_skip_what_is_not_an_entry_and_decode_bytes():
    lines = (
        '{"__REALTIME_TIMESTAMP": "2", "MESSAGE": [104, 105]}\nnot json\n{"__REALTIME_TIMESTAMP": "1", "MESSAGE": "a"}'
    )
    assert journal_messages(lines) == ["a", "hi"]


@pytest.mark.parametrize(
    ("line", "death"),
    [
        (
            "(EngineCore pid=3732) ERROR 12-02 06:07:53 [multiproc_executor.py:315] Worker proc VllmWorker-0 died"
            " unexpectedly (exit code: -4), shutting down executor.",
            SIGILL,
        ),
        (
            "(EngineCore pid=4125) ERROR 12-02 06:18:10 [multiproc_executor.py:314] Worker proc VllmWorker-0 died"
            " unexpectedly (exit code: None), shutting down executor.",
            "the engine died: Worker proc VllmWorker-0 died unexpectedly (exit code: None)",
        ),
        (
            "(APIServer pid=9) ERROR 12-02 06:18:10 [core_client.py:620] Engine core proc EngineCore_DP0 died"
            " unexpectedly, shutting down client.",
            "the engine died: Engine core proc EngineCore_DP0 died unexpectedly",
        ),
        (
            "(EngineCore pid=3732) ERROR 12-02 06:07:53 [core.py:1512] EngineCore encountered a fatal error.",
            "the engine died: EngineCore encountered a fatal error",
        ),
        ('INFO:     10.88.0.1:43612 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error', None),
    ],
)
def test_engine_death_names_the_process_and_its_signal(line, death):
    assert engine_death(["Started vllm-tiny.service.", line]) == death


def test_engine_death_prefers_the_line_that_names_the_process():
    fatal = "(EngineCore pid=3732) ERROR 12-02 06:07:53 [core.py:1512] EngineCore encountered a fatal error."
    worker = "Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor."
    assert (
        engine_death([fatal, worker])
        == "the engine died: Worker proc VllmWorker-0 died unexpectedly (exit code: -9, SIGKILL)"
    )


@pytest.mark.parametrize(
    ("count", "stopped", "death"),
    [
        (5, False, None),  # three runs, each stopped on request
        (7, True, SIGILL),  # the worker died; the unit stayed down (Restart=on-failure, vLLM exited 0)
        (8, False, SIGILL),  # ... and was started again by hand
        (9, False, None),  # a stop asked for since: that death is history
        (14, False, ENGINE_KILLED),  # the EngineCore killed, systemd restarting the unit
        (15, False, ENGINE_KILLED),  # ... and running again
        (16, False, None),  # a restart asked for; vLLM's engine errors while it stops do not count
        (16, True, None),
    ],
)
def test_last_engine_death_of_runs_that_ended_by_themselves(count, stopped, death):
    assert last_engine_death(journal_messages(JOURNAL)[:count], stopped) == death


def test_unit_reads_the_journal_as_json_and_without_a_match_reports_none():
    calls = []

    def run(command):
        calls.append(command)
        return (0, JOURNAL, "") if len(calls) == 1 else (1, "", "")

    unit = Unit("vllm-tiny.service", run)
    assert unit.last_engine_death(stopped=False) is None  # the fixture ends with a restart asked for
    assert calls[0][:3] == ["journalctl", "--unit", "vllm-tiny.service"] and "json" in calls[0]
    assert unit.last_engine_death(stopped=True) is None  # rc 1: journalctl matched nothing


def test_parse_show_reads_the_restarts():
    assert parse_show("x.service", "NRestarts=2\n").restarts == 2
