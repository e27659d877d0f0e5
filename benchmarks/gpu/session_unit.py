# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A vLLM server in a process session of its own, standing in for its systemd unit where there is no systemd.

The GPU machine has no systemd (PID 1 is not systemd there). `SessionUnit` answers what
`llmops.vllm`'s `Lifecycle` (plugins/module_utils/service/lifecycle.py) asks of a `Unit`, so that the collection's
own start, readiness, stop and orphan code runs against a real CUDA process tree:

- the unit's cgroup is the server's session (`setsid`): vLLM's engine core and workers stay in the session
  of the main process, as they stay in the unit's cgroup, even once orphaned;
- `stop()` sends SIGTERM to the main process alone, as `KillMode=mixed` does; once the main process has
  exited, what is left of the session gets SIGKILL, as systemd gives it to what is left of the cgroup
  (`kill_mode="process"` leaves it, as `KillMode=process` does);
- the journal is the server's own output, written to a log file.

What it cannot stand in for: a process that leaves the session (`setsid` again) would leave a cgroup only by
being moved; vLLM's processes do neither.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

COLLECTION = Path(__file__).resolve().parents[2]


def import_collection():
    """Make `ansible_collections.llmops.vllm` importable as this checkout (Ansible's layout of collections)."""
    root = COLLECTION / ".build" / "collections"
    link = root / "ansible_collections" / "llmops" / "vllm"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(COLLECTION)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return str(root)


import_collection()

# pylint: disable=wrong-import-position
from ansible_collections.llmops.vllm.plugins.module_utils.service.processes import (  # noqa: E402
    list_processes,
    read_process,
    still_running,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import UnitState, engine_death  # noqa: E402


class SessionUnit:
    """One server: `argv` run with `env`, its output in `log_path`, in a session of its own."""

    def __init__(self, name: str, argv: list[str], env: dict, log_path: str, kill_mode="mixed", proc="/proc"):
        self.name = name
        self.kill_mode = kill_mode
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.proc = proc
        self.popen: subprocess.Popen | None = None
        self.leader = None  # the main process as /proc showed it at the start (its PID is the session's ID)
        self.starts = 0
        self.sigterm_at = None  # time.monotonic() of the last stop's SIGTERM
        self.run_starts_at = 0  # the first line of the current run in the log

    # ---- what Lifecycle asks of a unit ----------------------------------------------------------------------

    def start(self):
        self.run_starts_at = len(self.log_lines())
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(  # pylint: disable=consider-using-with
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.starts += 1
        self.leader = read_process(self.popen.pid, self.proc)

    def stop(self):
        if self._main_running():
            os.kill(self.popen.pid, signal.SIGTERM)
            self.sigterm_at = time.monotonic()

    def reset_failed(self):
        """systemd's start limit has no stand-in here."""

    def state(self) -> UnitState:
        running = self._main_running()
        if not running and self.kill_mode == "mixed":
            self._kill_leftovers()
        exit_code, exit_status, failed = "", 0, False
        if self.popen is not None and self.popen.returncode is not None:
            rc = self.popen.returncode
            exit_code, exit_status = ("2", -rc) if rc < 0 else ("1", rc)
            failed = rc != 0
        argv = " ".join(self.argv)
        return UnitState(
            name=self.name,
            load_state="loaded",
            active_state="active" if running else ("failed" if failed else "inactive"),
            sub_state="running" if running else ("failed" if failed else "dead"),
            result="exit-code" if failed else "success",
            main_pid=self.popen.pid if running else 0,
            last_main_pid=self.popen.pid if self.popen else 0,
            # Both since boot, as find_orphans compares them with the processes' start times.
            main_started_us=int(self.leader.start_ticks / os.sysconf("SC_CLK_TCK") * 1e6) if self.leader else 0,
            exit_code=exit_code,
            exit_status=exit_status,
            needs_daemon_reload=False,
            control_group="",
            exec_start=f"{{ path={self.argv[0]} ; argv[]={argv} ; }}",
            invocation_id=str(self.starts),
        )

    def pids(self, state: UnitState) -> list[int]:  # pylint: disable=unused-argument
        """The processes of the session that are still running (the cgroup lists no finished process)."""
        if self.leader is None:
            return []
        return [
            process.pid
            for process in list_processes(self.proc)
            if process.session == self.leader.pid and still_running(process, self.proc)
        ]

    def journal(self, invocation_id: str, lines: int) -> list[str]:  # pylint: disable=unused-argument
        return self.log_lines()[-lines:]

    def journal_since(self, invocation_id: str, since: float) -> list[str]:  # pylint: disable=unused-argument
        """The output of the current run: a log file has no time for each line."""
        return self.log_lines()[self.run_starts_at :]

    def last_engine_death(self, stopped: bool) -> str | None:
        return engine_death(self.log_lines()) if stopped else None

    # ---- helpers ------------------------------------------------------------------------------------------

    def log_lines(self) -> list[str]:
        try:
            return Path(self.log_path).read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return []

    def _main_running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def _kill_leftovers(self):
        """What systemd does once the main process of a KillMode=mixed unit has exited: SIGKILL the rest."""
        for pid in self.pids(None):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def kill_session(self):
        """End everything this unit started, whatever a scenario did (the harness's own clean-up)."""
        if self._main_running():
            os.kill(self.popen.pid, signal.SIGKILL)
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)
        self._kill_leftovers()
