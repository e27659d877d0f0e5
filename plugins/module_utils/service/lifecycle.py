# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lifecycle of one vLLM unit: start and wait until it serves, stop in bounded steps, sleep and wake, find orphans.

Every step is bounded by the module's own timeouts, never by systemd's TimeoutStartSec/TimeoutStopSec,
and each returns what it observed with its duration, so a play shows where the time went.
"""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.parse
from dataclasses import dataclass

from ansible_collections.llmops.vllm.plugins.module_utils.common.wait import WaitAborted, wait_for
from ansible_collections.llmops.vllm.plugins.module_utils.service.processes import (
    catches_signal,
    is_engine,
    list_processes,
    read_process,
    server_connections,
    still_running,
    terminate,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.serve_command import CUT_OFF_ACCOUNTING
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import (
    Unit,
    UnitState,
    engine_death,
    error_lines,
    exec_start_argv,
    flag_value,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.vllm_api import (
    get,
    is_sleeping,
    one_token_completion,
    post,
    requests_in_engine,
    served_models,
)

# The start of the journal line that CUT_OFF_ACCOUNTING, a middleware of every server the collection deploys
# (roles/vllm_install/files/llmops_vllm_dev_guard.py), writes for each request that the server did not finish,
# and the end of that line: when the request began, in seconds since the epoch.
CUT_OFF_MARK = "llmops.vllm: request cut off:"
CUT_OFF_STARTED = re.compile(r" started (\d+(?:\.\d+)?)$")
# What the answer held when it was cut off: its HTTP status (None before any) and how many body messages.
CUT_OFF_ANSWER = re.compile(r", status (\d+|None), (\d+) body messages,")
# The signal that asks that middleware for the requests it is still answering (it writes the same line for each),
# and the line that ends its answer: a stop asks before it kills a server, whose open requests would end unwritten.
ACCOUNT_SIGNAL = signal.SIGUSR2
ACCOUNTED = "llmops.vllm: requests still open:"

# Seconds between polls of a stopping unit: stops take seconds, and each poll is one systemctl call.
STOP_POLL_INTERVAL = 0.2
# journald reads a service's output asynchronously: the last lines of a crash may arrive after systemd
# has recorded the exit. Seconds to wait for them.
JOURNAL_CATCH_UP = 3.0
# Lines of a failed run searched for its errors: an engine's traceback and the API server's after it run to a few
# hundred lines, and the engine's, which comes first, names the cause.
ERROR_SEARCH_LINES = 2000
# A process whose start is this close to the main process's start may have been forked by it.
START_SLACK_SECONDS = 2.0
# After a stop, vLLM's API server waits for its open connections to close once its engine has exited, and
# CUDA builds with requests in flight wait forever (docs/service.md). Seconds that the engine may be gone
# while the API server still holds as many connections, none of them closing, before the module ends it.
ENGINE_EXIT_GRACE = 1.5
# Level 1 moves the weights to CPU memory and frees the KV cache: a wake-up gives the same model back. Level 2
# discards the weights, which a wake-up does not reload; a swap needs level 1.
SLEEP_LEVEL = 1
# Seconds for the proof that a woken engine computes: a completion of one token.
COMPLETION_TIMEOUT = 60.0


class ServiceError(Exception):
    """The lifecycle step failed; `details` goes into the module's failure result."""

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.details = details


@dataclass
class Settings:
    url: str
    served_name: str | None = None
    api_key: str | None = None
    load_timeout: float = 600.0
    stop_timeout: float = 30.0
    drain_timeout: float | None = None  # None: the server's own --shutdown-timeout
    kill_timeout: float = 10.0
    kill_orphans: bool = True
    orphan_grace: float = 5.0
    poll_interval: float = 1.0
    journal_lines: int = 40
    # A multi-host group's data parallel ranks, each of which must answer before the group serves (one for a replica
    # over the hosts, tensor or pipeline parallel across them); 0: not a group.
    group_ranks: int = 0


