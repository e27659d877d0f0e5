import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.common.wait import wait_for
from ansible_collections.llmops.vllm.plugins.module_utils.service.processes import (
    Process,
    catches_signal,
    is_vllm,
    list_processes,
    parse_stat,
    read_process,
    still_running,
    terminate,
    unit_of,
)


def test_parse_stat_takes_the_name_up_to_the_last_parenthesis():
    text = "4242 (VLLM::Worker (TP0)) S 4200 4242 4100 0 -1 4194560 " + " ".join(["0"] * 12) + " 987654 0 0\n"
    assert parse_stat(text) == {"name": "VLLM::Worker (TP0)", "ppid": 4200, "session": 4100, "start_ticks": 987654}


@pytest.mark.parametrize(
    ("cgroup", "unit"),
    [
        ("0::/system.slice/vllm-tiny.service\n", "vllm-tiny.service"),
        # Inside a container the path starts with the container's scope; the unit is the innermost one.
        ("0::/machine.slice/libpod-ab12.scope/system.slice/vllm-tiny.service\n", "vllm-tiny.service"),
        ("0::/system.slice/vllm-tiny.service/payload\n", "vllm-tiny.service"),
        # cgroup v1 only: systemd's named hierarchy says where the process is.
        ("12:memory:/\n1:name=systemd:/system.slice/vllm-big.service\n0::/\n", "vllm-big.service"),
        ("0::/user.slice/user-0.slice/session-4.scope\n", "session-4.scope"),
        ("0::/\n", None),
        ("", None),
    ],
)
def test_unit_of(cgroup, unit):
    assert unit_of(cgroup) == unit


def test_read_process_describes_this_process():
    me = read_process(os.getpid())
    assert me.pid == os.getpid() and me.ppid == os.getppid() and me.uid == os.getuid()
    assert sys.executable.rsplit("/", 1)[-1][:6] in me.cmdline
    assert me.pid in [process.pid for process in list_processes()]


def test_read_process_of_a_gone_process_is_none():
    child = subprocess.Popen(["true"])
    child.wait()
    assert read_process(child.pid) is None


@pytest.mark.parametrize(
    ("name", "cmdline", "unit", "expected"),
    [
        ("VLLM::EngineCore", "VLLM::EngineCore", None, True),
        ("python", "/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server --model /m", None, True),
        ("python3", "/usr/bin/python3 -m http.server", None, False),
        # A process just started or ending may show an empty command line for a moment: its name and its cgroup
        # still say what it is (comm is 15 characters at most).
        ("VLLM::EngineCor", "", None, True),
        ("vllm", "", None, True),
        ("python3", "", "vllm-tiny.service", True),
        ("python3", "", None, False),
        ("python3", "", "ssh.service", False),
    ],
)
def test_is_vllm(name, cmdline, unit, expected):
    process = Process(pid=1, ppid=0, session=1, uid=0, start_ticks=1, name=name, cmdline=cmdline, unit=unit)
    assert is_vllm(process) is expected


def _spawn(code):
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"ready\n"
    return child, read_process(child.pid)


def test_terminate_stops_with_sigterm_when_the_process_obeys():
    child, process = _spawn("import time; print('ready', flush=True); time.sleep(60)")
    report = terminate([process], grace=5)
    assert report["terminated"] == [child.pid] and report["killed"] == [] and report["survivors"] == []
    assert child.wait(timeout=5) == -signal.SIGTERM


def test_terminate_escalates_to_sigkill_after_the_grace_time():
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    child, process = _spawn(code)
    started = time.monotonic()
    report = terminate([process], grace=0.5)
    assert report["killed"] == [child.pid] and report["terminated"] == [] and report["survivors"] == []
    assert 0.5 <= time.monotonic() - started < 3
    assert child.wait(timeout=5) == -signal.SIGKILL


def test_a_reused_pid_is_not_the_same_process():
    child, process = _spawn("import time; print('ready', flush=True); time.sleep(60)")
    impostor = Process(**{**process.as_dict(), "start_ticks": process.start_ticks + 1})
    assert still_running(process) and not still_running(impostor)
    # terminate() leaves the impostor's PID alone: the real process keeps running.
    assert terminate([impostor], grace=0.1)["killed"] == []
    assert child.poll() is None
    child.kill()
    child.wait()


def test_a_process_whose_leader_exited_runs_until_its_last_thread_ends():
    # The main thread leaves with pthread_exit: the kernel shows the process as a zombie (Z) while the
    # other thread still runs, as a killed vLLM worker does while it unmaps its memory.
    code = (
        "import ctypes, sys, threading\n"
        "threading.Thread(target=sys.stdin.read).start()\n"
        "print('ready', flush=True)\n"
        "ctypes.CDLL(None).pthread_exit(None)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"ready\n"
    process = read_process(child.pid)
    wait_for(lambda: (_state(child.pid) == "Z", None), timeout=5, interval=0.01)
    assert _state(child.pid) == "Z" and still_running(process)
    child.stdin.close()  # the thread's read ends, and the process with it
    child.wait(timeout=5)
    assert not still_running(process)


def _state(pid):
    with open(f"/proc/{pid}/stat") as stat_file:
        text = stat_file.read()
    return text[text.rindex(")") + 2]


def test_a_command_line_that_cannot_be_read_is_empty(monkeypatch):
    # As under hidepid=, where another user's cmdline is refused while its stat and cgroup stay readable.
    real_open = open

    def guarded_open(path, *args, **kwargs):
        if str(path).endswith("/cmdline"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", guarded_open)
    process = read_process(os.getpid())
    assert process.cmdline == "" and process.pid == os.getpid()


def test_catches_signal_reads_the_handled_mask_of_a_process(tmp_path):
    # SigCgt as /proc shows it: bit N-1 for signal N. 0x802: SIGINT (2) and SIGUSR2 (12).
    (tmp_path / "41").mkdir()
    (tmp_path / "41" / "status").write_text("Name:\tpython3\nSigBlk:\t0000000000000000\nSigCgt:\t0000000000000802\n")
    assert catches_signal(41, signal.SIGUSR2, str(tmp_path))
    assert catches_signal(41, signal.SIGINT, str(tmp_path))
    assert not catches_signal(41, signal.SIGUSR1, str(tmp_path))
    assert not catches_signal(42, signal.SIGUSR2, str(tmp_path)), "a process that is gone catches nothing"


def test_catches_signal_sees_a_handler_installed_in_this_process():
    before = signal.signal(signal.SIGUSR2, lambda *_: None)
    try:
        assert catches_signal(os.getpid(), signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR2, before)
    assert catches_signal(os.getpid(), signal.SIGUSR2) == callable(before)
