"""The guard of a multi-host group's member (roles/vllm_server/files): when each member restarts, and who a rank is.

The guards beside real members, healing a group after a killed engine, a killed head and a hung worker, are in
tests/integration/test_group.py.
"""

import importlib.util
import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROLES = Path(__file__).resolve().parents[3] / "roles"
GUARD = ROLES / "vllm_server" / "files" / "llmops_vllm_group_guard.py"
# The guard imports the servers' middleware from the venv, where the install role puts it.
sys.path.insert(0, str(ROLES / "vllm_install" / "files"))
SPEC = importlib.util.spec_from_file_location("llmops_vllm_group_guard", GUARD)
guard = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(guard)

ANSWERED = {0: None, 1: None}
RANK_1_SILENT = {0: None, 1: "no answer (timed out)"}


def test_the_head_restarts_when_a_rank_fails_the_checks_in_a_row_after_the_group_served():
    watch = guard.HeadWatch(["host-a", "host-b"], failures=2)
    assert watch.observe(True, "run-1", ANSWERED) is None
    assert watch.observe(True, "run-1", RANK_1_SILENT) is None
    reason = watch.observe(True, "run-1", RANK_1_SILENT)
    assert reason == "1 of 2 data parallel rank(s) failed 2 checks in a row (rank 1 on host-b: no answer (timed out))"
    # The count starts again: the restart gets its own checks.
    assert watch.observe(True, "run-1", RANK_1_SILENT) is None


def test_a_rank_that_answers_between_two_failures_resets_the_count():
    watch = guard.HeadWatch(["host-a", "host-b"], failures=2)
    for errors in (ANSWERED, RANK_1_SILENT, ANSWERED, RANK_1_SILENT):
        assert watch.observe(True, "run-1", errors) is None


def test_a_head_that_has_not_served_since_its_start_is_left_to_its_start():
    watch = guard.HeadWatch(["host-a", "host-b"], failures=1)
    assert watch.observe(True, "run-1", ANSWERED) is None
    # systemd restarted it: the group forms again, its ranks failing until the workers join.
    for _check in range(5):
        assert watch.observe(True, "run-2", {0: "no answer (refused)", 1: "no answer (refused)"}) is None
    assert watch.observe(True, "run-2", ANSWERED) is None
    assert watch.observe(True, "run-2", RANK_1_SILENT) is not None


def test_a_stopped_head_is_never_restarted():
    watch = guard.HeadWatch(["host-a", "host-b"], failures=1)
    assert watch.observe(True, "run-1", ANSWERED) is None
    assert watch.observe(False, "run-1", {}) is None
    assert watch.observe(True, "run-1", RANK_1_SILENT) is None


def test_a_worker_restarts_when_a_head_that_answered_stops_answering():
    watch = guard.WorkerWatch(failures=2)
    assert watch.observe(True, "w-1", "no answer (refused)") is None  # the head loads: not joined yet
    assert watch.observe(True, "w-1", None) is None
    assert watch.observe(True, "w-1", "no answer (refused)") is None
    reason = watch.observe(True, "w-1", "no answer (refused)")
    assert reason.startswith("the head stopped answering (no answer (refused))")
    # Restarted, it waits for the head's next start without a second restart.
    for _check in range(5):
        assert watch.observe(True, "w-2", "no answer (refused)") is None


def test_a_stopped_worker_is_never_restarted():
    watch = guard.WorkerWatch(failures=1)
    assert watch.observe(True, "w-1", None) is None
    assert watch.observe(False, "w-1", None) is None
    assert watch.observe(True, "w-1", "HTTP 503") is None


@pytest.mark.parametrize(
    ("group", "hosts"),
    [
        ({"hosts": ["a", "b"], "data_parallel_size": 2}, ["a", "b"]),
        ({"hosts": ["a", "b"], "data_parallel_size": 4}, ["a", "a", "b", "b"]),
        # One replica over both hosts (tensor or pipeline parallel across them): its one rank is the whole group's.
        ({"hosts": ["a", "b"], "data_parallel_size": 1}, ["a, b"]),
    ],
)
def test_each_rank_is_named_by_its_host(group, hosts):
    assert guard.rank_hosts(group) == hosts


