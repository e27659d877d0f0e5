# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A systemd unit as systemctl and the cgroup filesystem show it, and the few commands sent to it.

Parsers are pure functions; `Unit` runs systemctl and journalctl through a runner with the signature of
AnsibleModule.run_command (argument list in, `(rc, stdout, stderr)` out).
"""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import dataclass

SHOW_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "MainPID",
    "ExecMainPID",
    "ExecMainCode",
    "ExecMainStatus",
    "ExecMainStartTimestampMonotonic",
    "NeedDaemonReload",
    "ControlGroup",
    "ExecStart",
    "InvocationID",
    "DropInPaths",
    "UnitFileState",
    "ActiveEnterTimestampMonotonic",
    "NRestarts",
)
# Where drop-ins of a unit may lie (NAME.d/*.conf), in systemd's order of precedence.
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system")
# Where systemd's hierarchy is mounted: cgroup v2, the v2 tree of a hybrid host, cgroup v1.
CGROUP_ROOTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup")
# ExecMainCode is a waitid() si_code: how the main process ended.
EXIT_CODES = {"1": "exited", "2": "killed", "3": "dumped"}
STOPPED_STATES = ("inactive", "failed")
ERROR_LINE = re.compile(r"Error|error:|Traceback|Killed|out of memory|OOM|CUDA", re.IGNORECASE)
# vLLM's own log lines below ERROR ("WARNING 12-01 15:45:22 [...]"), which may still name an error: the
# ulimit warning of every start says "failed to automatically increase with error ...".
BELOW_ERROR = re.compile(r"\b(?:DEBUG|INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d\b")
# A traceback's frames, the source lines they echo and their carets, indented after vLLM's process prefix
# ("(EngineCore pid=978) "): "    raise RuntimeError(" names no cause; the exception's own line is not indented.
TRACEBACK_BODY = re.compile(r"^(?:\([\w:]+ pid=\d+\) )?\s")
# vLLM's lines when its engine dies, most telling first: the executor names the process that died and how,
# the engine core says it failed, the API server's client sees the engine core's process gone.
ENGINE_DEATH = (
    re.compile(r"(?:Worker|Engine core) proc \S+ died unexpectedly(?: \(exit code: (?P<code>-?\d+|None)\))?"),
    re.compile(r"EngineCore encountered a fatal error"),
    re.compile(r"engine core exited unexpectedly"),
)
# systemd's own lines about a unit (journalctl -o cat): a run begins, a stop is asked for, a restart follows
# a run that ended by itself.
RUN_STARTED = re.compile(r"^Started \S+\.service\b")
STOP_ASKED = re.compile(r"^Stopping \S+\.service\b")
RESTART_SCHEDULED = re.compile(r"Scheduled restart job")
# What journalctl --grep keeps of a unit's journal for last_engine_death (a PCRE; the three above and
# ENGINE_DEATH's).
ENGINE_HISTORY_GREP = (
    "died unexpectedly|encountered a fatal error|exited unexpectedly|^Started |^Stopping |Scheduled restart job"
)


# The characters systemd allows in a unit name.
UNIT_NAME = re.compile(r"[A-Za-z0-9:_.@\\-]+\Z")


class UnitError(Exception):
    """A systemctl command failed."""


def check_unit_name(name, option: str = "name") -> str:
    """`name` when systemd could know a unit by it; ValueError naming `option` and the value otherwise."""
    if not isinstance(name, str) or not UNIT_NAME.match(name):
        raise ValueError(f"{option} must be a systemd unit name such as vllm-tiny.service, got {name!r}")
    return name


@dataclass(frozen=True)
class UnitState:
    name: str
    load_state: str
    active_state: str
    sub_state: str
    result: str
    main_pid: int
    last_main_pid: int  # ExecMainPID: kept after the main process exits, until the next start
    main_started_us: int  # CLOCK_MONOTONIC microseconds of the last main process's start
    exit_code: str
    exit_status: int
    needs_daemon_reload: bool
    control_group: str
    exec_start: str
    invocation_id: str
    drop_in_paths: tuple[str, ...] = ()
    unit_file_state: str = ""  # enabled, disabled, static, masked, ...; empty when systemd did not say
    active_since_us: int = 0  # CLOCK_MONOTONIC microseconds of the last entry into the active state; 0 if never
    restarts: int = 0  # NRestarts: automatic restarts since reset-failed (which vllm_service runs before a start)

    @property
    def exists(self) -> bool:
        return self.load_state not in ("not-found", "")

    @property
    def stopped(self) -> bool:
        return self.active_state in STOPPED_STATES

    @property
    def crashed(self) -> bool:
        """Failed, or waiting to restart after its main process died: a start has failed."""
        return self.active_state == "failed" or self.sub_state == "auto-restart"

    def outcome(self) -> str:
        """How the last main process ended, in systemd's words: `result exit-code, status=1/exited`."""
        how = EXIT_CODES.get(self.exit_code, self.exit_code or "unknown")
        return f"result {self.result}, main process {how} with status {self.exit_status}"

    def as_dict(self) -> dict:
        return {"active_state": self.active_state, "sub_state": self.sub_state, "result": self.result}


