"""Lifecycle.stop against real processes and real sockets, with a process session for the unit's cgroup.

A stand-in server forks an engine child titled VLLM::EngineCore and takes one connection. At SIGTERM its
engine exits; then the server either keeps the connection open and waits (as vLLM's API server does for
streams that nothing will finish) or closes it and exits. The real server under systemd is the
integration test's (tests/integration/test_service.py); this is the state machine.
"""

import importlib.util
import socket
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.service.lifecycle import (
    ACCOUNTED,
    CUT_OFF_MARK,
    ENGINE_EXIT_GRACE,
    Lifecycle,
    Settings,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.processes import (
    is_engine,
    open_connections,
    read_process,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.serve_command import CUT_OFF_ACCOUNTING

SESSION_UNIT = Path(__file__).resolve().parents[5] / "benchmarks" / "gpu" / "session_unit.py"
SPEC = importlib.util.spec_from_file_location("session_unit", SESSION_UNIT)
session_unit = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(session_unit)

# argv: PORT MODE ACCOUNT MARK ACCOUNTED. The engine child's command line starts with VLLM::EngineCore, as vLLM's
# does. The first connection stands for a stream in flight; any later one (the module's /metrics) gets a 404. With
# ACCOUNT "answers", SIGUSR2 makes the server write that stream as CutOffRequests does when a stop asks for the
# requests still open (MARK and ACCOUNTED are its lines' beginnings).
SERVER = r"""
import os, signal, socket, sys, threading, time
port, mode, account, mark, accounted = int(sys.argv[1]), *sys.argv[2:6]
listener = socket.create_server(("127.0.0.1", port))
engine = os.fork()
if engine == 0:
    os.execv(sys.executable, ["VLLM::EngineCore", "-c", "import time; time.sleep(600)"])
streams = []

def accept():
    while True:
        connection, _address = listener.accept()
        if streams:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            connection.close()
        else:
            streams.append((connection, time.time()))

def write_still_open(*_):
    for _connection, started in streams:
        print(f"{mark} POST /v1/completions (still open, status 200, 3 body messages, finish reason none) "
              f"started {started:.3f}", flush=True)
    print(f"{accounted} {len(streams)}", flush=True)

if account == "answers":
    signal.signal(signal.SIGUSR2, write_still_open)
threading.Thread(target=accept, daemon=True).start()
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
while not stopping:
    time.sleep(0.02)
os.kill(engine, signal.SIGTERM)
os.waitpid(engine, 0)
if mode == "hang":
    time.sleep(600)
for connection, _started in streams:
    connection.close()
"""


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def stand_in(tmp_path):
    units = []

    def start(mode, account=None):
        """The stand-in in `mode` (hang, close); with `account` (answers, deaf), its command line names the
        collection's CutOffRequests middleware, and the server answers SIGUSR2 or does not catch it."""
        port = free_port()
        server = tmp_path / "server.py"
        server.write_text(SERVER)
        argv = [sys.executable, str(server), str(port), mode, str(account), CUT_OFF_MARK, ACCOUNTED]
        argv += ["--port", str(port)]
        if account:
            argv += ["--middleware", CUT_OFF_ACCOUNTING]
        unit = session_unit.SessionUnit("vllm-standin", argv, {}, str(tmp_path / "log"))
        unit.start()
        deadline = time.monotonic() + 10
        client = None
        while client is None:
            try:
                client = socket.create_connection(("127.0.0.1", port))
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, "the stand-in did not listen"
                time.sleep(0.02)
        # The engine child runs under its own title: forked and not yet exec'd, it would pass for the API server.
        while not any(is_engine(process) for process in map(read_process, unit.pids(None)) if process):
            assert time.monotonic() < deadline, "the stand-in's engine did not start"
            time.sleep(0.02)
        units.append((unit, client))
        return unit, Settings(url=f"http://127.0.0.1:{port}", stop_timeout=20, poll_interval=0.05)

    yield start
    for unit, client in units:
        client.close()
        unit.kill_session()


def test_an_api_server_that_outlives_its_engine_is_killed_within_two_seconds(stand_in):
    unit, settings = stand_in("hang")
    before = unit.state()
    stop = Lifecycle(unit, settings).stop(before)
    hang = stop["api_server_hang"]
    assert hang == {**hang, "main_pid": before.main_pid, "connections": 1}
    assert ENGINE_EXIT_GRACE <= hang["killed_after"] - hang["engine_exited"] < 2.0
    assert stop["escalated"] and stop["cgroup_empty"] and stop["elapsed"] < 5
    assert unit.popen.returncode == -9


def test_a_server_asked_before_the_kill_counts_its_open_stream_exactly(stand_in):
    unit, settings = stand_in("hang", account="answers")
    stop = Lifecycle(unit, settings).stop(unit.state())
    assert stop["escalated"] and stop["api_server_hang"]["connections"] == 1
    assert (stop["aborted_requests"], stop["aborted_requests_bound"], stop["refused_requests"]) == (1, "exact", 0)
    assert f"{ACCOUNTED} 1" in unit.log_lines()


def test_a_server_that_cannot_answer_is_not_sent_the_signal_and_its_connections_are_an_estimate(stand_in):
    unit, settings = stand_in("hang", account="deaf")
    stop = Lifecycle(unit, settings).stop(unit.state())
    assert (stop["aborted_requests"], stop["aborted_requests_bound"]) == (1, "estimate")
    # Killed by the module's SIGKILL, not by a SIGUSR2 it does not catch.
    assert unit.popen.returncode == -9 and not any(line.startswith(ACCOUNTED) for line in unit.log_lines())


def test_a_server_that_closes_its_connections_and_exits_is_left_to_exit(stand_in):
    unit, settings = stand_in("close")
    stop = Lifecycle(unit, settings).stop(unit.state())
    assert stop["api_server_hang"] is None and not stop["escalated"] and stop["terminate"]["stopped"]
    assert unit.popen.returncode == 0


def test_is_engine_tells_the_engine_from_the_api_server(stand_in):
    unit, _settings = stand_in("close")
    processes = [read_process(pid) for pid in unit.pids(None)]
    assert [process.pid for process in processes if is_engine(process)] != [unit.popen.pid]
    assert sorted(is_engine(process) for process in processes) == [False, True]


# /proc/net/tcp of a host where vLLM listens on 8000 (0x1F40), one client is connected, one connection is
# closing (TIME_WAIT, kept by the kernel) and another server listens on 22.
TCP_TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000   999        0 1061 1
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1062 1
   2: 0100007F:1F40 0100007F:D5DE 01 002AD7A0:00000000 01:00000014 00000000   999        0 1063 1
   3: 0100007F:1F40 0100007F:D5E0 06 00000000:00000000 03:00000DF4 00000000     0        0 0 3
   4: 0100007F:D5DE 0100007F:1F40 01 00000000:00001896 00:00000000 00000000     0        0 1064 1
"""


def test_open_connections_counts_a_ports_connections_but_not_its_listener_or_closed_ones():
    assert open_connections(TCP_TABLE, 8000) == 1
    assert open_connections(TCP_TABLE, 22) == 0
    assert open_connections("  sl  local_address\n", 8000) == 0
