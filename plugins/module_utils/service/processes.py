# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Processes as /proc shows them: which systemd unit each belongs to, which are vLLM's, ending them.

Everything is read from world-readable files (stat, comm, cmdline, cgroup), so it works for root inside
a container without CAP_SYS_PTRACE, where other users' /proc/PID/environ cannot be read.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import asdict, dataclass

from ansible_collections.llmops.vllm.plugins.module_utils.common.wait import wait_for

PROC = "/proc"
# vLLM names its helper processes with setproctitle: VLLM::EngineCore, VLLM::Worker_TP0, VLLM::APIServer.
VLLM_TITLE = re.compile(r"^VLLM::")
API_SERVER_TITLE = "VLLM::APIServer"
# States of /proc/net/tcp rows (include/net/tcp_states.h), in hex: a listening socket, and a closed one that
# the kernel keeps for a while without any process.
TCP_LISTEN = "0A"
TCP_TIME_WAIT = "06"
UNIT_SUFFIXES = (".service", ".scope")
# The units of the collection's vLLM instances are vllm-INSTANCE.service.
VLLM_UNIT_PREFIX = "vllm-"


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    session: int
    uid: int
    start_ticks: int  # since boot; with the PID it names one process, even after the PID is reused
    name: str
    cmdline: str
    unit: str | None

    def as_dict(self):
        return asdict(self)


def parse_stat(text: str) -> dict:
    """The fields of /proc/PID/stat that matter here; the name is between the first "(" and the last ")"."""
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 of proc(5): state, ppid, pgrp, session, ..., starttime is field 22.
    return {"name": name, "ppid": int(fields[1]), "session": int(fields[3]), "start_ticks": int(fields[19])}


def unit_of(cgroup_text: str) -> str | None:
    """The systemd unit of a process from its /proc/PID/cgroup text, or None outside any unit.

    The innermost `.service` or `.scope` component wins: inside a container the path starts with the
    container's own scope, and a unit may have sub-cgroups of its own below it.
    """
    paths = {}
    for line in cgroup_text.splitlines():
        fields = line.split(":", 2)  # hierarchy ID, controllers (empty on v2), path
        if len(fields) == 3:
            paths[fields[1]] = fields[2]
    # cgroup v2 ("0::/path") where systemd uses it, else systemd's own v1 hierarchy.
    path = paths.get("") if paths.get("", "/") != "/" else paths.get("name=systemd", "")
    units = [part for part in (path or "").split("/") if part.endswith(UNIT_SUFFIXES)]
    return units[-1] if units else None


def read_cmdline(base: str) -> str:
    """A process's command line, "" while it cannot be read (hidepid=, a process starting or ending)."""
    try:
        with open(f"{base}/cmdline", "rb") as cmdline_file:
            return cmdline_file.read().rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    except PermissionError:
        return ""


def read_process(pid: int, proc: str = PROC) -> Process | None:
    """One process, or None when it has exited meanwhile."""
    base = f"{proc}/{pid}"
    try:
        with open(f"{base}/stat") as stat_file:
            stat = parse_stat(stat_file.read())
        cmdline = read_cmdline(base)
        with open(f"{base}/cgroup") as cgroup_file:
            unit = unit_of(cgroup_file.read())
        uid = os.stat(base).st_uid
    except (FileNotFoundError, ProcessLookupError):
        return None
    return Process(pid=pid, uid=uid, cmdline=cmdline, unit=unit, **stat)


def list_processes(proc: str = PROC) -> list[Process]:
    """Every process that can be read, by PID."""
    pids = sorted(int(entry) for entry in os.listdir(proc) if entry.isdigit())
    return [found for found in (read_process(pid, proc) for pid in pids) if found is not None]


def is_vllm(process: Process) -> bool:
    """A process of a vLLM server: the API server, its engine and workers (named VLLM::...).

    A process that has just started (or is ending) may show an empty command line for a moment; its name
    (`vllm`, the console script, or VLLM::...) and its cgroup (a vllm-*.service unit) still say what it is.
    """
    by_name = bool(VLLM_TITLE.match(process.name)) or process.name == "vllm"
    by_unit = bool(process.unit and process.unit.startswith(VLLM_UNIT_PREFIX) and process.unit.endswith(".service"))
    by_cmdline = bool(VLLM_TITLE.match(process.cmdline)) or "vllm" in process.cmdline
    return by_name or by_unit or by_cmdline