def parse_show(name: str, text: str) -> UnitState:
    """`systemctl show -p ...` output (KEY=value lines) as a UnitState."""
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def number(key):
        try:
            return int(values.get(key) or 0)
        except ValueError:
            return 0

    return UnitState(
        name=name,
        load_state=values.get("LoadState", ""),
        active_state=values.get("ActiveState", ""),
        sub_state=values.get("SubState", ""),
        result=values.get("Result", ""),
        main_pid=number("MainPID"),
        last_main_pid=number("ExecMainPID"),
        main_started_us=number("ExecMainStartTimestampMonotonic"),
        exit_code=values.get("ExecMainCode", ""),
        exit_status=number("ExecMainStatus"),
        needs_daemon_reload=values.get("NeedDaemonReload") == "yes",
        control_group=values.get("ControlGroup", ""),
        exec_start=values.get("ExecStart", ""),
        invocation_id=values.get("InvocationID", ""),
        drop_in_paths=tuple(values.get("DropInPaths", "").split()),
        unit_file_state=values.get("UnitFileState", ""),
        active_since_us=number("ActiveEnterTimestampMonotonic"),
        restarts=number("NRestarts"),
    )


def drop_in_dir_names(name: str) -> list[str]:
    """The drop-in directories that systemd reads for a unit, the most specific first: NAME.d, then one for each
    dash-prefix of the name (vllm-tiny-b.service: vllm-tiny-.service.d, vllm-.service.d), then the unit type's."""
    stem, _dot, unit_type = name.rpartition(".")
    parts = stem.split("-")
    prefixes = ["-".join(parts[:count]) + "-." + unit_type + ".d" for count in range(len(parts) - 1, 0, -1)]
    return [name + ".d", *prefixes, unit_type + ".d"]


def drop_ins_on_disk(name: str, unit_dirs: tuple[str, ...] = UNIT_DIRS) -> tuple[str, ...]:
    """The drop-in files of a unit as they are on disk now; of several with one file name, systemd reads one."""
    found = {}
    for dir_name in drop_in_dir_names(name):
        for directory in unit_dirs:
            drop_in_dir = os.path.join(directory, dir_name)
            if os.path.isdir(drop_in_dir):
                for entry in sorted(os.listdir(drop_in_dir)):
                    if entry.endswith(".conf"):
                        found.setdefault(entry, os.path.join(drop_in_dir, entry))
    return tuple(sorted(found.values()))