class Server(BaseHTTPRequestHandler):
    """An API server whose rank 1 answers 500; it records what each request carried."""

    seen: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.headers["Authorization"], self.headers[guard.RANK_HEADER], body["max_tokens"]))
        self.send_response(500 if self.headers[guard.RANK_HEADER] == "1" else 200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def test_each_rank_gets_a_one_token_completion_with_the_key_and_its_failure_is_named():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert guard.rank_errors(url, "tiny", "sk-1", 2, timeout=5) == {0: None, 1: "HTTP 500"}
        assert sorted(Server.seen) == [("Bearer sk-1", "0", 1), ("Bearer sk-1", "1", 1)]
        server.shutdown()
        server.server_close()
        assert guard.rank_errors(url, "tiny", "sk-1", 1, timeout=5)[0].startswith("no answer")
    finally:
        server.server_close()


def test_bad_settings_are_refused(capsys):
    with pytest.raises(SystemExit):
        guard.arguments(["--record", "/etc/vllm/tiny.json", "--state", "/var/lib/g/tiny.json", "--failures", "0"])
    assert "--failures at least 1" in capsys.readouterr().err


def test_the_ledger_starts_every_cause_at_zero_and_keeps_its_restarts_across_the_guard_s_restarts(tmp_path):
    state = tmp_path / "pair.json"
    ledger = guard.Ledger(str(state), "head", ["host-a", "host-b"])
    assert ledger.restarts == {"host-a": 0, "host-b": 0}
    ledger.restarted(["host-b"])
    ledger.restarted(["host-b"])
    again = guard.Ledger(str(state), "head", ["host-a", "host-b"])
    assert again.restarts == {"host-a": 0, "host-b": 2}
    # A state file that is not the guard's is counted from zero, never a crash.
    state.write_text("[1, 2]")
    assert guard.Ledger(str(state), "head", ["host-a"]).restarts == {"host-a": 0}


def test_the_ledger_exports_the_member_each_rank_and_the_restarts_by_cause(tmp_path):
    ledger = guard.Ledger(str(tmp_path / "pair.json"), "head", ["host-a", "host-b"])
    ledger.checked(True, {0: ("host-a", True), 1: ("host-b", False)})
    ledger.restarted(["host-b"])
    samples = [line for line in ledger.text().splitlines() if not line.startswith("#")]
    assert samples == [
        'llmops_vllm_group_member_active{role="head"} 1',
        'llmops_vllm_group_rank_computes{rank="0",rank_host="host-a"} 1',
        'llmops_vllm_group_rank_computes{rank="1",rank_host="host-b"} 0',
        'llmops_vllm_group_restarts_total{role="head",failed_host="host-a"} 0',
        'llmops_vllm_group_restarts_total{role="head",failed_host="host-b"} 1',
    ]
    # A stopped member: no rank is claimed to compute or to fail.
    ledger.checked(False)
    assert "rank=" not in ledger.text() and 'llmops_vllm_group_member_active{role="head"} 0' in ledger.text()


def test_promtool_reads_the_guard_s_metrics(promtool, tmp_path):
    ledger = guard.Ledger(str(tmp_path / "pair.json"), "worker", ["host-a"])
    ledger.checked(True)
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=ledger.text(), capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_metrics_answer_the_host_itself_on_metrics_alone(tmp_path):
    ledger = guard.Ledger(str(tmp_path / "pair.json"), "worker", ["host-a"])
    server = guard.metrics_server(ledger, "127.0.0.1", 0, readers_file=str(tmp_path / "readers"))
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        status, body = get(f"{url}/metrics")
        assert status == 200 and 'llmops_vllm_group_restarts_total{role="worker",failed_host="host-a"} 0' in body
        assert get(f"{url}/other")[0] == 404
    finally:
        server.shutdown()
        server.server_close()