def is_engine(process: Process) -> bool:
    """A process of vLLM's engine: the engine core and its workers (VLLM::EngineCore, VLLM::Worker_TP0), not
    an API server (VLLM::APIServer, or the main process, which keeps its interpreter's command line)."""
    title = process.cmdline if VLLM_TITLE.match(process.cmdline) else process.name
    return bool(VLLM_TITLE.match(title)) and not title.startswith(API_SERVER_TITLE)


def open_connections(tcp_table: str, port: int) -> int:
    """TCP connections on local `port` in a /proc/net/tcp or tcp6 table: every state but LISTEN and TIME_WAIT.

    A table row: `sl local_address rem_address st ...`, addresses as HEXIP:HEXPORT, the state in hex.
    """
    count = 0
    for row in tcp_table.splitlines()[1:]:
        fields = row.split()
        if len(fields) > 3 and ":" in fields[1]:
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            count += local_port == port and fields[3] not in (TCP_LISTEN, TCP_TIME_WAIT)
    return count


def server_connections(pid: int, port: int, proc: str = PROC) -> int | None:
    """Connections open on a server's port, in the network namespace of process `pid`; None if unreadable."""
    tables = []
    for name in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/{pid}/net/{name}") as table:
                tables.append(table.read())
        except FileNotFoundError:
            continue
        except OSError:
            return None
    return sum(open_connections(table, port) for table in tables) if tables else None


def catches_signal(pid: int, signum: int, proc: str = PROC) -> bool:
    """Whether process `pid` has a handler of its own for `signum` (the SigCgt mask of its status): sent a signal
    it does not catch, such as SIGUSR2, a process dies."""
    try:
        with open(f"{proc}/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def still_running(process: Process, proc: str = PROC) -> bool:
    """Whether this very process (not a later one with its PID) has any thread left.

    A killed multi-threaded process shows its leader as a zombie while its other threads are still
    exiting (unmapping memory, closing a GPU context); until they are gone it holds its memory and stays
    in its cgroup, so it still counts as running.
    """
    base = f"{proc}/{process.pid}"
    try:
        with open(f"{base}/stat") as stat_file:
            text = stat_file.read()
        if parse_stat(text)["start_ticks"] != process.start_ticks:
            return False
        return text[text.rindex(")") + 2] != "Z" or len(os.listdir(f"{base}/task")) > 1
    except (FileNotFoundError, ProcessLookupError):
        return False


def _signal_all(processes, signum, proc):
    sent = []
    for process in processes:
        if still_running(process, proc):
            try:
                os.kill(process.pid, signum)
                sent.append(process)
            except ProcessLookupError:
                pass
    return sent


def terminate(processes: list[Process], grace: float, proc: str = PROC, interval: float = 0.05) -> dict:
    """SIGTERM each process, SIGKILL what is left after `grace` s; report who went at which signal.

    Returns `{"terminated": [pids], "killed": [pids], "survivors": [pids], "elapsed": s}`; survivors are
    processes alive even after SIGKILL (uninterruptible sleep in a driver call, typically).
    """
    start = time.monotonic()

    def alive():
        return [process for process in processes if still_running(process, proc)]

    _signal_all(processes, signal.SIGTERM, proc)
    wait_for(lambda: (not alive(), None), timeout=grace, interval=interval)
    killed = _signal_all(alive(), signal.SIGKILL, proc)
    wait_for(lambda: (not alive(), None), timeout=2.0, interval=interval)
    survivors = [process.pid for process in alive()]
    killed_pids = [process.pid for process in killed if process.pid not in survivors]
    return {
        "terminated": [process.pid for process in processes if process not in killed],
        "killed": killed_pids,
        "survivors": survivors,
        "elapsed": round(time.monotonic() - start, 3),
    }