def server_drain_timeout(state: UnitState) -> float:
    """vLLM's --shutdown-timeout from the unit's command line: how long the server itself drains."""
    value = flag_value(exec_start_argv(state.exec_start), "--shutdown-timeout")
    try:
        return max(0.0, float(value)) if value is not None else 0.0
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class CutOff:
    """A request that CUT_OFF_ACCOUNTING wrote as cut off: when it began (seconds since the epoch), and whether the
    server had begun to answer it (status 200 and a body message)."""

    started: float
    answered: bool


def cut_off_requests(lines: list[str]) -> list[CutOff]:
    """The requests of the lines that CUT_OFF_ACCOUNTING wrote, oldest line first."""
    found = []
    for line in lines:
        started = CUT_OFF_STARTED.search(line) if line.startswith(CUT_OFF_MARK) else None
        if started:
            answer = CUT_OFF_ANSWER.search(line)
            answered = bool(answer) and answer.group(1) == "200" and int(answer.group(2)) > 0
            found.append(CutOff(float(started.group(1)), answered))
    return found


class Lifecycle:
    def __init__(self, unit: Unit, settings: Settings, proc: str = "/proc"):
        self.unit = unit
        self.settings = settings
        self.proc = proc

    # ---- readiness -------------------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, dict]:
        """(ready, what was seen): /health is 200 and /v1/models lists the served name."""
        url, name = self.settings.url, self.settings.served_name
        health = get(url, "/health")
        if health.status != 200:
            return False, {"health": health.describe()}
        models = get(url, "/v1/models", self.settings.api_key)
        if models.status in (401, 403):
            raise WaitAborted(f"the server refuses the API key on /v1/models ({models.describe()}): check api_key")
        listed = served_models(models.body)
        if models.status == 200 and name not in listed:
            raise WaitAborted(f"the server at {url} serves {listed}, not {name!r}: check served_name")
        seen = {"health": health.describe(), "models": listed or models.describe()}
        if models.status != 200 or not self.settings.group_ranks:
            return models.status == 200, seen
        # The group's API server answers /health while an engine of another host is gone: each rank must compute.
        ranks = [
            one_token_completion(url, name, self.settings.api_key, COMPLETION_TIMEOUT, data_parallel_rank=rank)
            for rank in range(self.settings.group_ranks)
        ]
        seen["ranks"] = [reply.describe() for reply in ranks]
        return all(reply.status == 200 for reply in ranks), seen

    def wait_ready(self) -> dict:
        """Wait for readiness of a unit that is already running (started by someone else, still loading)."""
        result = wait_for(self._ready_while_running, self.settings.load_timeout, self.settings.poll_interval)
        if not result.ok:
            self._fail_start(result)
        return {"load": round(result.elapsed, 3), "elapsed": round(result.elapsed, 3)}

    def _ready_while_running(self):
        state = self.unit.state()
        if state.crashed or state.stopped:
            raise WaitAborted(f"{self.unit.name} stopped while loading: {state.outcome()}", state.as_dict())
        return self.readiness()

    # ---- start -----------------------------------------------------------------------------------------

    def start(self, before: UnitState) -> dict:
        started = time.monotonic()
        # A deliberate start is a new attempt: StartLimitBurst counts every start, and is there to stop
        # automatic restarts of a crashing server, not an operator's (or a test's) third restart in a row.
        self.unit.reset_failed()
        self.unit.start()
        active_after = []

        def check():
            state = self.unit.state()
            new_run_ended = state.stopped and state.invocation_id != before.invocation_id
            if state.crashed or new_run_ended:
                raise WaitAborted(f"{self.unit.name} failed while loading: {state.outcome()}", state.as_dict())
            if state.active_state != "active":
                return False, state.as_dict()
            if not active_after:
                active_after.append(time.monotonic() - started)
            return self.readiness()

        result = wait_for(check, self.settings.load_timeout, self.settings.poll_interval)
        if not result.ok:
            self._fail_start(result)
        elapsed = time.monotonic() - started
        systemd_start = active_after[0] if active_after else elapsed
        return {
            "systemd_start": round(systemd_start, 3),
            "load": round(elapsed - systemd_start, 3),
            "elapsed": round(elapsed, 3),
        }

    def _fail_start(self, result):
        invocation = self.unit.state().invocation_id

        # The cause is the engine's traceback, which the API server's own traceback follows: the errors are looked
        # for in the whole run, not only in the lines shown.
        def journal_has_errors():
            journal = self.unit.journal(invocation, ERROR_SEARCH_LINES)
            return bool(error_lines(journal)), journal

        journal = wait_for(journal_has_errors, JOURNAL_CATCH_UP, interval=0.5).observed
        reason = result.aborted or (
            f"{self.unit.name} was not serving {self.settings.served_name!r} at {self.settings.url} "
            f"after {self.settings.load_timeout:g} s (load_timeout); last seen: {result.observed}"
        )
        errors = error_lines(journal)
        message = [reason]
        death = engine_death(journal)
        if death:
            message.append(death)
        if errors:
            message += ["Errors in its journal (the first is usually the cause):", *errors]
        message += ["Last lines of its journal:", *journal[-10:]]
        raise ServiceError(
            "\n".join(message),
            elapsed=round(result.elapsed, 3),
            observed=result.observed,
            journal=journal[-self.settings.journal_lines :],
        )

    # ---- stop ------------------------------------------------------------------------------------------

    def stop(self, before: UnitState) -> dict:
        """Drain, SIGTERM through systemd, SIGKILL the cgroup past stop_timeout, then look for orphans."""
        settings = self.settings
        started = time.monotonic()
        report = {"in_flight": None, "drain": None, "aborted_requests": 0, "aborted_requests_bound": "exact"}
        report.update(refused_requests=0, terminate=None, escalated=False, killed=[], api_server_hang=None)
        if not before.stopped:
            serving = before.active_state == "active"
            report["in_flight"] = requests_in_engine(settings.url) if serving else None
            engine = self._engine_processes(before)
            stop_asked = time.time()
            self.unit.stop()
            sigterm_at = time.monotonic()
            if serving:
                self._drain_in_flight(report, before)
            # Without a main process (killed, crashed) nothing in the cgroup will exit on SIGTERM: what is
            # left there once the unit stops is orphaned, and the orphan step below deals with it.
            report["terminate"] = self._wait_stopped(before, settings.stop_timeout, engine, sigterm_at)
            hang = report["terminate"].pop("api_server_hang")
            accounted = False
            if hang or not report["terminate"]["stopped"]:
                report["escalated"] = True
                report["api_server_hang"] = hang
                accounted = self._ask_account(before, stop_asked)
                report["killed"] = self._kill_cgroup(before)
            self._count_cut_off(report, before, stop_asked, accounted)
        report["orphans"] = self._orphans(before)
        report["cgroup_empty"] = not self.unit.pids(before)
        report["elapsed"] = round(time.monotonic() - started, 3)
        return report

    def _count_cut_off(self, report: dict, before: UnitState, stop_asked: float, accounted: bool):
        """The requests the stop aborted, from the server's own account of each request it did not finish.

        A unit that runs the collection's CutOffRequests middleware writes one journal line for each; a stop
        counts those of its run that began before SIGTERM, and those begun later that the server had begun to
        answer. The others that began later, answered with an error alone, were refused, not aborted.
        Before a SIGKILL the server was asked for the requests it still had open (`accounted`: it answered);
        without that answer, a SIGKILL ends requests that write nothing: the connections of an API server that
        outlived its engine stand for them (an estimate: some may be idle or closing), or their number is not
        known (at least). Without the middleware the count read before SIGTERM stands, an estimate: requests
        start and finish between that read and the stop, and vLLM's gauges lag.
        """
        if CUT_OFF_ACCOUNTING not in exec_start_argv(before.exec_start):
            report["aborted_requests_bound"] = "estimate"
            return
        read = self._quiet_journal(before, stop_asked)
        if read.observed is None:
            report["aborted_requests_bound"] = "estimate"
            return
        hang = None if accounted else report["api_server_hang"]
        # vLLM serves on for a moment after SIGTERM: a request begun then that got an answer was cut off as well.
        cut_off = cut_off_requests(read.observed)
        aborted = sum(request.started < stop_asked or request.answered for request in cut_off)
        report["aborted_requests"] = aborted + (hang["connections"] if hang else 0)
        report["refused_requests"] = len(cut_off) - aborted
        if hang:
            report["aborted_requests_bound"] = "estimate"
        elif (report["escalated"] and not accounted) or not read.ok:
            report["aborted_requests_bound"] = "at least"
        if report["drain"]:
            report["drain"]["remaining"] = report["aborted_requests"]

    def _ask_account(self, before: UnitState, since: float) -> bool:
        """Ask the API server of a unit about to be killed for the requests it still has open (ACCOUNT_SIGNAL to
        CutOffRequests); whether its answer reached the journal. A process that does not catch the signal is
        not sent it."""
        main_pid = self.unit.state().main_pid
        if CUT_OFF_ACCOUNTING not in exec_start_argv(before.exec_start) or not main_pid:
            return False
        if not catches_signal(main_pid, ACCOUNT_SIGNAL, self.proc):
            return False
        try:
            os.kill(main_pid, ACCOUNT_SIGNAL)
        except ProcessLookupError:
            return False

        def answered():
            lines = self.unit.journal_since(before.invocation_id, since) or []
            return any(line.startswith(ACCOUNTED) for line in lines), None

        return wait_for(answered, JOURNAL_CATCH_UP, STOP_POLL_INTERVAL).ok

    def _quiet_journal(self, before: UnitState, since: float):
        """The run's journal lines since `since` (a wait_for result), once journald has caught up with what its
        processes wrote: they are gone, so two reads a poll apart that agree hold every line. `observed` is None
        when the journal cannot be read; `ok` is false when it did not settle within JOURNAL_CATCH_UP."""
        seen = {"lines": None}

        def check():
            lines = self.unit.journal_since(before.invocation_id, since)
            if lines is None:
                raise WaitAborted("the journal cannot be read")
            caught_up = lines == seen["lines"]
            seen["lines"] = lines
            return caught_up, lines

        return wait_for(check, JOURNAL_CATCH_UP, STOP_POLL_INTERVAL)

    def _engine_processes(self, state: UnitState) -> list:
        """The engine core and workers of a running unit, read before it is asked to stop."""
        found = (read_process(pid, self.proc) for pid in self.unit.pids(state) if pid != state.main_pid)
        return [process for process in found if process and is_engine(process)]

    def _drain_in_flight(self, report: dict, before: UnitState):
        """Watch report's `in_flight` requests drain, up to the drain timeout; what is left counts as aborted (an
        estimate, which a stop replaces by the server's own account).

        An unreadable count (None: a busy server) may hide requests: the drain is watched all the same.
        """
        settings = self.settings
        drain = settings.drain_timeout if settings.drain_timeout is not None else server_drain_timeout(before)
        if drain > 0 and report["in_flight"] != 0:
            report["drain"] = self._drain(report["in_flight"], drain)
            report["aborted_requests"] = report["drain"]["remaining"] or 0
        else:
            report["aborted_requests"] = report["in_flight"] or 0

    def _drain(self, in_flight: int | None, drain: float) -> dict:
        """Watch the engine's requests until none is left, the server exits, or the drain time ends."""
        last = {"remaining": in_flight}

        def check():
            if self.unit.state().stopped:
                return True, last["remaining"]
            count = requests_in_engine(self.settings.url)
            if count is None:  # the server closed its port: what was left is gone with it
                return True, last["remaining"]
            last["remaining"] = count
            return count == 0, count

        result = wait_for(check, drain, STOP_POLL_INTERVAL)
        return {"timeout": drain, "remaining": last["remaining"], "elapsed": round(result.elapsed, 3)}

    def _wait_stopped(self, before: UnitState, timeout: float, engine: list, sigterm_at: float) -> dict:
        """Until the unit is stopped and its cgroup empty, or its API server has outlived its engine.

        The API server outlives its engine when every engine process is gone while the main process still
        holds connections on the server's port and none of them closes, for ENGINE_EXIT_GRACE s: a server
        waiting for streams that nothing will ever finish. `api_server_hang` says so (else it is None).
        """
        port = self._server_port(before)
        hang = {"since": None, "connections": 0, "engine_gone": None, "found": None}

        def check():
            state = self.unit.state()
            # A unit without a main process (killed, crashed) leaves orphans: the orphan step finds them.
            leftovers = self.unit.pids(before) if before.main_pid else []
            if state.stopped and not leftovers:
                return True, state.as_dict()
            now = time.monotonic()
            engine_gone = engine and not any(still_running(process, self.proc) for process in engine)
            if engine_gone and hang["engine_gone"] is None:
                hang["engine_gone"] = now
            connections = server_connections(state.main_pid, port, self.proc) if engine_gone and state.main_pid else 0
            if not connections or connections < hang["connections"]:  # none left, or some closing: not stuck
                hang["since"] = now if connections else None
            elif hang["since"] is None:
                hang["since"] = now
            elif now - hang["since"] >= ENGINE_EXIT_GRACE:
                hang["found"] = {
                    "main_pid": state.main_pid,
                    "connections": connections,
                    "engine_exited": round(hang["engine_gone"] - sigterm_at, 3),
                    "killed_after": round(now - sigterm_at, 3),
                }
                return True, state.as_dict()
            hang["connections"] = connections or 0
            return False, state.as_dict()

        result = wait_for(check, timeout, STOP_POLL_INTERVAL)
        stopped = result.ok and hang["found"] is None
        return {
            "stopped": stopped,
            "elapsed": round(result.elapsed, 3),
            **(result.observed or {}),
            "api_server_hang": hang["found"],
        }

    def _server_port(self, state: UnitState) -> int:
        """The port the server listens on: its --port, else the port of the URL the module was given."""
        try:
            return int(flag_value(exec_start_argv(state.exec_start), "--port") or "")
        except ValueError:
            return urllib.parse.urlsplit(self.settings.url).port or 80

    def _kill_cgroup(self, before: UnitState) -> list[int]:
        """SIGKILL every process of the cgroup until it is empty and systemd has seen the unit stop."""
        killed = set()

        def check():
            pids = self.unit.pids(before)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            return not pids and self.unit.state().stopped, pids

        result = wait_for(check, self.settings.kill_timeout, STOP_POLL_INTERVAL)
        if not result.ok:
            survivors = [found.as_dict() for found in map(read_process, result.observed or []) if found]
            raise ServiceError(
                f"{self.unit.name}: processes outlived SIGKILL for {self.settings.kill_timeout:g} s (kill_timeout), "
                "typically stuck in a driver call (state D); the GPU may need a reset",
                survivors=survivors,
            )
        return sorted(killed)

    # ---- sleep and wake --------------------------------------------------------------------------------

    def asleep(self) -> bool:
        """Whether the running server sleeps; ServiceError when it has no sleep endpoints."""
        sleeping = is_sleeping(self.settings.url)
        if sleeping is None:
            answer = get(self.settings.url, "/is_sleeping").describe()
            raise ServiceError(
                f"{self.settings.url} has no sleep endpoints (GET /is_sleeping: {answer}): {self.unit.name} was not "
                "started with sleep mode; deploy it with the catalog entry's sleep_mode (or vllm_server_sleep_mode)"
            )
        return sleeping

    def sleep(self, before: UnitState) -> dict:
        """Drain the requests in flight (up to the drain timeout), abort what is left, and put the engine to sleep.

        Level 1: the weights go to CPU memory, the KV cache is freed; the server keeps its process and its port.
        """
        settings = self.settings
        started = time.monotonic()
        report = {"level": SLEEP_LEVEL, "in_flight": requests_in_engine(settings.url), "drain": None}
        self._drain_in_flight(report, before)
        asked = time.monotonic()
        # Moving the weights out takes about as long as reading them in: the load's bound holds for it.
        reply = post(settings.url, f"/sleep?level={SLEEP_LEVEL}&mode=abort", timeout=settings.load_timeout)
        if reply.status != 200:
            raise ServiceError(
                f"{self.unit.name} did not go to sleep: POST /sleep answered {reply.describe()} {reply.body[:300]}",
                sleep=report,
            )
        if not self._says_sleeping(True):
            raise ServiceError(
                f"{self.unit.name} answered POST /sleep but GET /is_sleeping did not say so within "
                f"{settings.stop_timeout:g} s (stop_timeout)",
                sleep=report,
            )
        report["sleep"] = round(time.monotonic() - asked, 3)
        report["elapsed"] = round(time.monotonic() - started, 3)
        return report

    def wake(self) -> dict:
        """Wake the engine, then prove that it serves: /v1/models lists the served name and one token comes back."""
        settings = self.settings
        started = time.monotonic()
        reply = post(settings.url, "/wake_up", timeout=settings.load_timeout)
        if reply.status != 200:
            answer = f"{reply.describe()} {reply.body[:300]}"
            raise ServiceError(f"{self.unit.name} did not wake: POST /wake_up answered {answer}")
        if not self._says_sleeping(False):
            raise ServiceError(
                f"{self.unit.name} answered POST /wake_up but still sleeps {settings.stop_timeout:g} s later "
                "(stop_timeout)"
            )
        woke = time.monotonic()
        ready = self.wait_ready()
        completion = one_token_completion(settings.url, settings.served_name, settings.api_key, COMPLETION_TIMEOUT)
        if completion.status != 200:
            raise ServiceError(
                f"{self.unit.name} woke, but a completion of one token answered {completion.describe()} "
                f"{completion.body[:300]}"
            )
        return {
            "wake": round(woke - started, 3),
            "check": round(time.monotonic() - woke, 3),
            "ready": ready["elapsed"],
            "elapsed": round(time.monotonic() - started, 3),
        }

    def _says_sleeping(self, expected: bool) -> bool:
        """Whether GET /is_sleeping gives `expected` within stop_timeout."""
        said = wait_for(
            lambda: (is_sleeping(self.settings.url) is expected, None), self.settings.stop_timeout, STOP_POLL_INTERVAL
        )
        return said.ok

    # ---- orphans ---------------------------------------------------------------------------------------

    def find_orphans(self, before: UnitState) -> list:
        """Processes of this instance alive while its unit is stopped.

        systemd runs the main process in a session of its own, and vLLM's engine, workers and resource tracker
        stay in it, so they are the processes of the last main PID's session started since it started; plus
        whatever is still in the unit's cgroup (KillMode=process leaves them there).
        """
        tick = os.sysconf("SC_CLK_TCK")
        earliest = before.main_started_us / 1e6 - START_SLACK_SECONDS
        return [
            process
            for process in list_processes(self.proc)
            if (
                process.unit == self.unit.name
                or (
                    before.last_main_pid
                    and process.session == before.last_main_pid
                    and process.start_ticks / tick >= earliest
                )
            )
            # A process that has exited and waits to be reaped (its parent may be slow to) holds nothing.
            and still_running(process, self.proc)
        ]

    def _orphans(self, before: UnitState) -> dict:
        orphans = self.find_orphans(before)
        report = {"found": [process.as_dict() for process in orphans], "terminated": [], "killed": [], "survivors": []}
        if orphans and self.settings.kill_orphans:
            ended = terminate(orphans, self.settings.orphan_grace, self.proc)
            report.update(terminated=ended["terminated"], killed=ended["killed"], survivors=ended["survivors"])
        return report