def needs_daemon_reload(state: UnitState, unit_dirs: tuple[str, ...] = UNIT_DIRS) -> bool:
    """Whether systemd's loaded idea of the unit is stale: its files changed, or drop-ins came or went.

    systemd 252 sets NeedDaemonReload only for files it already knows, not for a drop-in added since.
    """
    return state.needs_daemon_reload or drop_ins_on_disk(state.name, unit_dirs) != tuple(sorted(state.drop_in_paths))


def exec_start_argv(exec_start: str) -> list[str]:
    """The argv of the first ExecStart= command from systemctl show's `{ path=... ; argv[]=... ; ... }`."""
    found = re.search(r"argv\[\]=(.*?) ; ", exec_start)
    return found.group(1).split() if found else []


def without_flags(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """An argument list without `flags`, each with its value (`--flag VALUE` or `--flag=VALUE`)."""
    kept, skip_value = [], False
    for arg in argv:
        if skip_value:
            skip_value = False
        elif arg.split("=", 1)[0] in flags:
            skip_value = "=" not in arg
        else:
            kept.append(arg)
    return kept


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of `--flag VALUE` or `--flag=VALUE` in an argument list; the last one wins, as in argparse."""
    value = None
    for position, arg in enumerate(argv):
        if arg == flag and position + 1 < len(argv):
            value = argv[position + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def cgroup_pids(control_group: str, roots: tuple[str, ...] = CGROUP_ROOTS) -> list[int]:
    """PIDs in a unit's cgroup and its sub-cgroups; [] when the cgroup is gone (systemd removes it when empty)."""
    if not control_group:
        return []
    for root in roots:
        top = root + control_group
        if os.path.isdir(top):
            pids = set()
            for directory, _dirs, files in os.walk(top):
                if "cgroup.procs" in files:
                    try:
                        with open(os.path.join(directory, "cgroup.procs")) as procs:
                            pids.update(int(pid) for pid in procs.read().split())
                    except FileNotFoundError:  # removed while walking
                        continue
            return sorted(pids)
    return []


def error_lines(lines: list[str], limit: int = 12) -> list[str]:
    """The distinct lines that look like errors, oldest first: the first of them is usually the cause."""
    seen, found = set(), []
    for line in lines:
        told = ERROR_LINE.search(line) and not BELOW_ERROR.search(line) and not TRACEBACK_BODY.match(line)
        if told and line not in seen:
            seen.add(line)
            found.append(line)
    return found[:limit]


def _signal_name(code: str | None) -> str:
    """`-4` (a child killed by signal 4, as Python reports it) as `-4, SIGILL`; other codes as they are."""
    if code and code.startswith("-") and code[1:].isdigit():
        try:
            return f"{code}, {signal.Signals(int(code[1:])).name}"
        except ValueError:
            pass
    return code or ""


def engine_death(lines: list[str]) -> str | None:
    """`the engine died: ...` from the most telling of vLLM's engine-death lines among `lines`; None without one."""
    for pattern in ENGINE_DEATH:
        for line in lines:
            found = pattern.search(line)
            if found:
                text = found.group(0)
                if found.groupdict().get("code"):
                    text = text.replace(
                        f"exit code: {found.group('code')}", f"exit code: {_signal_name(found.group('code'))}"
                    )
                return f"the engine died: {text}"
    return None


def last_engine_death(lines: list[str], stopped: bool) -> str | None:
    """How the engine died in the newest run that ended by itself, since the last stop that was asked for.

    `lines` are a unit's journal lines, oldest first, as journalctl --grep ENGINE_HISTORY_GREP keeps them;
    `stopped` says whether the unit is stopped now (its last run ended without a restart). vLLM logs engine
    errors while it stops on request too: those runs are not counted.
    """
    death, run, stopping = None, [], False
    for line in lines:
        if STOP_ASKED.search(line):
            death, run, stopping = None, [], True
        elif RUN_STARTED.search(line) or RESTART_SCHEDULED.search(line):  # the run before has ended
            death, run, stopping = engine_death(run) or death, [], False
        elif not stopping:
            run.append(line)
    if stopped and not stopping:
        death = engine_death(run) or death
    return death


def journal_messages(json_lines: str) -> list[str]:
    """The messages of `journalctl --output json` entries, oldest first.

    Sorted by their time: systemd 252 prints `--grep` with `--lines` newest first, even with `--reverse`.
    """
    return [message for _time, message in journal_entries(json_lines)]


def journal_entries(json_lines: str) -> list[tuple[int, str]]:
    """(microseconds since the epoch at which journald received it, message) of each `journalctl --output json`
    entry, oldest first."""
    entries = []
    for line in json_lines.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # journald keeps a message that is not UTF-8 as its bytes
            message = bytes(message).decode("utf-8", "replace")
        if isinstance(message, str):
            entries.append((int(entry.get("__REALTIME_TIMESTAMP") or 0), message))
    return sorted(entries, key=lambda entry: entry[0])


class Unit:
    """systemctl and journalctl for one unit."""

    def __init__(self, name: str, run_command):
        self.name = name
        self._run = run_command

    def _systemctl(self, *args: str) -> str:
        rc, out, err = self._run(["systemctl", *args])
        if rc != 0:
            raise UnitError(f"systemctl {' '.join(args)} failed (rc {rc}): {(err or out).strip()}")
        return out

    def state(self) -> UnitState:
        return parse_show(self.name, self._systemctl("show", self.name, "-p", ",".join(SHOW_PROPERTIES)))

    def pids(self, state: UnitState) -> list[int]:
        """The processes of the unit's cgroup (as `state` named it)."""
        return cgroup_pids(state.control_group)

    def daemon_reload(self):
        self._systemctl("daemon-reload")

    def reset_failed(self):
        # A unit that systemd has not kept loaded (never started, or unloaded since) has nothing to reset.
        rc, out, err = self._run(["systemctl", "reset-failed", self.name])
        if rc != 0 and "not loaded" not in err:
            raise UnitError(f"systemctl reset-failed {self.name} failed (rc {rc}): {(err or out).strip()}")

    def start(self):
        # --no-block: the module watches the start itself, so that a crash fails it at once.
        self._systemctl("start", "--no-block", self.name)

    def stop(self):
        self._systemctl("stop", "--no-block", self.name)

    def journal(self, invocation_id: str, lines: int) -> list[str]:
        """The journal lines of one run of the unit: its processes' output and systemd's lines about it.

        Only that run's lines: the shutdown messages of the run before a restart are not the failure.
        """
        matches = [f"_SYSTEMD_INVOCATION_ID={invocation_id}", "+", f"INVOCATION_ID={invocation_id}"]
        command = ["journalctl", *matches, "--lines", str(lines), "--no-pager", "--output", "cat"]
        rc, out, _err = self._run(command)
        return out.splitlines() if rc == 0 else []

    def journal_since(self, invocation_id: str, since: float) -> list[str] | None:
        """The messages of one run of the unit that journald received at `since` (seconds since the epoch) or
        later, oldest first; None when the journal cannot be read."""
        command = ["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation_id}", "--since", f"@{int(since)}"]
        rc, out, _err = self._run([*command, "--no-pager", "--output", "json", "--output-fields", "MESSAGE"])
        if rc != 0:
            return None
        return [message for received, message in journal_entries(out) if received >= since * 1_000_000]

    def last_engine_death(self, stopped: bool, lines: int = 60) -> str | None:
        """last_engine_death() over the unit's journal: only the lines that tell runs and engine deaths apart."""
        command = ["journalctl", "--unit", self.name, "--grep", ENGINE_HISTORY_GREP, "--lines", str(lines)]
        rc, out, _err = self._run([*command, "--no-pager", "--output", "json", "--output-fields", "MESSAGE"])
        # rc 1: nothing matched.
        return last_engine_death(journal_messages(out), stopped) if rc == 0 else None
