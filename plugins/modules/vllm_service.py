#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_service
short_description: Start, stop, restart, put to sleep and wake a vLLM systemd unit safely, with bounded steps
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Starts a vLLM unit and waits until it serves, that is until the unit is active, C(/health) answers 200
    and C(/v1/models) lists O(served_name). When the unit fails or exits while loading, the module fails at
    once with the unit's result, the main process's exit status and the unit's journal lines since the start.
  - Stops a unit in bounded steps. It reads the engine's running and waiting requests from C(/metrics) and
    asks systemd to stop the unit, which sends SIGTERM to the API server. With a drain, it watches the
    requests until none is left or O(drain_timeout) ends. When the unit has not stopped O(stop_timeout)
    seconds later, the module sends SIGKILL to every process of the unit's cgroup itself instead of waiting
    for systemd's C(TimeoutStopSec), then confirms that the cgroup is empty.
  - When the API server outlives its engine (every engine process gone, the main process still holding
    connections on the server's port, as CUDA builds of vLLM do with streams in flight), it kills the unit's
    processes within 2 s of the engine's exit, and says so.
  - After a stop it looks for processes of the instance that outlived the unit (vLLM's EngineCore, workers
    and resource tracker of the last main process's session, or processes left in the unit's cgroup by
    C(KillMode=process)), reports them and ends them with SIGTERM then SIGKILL (O(kill_orphans)).
  - Runs C(systemctl daemon-reload) first when the unit's files changed on disk, including a drop-in added
    or removed since systemd loaded the unit (which systemd itself does not notice).
  - Returns the duration of each phase.
  - Says when vLLM's engine died. vLLM exits when its engine dies (a worker killed by a signal, an engine
    core that crashed), and systemd restarts a unit that the C(vllm_server) role wrote. The module reads the
    unit's journal for the last run that ended by itself and returns how its engine died in RV(engine_death),
    with the restarts systemd made in RV(restarts); a start that fails because the engine died says so first.
  - Puts a server started with sleep mode to sleep (O(state=asleep)) and wakes it (O(state=started)). Asleep,
    vLLM keeps its process and its port, its weights move to CPU memory and its KV cache is freed, so that its
    GPUs are free for another server; awake again it serves in seconds where a load takes minutes.
extends_documentation_fragment:
  - llmops.vllm.records
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Reports what a start or stop would do and the orphans it would end; sends nothing.
  diff_mode:
    support: full
    details: The unit's active state before and after.
  idempotent:
    support: partial
    details: O(state=restarted) always restarts; the other states change nothing on a second run.
options:
  name:
    description:
      - The unit, for example C(vllm-tiny.service); C(.service) is added when no suffix is given.
      - One of O(name) and O(instance) is required.
    type: str
  instance:
    description:
      - An instance deployed by the C(vllm_server) role, by name. Its record (O(config_dir)/INSTANCE.json, see
        M(llmops.vllm.vllm_instance)) gives the unit, the URL where the host reaches the server, the served
        name, the API key (read from the EnvironmentFile the record names; never logged) and the load, drain
        and stop timeouts, so none of them is given here, and a rollback starts an old instance with its own
        key and timeouts.
      - O(load_timeout), O(drain_timeout) and O(stop_timeout), when set, replace the record's.
    type: str
  state:
    description:
      - V(started) starts the unit unless it runs, and waits until it serves in both cases.
      - V(stopped) stops it, and looks for orphans even when it was already stopped; a unit left C(failed) is reset
        (RV(reset_failed)), so that the host does not read C(degraded).
      - V(restarted) stops it as V(stopped) does, then starts it as V(started) does.
      - V(asleep) drains the requests in flight for the drain timeout, aborts what is left and puts the running
        server to sleep (vLLM's sleep level 1, which moves the weights to CPU memory and frees the KV cache),
        then confirms it through C(/is_sleeping). The server must have been started with sleep mode (the catalog entry's
        C(sleep_mode)); a stopped unit fails.
      - V(started) wakes a sleeping server (C(/wake_up)) and proves that it serves, C(/v1/models) and a
        completion of one token.
    type: str
    required: true
    choices: [started, stopped, restarted, asleep]
  url:
    description:
      - Base URL where the server answers on this host, with O(name).
      - V(http://127.0.0.1:8000) when not set.
    type: str
  served_name:
    description: The model name the server must list on C(/v1/models). Required to start with O(name).
    type: str
  api_key:
    description: The server's API key, for C(/v1/models), with O(name). C(/health) and C(/metrics) need none.
    type: str
  load_timeout:
    description:
      - Seconds from the start until the model must serve. Large models load for 10 minutes or more.
      - The record's with O(instance), else V(600).
    type: float
  drain_timeout:
    description:
      - Seconds in which in-flight requests may finish after SIGTERM, watched through C(/metrics).
      - The record's with O(instance); else the server's own C(--shutdown-timeout) from the unit's command
        line. vLLM stops taking requests and finishes the running ones for that long. V(0) means no drain. A
        server started without C(--shutdown-timeout) aborts its requests at SIGTERM whatever this says.
    type: float
  stop_timeout:
    description:
      - Seconds the server gets to exit after SIGTERM (after the drain) before SIGKILL.
      - The record's with O(instance), else V(30).
    type: float
  kill_timeout:
    description: Seconds that processes get to die after SIGKILL before the module fails naming them.
    type: float
    default: 10
  kill_orphans:
    description:
      - End the orphans found after a stop (SIGTERM, then SIGKILL after O(orphan_grace)). An orphan may hold
        GPU memory that the next start on those GPUs needs.
      - V(false) reports them and leaves them running.
    type: bool
    default: true
  orphan_grace:
    description: Seconds between SIGTERM and SIGKILL for orphans.
    type: float
    default: 5
  poll_interval:
    description: Seconds between readiness checks while the model loads.
    type: float
    default: 1
  journal_lines:
    description:
      - Journal lines of the unit to return when a start fails. The errors that the message names are looked for
        in the whole run, up to its last 2000 lines.
    type: int
    default: 40
notes:
  - Needs root (or the right to run C(systemctl start/stop) and to signal the server's processes).
seealso:
  - module: ansible.builtin.systemd_service
"""

EXAMPLES = r"""
- name: Start the instance tiny as its record says, and wait until it serves
  llmops.vllm.vllm_service:
    instance: tiny
    state: started

- name: Start a unit of your own and wait until it serves tiny
  llmops.vllm.vllm_service:
    name: vllm-tiny.service
    state: started
    served_name: tiny
    api_key: "{{ vllm_server_api_key }}"
    load_timeout: 300

- name: Stop MiniMax, letting running requests finish for up to a minute, and end any orphan
  llmops.vllm.vllm_service:
    name: vllm-minimax_m25
    state: stopped
    drain_timeout: 60
    stop_timeout: 30
  register: stopped

- name: Show where the stop's time went
  ansible.builtin.debug:
    msg: "{{ stopped.stop }}"

- name: Put minimax_m25 to sleep, its GPUs free for another model, its weights kept in CPU memory
  llmops.vllm.vllm_service:
    instance: minimax_m25
    state: asleep

- name: Wake it again, in seconds, and check that it serves
  llmops.vllm.vllm_service:
    instance: minimax_m25
    state: started
"""

RETURN = r"""
unit:
  description: The unit's name.
  returned: always
  type: str
  sample: vllm-tiny.service
daemon_reloaded:
  description: Whether systemd reloaded its unit files first.
  returned: always
  type: bool
  sample: false
reset_failed:
  description:
    - With O(state=stopped), how the run of a unit left C(failed) had ended, as systemd says it, before
      C(systemctl reset-failed) brought the unit to C(inactive); null when the unit was not failed.
    - A failed unit makes C(systemctl is-system-running) say C(degraded) until it is reset.
  returned: always
  type: str
  sample: result signal, main process killed with status 9
active_state:
  description: The unit's ActiveState at the end.
  returned: always
  type: str
  sample: active
unit_file_state:
  description:
    - The unit's UnitFileState at the end, as systemd says it (C(enabled), C(disabled), C(static), ...), so that a
      play that enables the unit at boot can leave systemd alone where it already is.
  returned: always
  type: str
  sample: enabled
start:
  description: Durations of the start in seconds, null when there was none.
  returned: always
  type: dict
  contains:
    systemd_start:
      description: From C(systemctl start) until systemd reported the unit active (the process runs).
      type: float
    load:
      description: From then until the model served.
      type: float
    elapsed:
      description: The whole start.
      type: float
  sample: {"systemd_start": 0.41, "load": 58.2, "elapsed": 58.61}
stop:
  description: What the stop did, null when there was none.
  returned: always
  type: dict
  contains:
    in_flight:
      description:
        - Requests running or waiting in the engine just before SIGTERM, from vLLM's gauges; null when
          unreadable. A reading of an instant; the gauges lag, and requests start and finish meanwhile.
      type: int
    drain:
      description: The drain's C(timeout), the requests C(remaining) when it ended (as C(aborted_requests)), and
        how long it took.
      type: dict
    aborted_requests:
      description:
        - Requests that the stop cut off. A server deployed by the collection writes a journal line for each
          request it did not finish (the C(llmops_vllm_dev_guard.CutOffRequests) middleware); the module counts
          those of the stopped run that began before SIGTERM, and those begun after it that the server had begun
          to answer (vLLM serves on for a moment). Before it kills a server, the module asks it (SIGUSR2) to write
          the requests it still has open, so that those count too.
        - A unit without that middleware gets the count read before SIGTERM, an estimate; so does a server killed
          without that answer, whose open connections then stand for its open requests.
      type: int
    aborted_requests_bound:
      description:
        - C(exact), the server's own account; C(at least) when a server still running at O(stop_timeout) did not
          answer the module's SIGUSR2 before its SIGKILL, or the journal did not settle; C(estimate) without the
          server's account.
      type: str
      choices: [exact, at least, estimate]
    refused_requests:
      description: Requests that reached the server after SIGTERM and got nothing but an error from it (by the
        server's own account, as C(aborted_requests)); 0 without that account.
      type: int
    terminate:
      description: Whether the unit stopped after SIGTERM (C(stopped)), in how long, and its final state.
      type: dict
    escalated:
      description: Whether the module sent SIGKILL to the unit's cgroup.
      type: bool
    api_server_hang:
      description:
        - Null, or what the module found when the API server outlived its engine. vLLM's API server waits for
          its open connections to close after its engine has stopped; with streams in flight, CUDA builds
          wait forever, and so does any build for a client that stopped reading. When every engine process
          is gone and the main process still holds connections on the server's port, none of them closing,
          for 1.5 s, the module kills the unit's processes at once instead of waiting for O(stop_timeout).
        - C(main_pid), the C(connections) open on the port, C(engine_exited) and C(killed_after), seconds
          from SIGTERM until the engine was seen gone and until the module decided to kill.
      type: dict
    killed:
      description: PIDs that got SIGKILL.
      type: list
      elements: int
    orphans:
      description:
        - C(found) processes of the instance outside a running unit (pid, ppid, session, uid, name,
          cmdline, unit), and which of them were C(terminated), C(killed), or are C(survivors).
      type: dict
    cgroup_empty:
      description: Whether no process is left in the unit's cgroup.
      type: bool
    elapsed:
      description: The whole stop in seconds.
      type: float
  sample:
    in_flight: 3
    drain: {"timeout": 10, "remaining": 0, "elapsed": 1.6}
    aborted_requests: 0
    aborted_requests_bound: exact
    refused_requests: 0
    terminate: {"stopped": true, "elapsed": 7.9, "active_state": "inactive", "sub_state": "dead", "result": "success"}
    escalated: false
    api_server_hang: null
    killed: []
    orphans: {"found": [], "terminated": [], "killed": [], "survivors": []}
    cgroup_empty: true
    elapsed: 7.9
sleep:
  description: What O(state=asleep) did, null when the server was not put to sleep.
  returned: always
  type: dict
  contains:
    level:
      description: vLLM's sleep level, 1.
      type: int
    in_flight:
      description: Requests running or waiting in the engine before the drain; null when unreadable.
      type: int
    drain:
      description: The drain's C(timeout), the requests C(remaining) when it ended, and how long it took.
      type: dict
    aborted_requests:
      description: Requests still running when the engine went to sleep.
      type: int
    sleep:
      description: Seconds from C(POST /sleep) until the server said it sleeps.
      type: float
    elapsed:
      description: Seconds of the whole step, drain included.
      type: float
  sample: {"level": 1, "in_flight": 0, "drain": null, "aborted_requests": 0, "sleep": 1.31, "elapsed": 1.33}
wake:
  description: What waking the server took, null when it was not woken.
  returned: always
  type: dict
  contains:
    wake:
      description: Seconds from C(POST /wake_up) until the server said it is awake.
      type: float
    ready:
      description: Seconds until C(/health) and C(/v1/models) answered.
      type: float
    check:
      description: Seconds of readiness and the completion of one token after that.
      type: float
    elapsed:
      description: The whole wake-up.
      type: float
  sample: {"wake": 0.074, "ready": 0.004, "check": 0.031, "elapsed": 0.105}
asleep:
  description: Whether the server sleeps at the end; null for a server without sleep mode or a stopped unit.
  returned: always
  type: bool
  sample: false
restarts:
  description: The automatic restarts systemd has made of the unit (its C(NRestarts)) when the module began.
  returned: always
  type: int
  sample: 1
engine_death:
  description:
    - How vLLM's engine died in the unit's last run that ended by itself, from its journal, when the
      module began; null when no run has ended so since the last stop that was asked for.
    - The executor's line names the process and how it ended (a negative exit code is the signal).
  returned: always
  type: str
  sample: "the engine died: Worker proc VllmWorker-0 died unexpectedly (exit code: -4, SIGILL)"
elapsed:
  description: Seconds the module spent.
  returned: always
  type: float
  sample: 66.2
journal:
  description: The unit's journal lines since the failed start.
  returned: when a start failed
  type: list
  elements: str
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.common.wait import positive_seconds
from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import (
    DEFAULT_CONFIG_DIR,
    api_key,
    check_instance_name,
    find,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.lifecycle import Lifecycle, ServiceError, Settings
from ansible_collections.llmops.vllm.plugins.module_utils.service.steps import Refused, Steps, condition, steps_to
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import (
    Unit,
    UnitError,
    check_unit_name,
    needs_daemon_reload,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.vllm_api import check_base_url, is_sleeping

POSITIVE_SECONDS = ("load_timeout", "stop_timeout", "kill_timeout", "orphan_grace", "poll_interval")
UNIT_SUFFIXES = (".service", ".scope", ".target", ".socket", ".mount", ".timer", ".path", ".slice")
# Without an instance record: the unit's server on loopback, and bounds that fit a small model.
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_SECONDS = {"load_timeout": 600, "stop_timeout": 30}


def check_options(params) -> None:
    """Refuse a bad option before anything is read on the host; ValueError names the first, and its value."""
    for name in POSITIVE_SECONDS:
        if params[name] is not None:
            positive_seconds(params[name], name)
    drain = params["drain_timeout"]
    if drain is not None and not drain >= 0:
        raise ValueError(f"drain_timeout must be 0 (no drain) or more seconds, got {drain:g}")
    if params["journal_lines"] < 1:
        raise ValueError(f"journal_lines must be 1 or more, got {params['journal_lines']}")
    if params["instance"] is not None:
        check_instance_name(params["instance"])
        return
    check_unit_name(params["name"])
    check_base_url(params["url"] or DEFAULT_URL)
    if params["state"] != "stopped" and not params["served_name"]:
        raise ValueError(f"served_name is required to start the unit (state={params['state']}), or give instance")


def target_from(params) -> tuple[str, dict]:
    """(unit, what the server is) from the instance's record, or from the options without one.

    The dict has url, served_name and api_key, and the record's timeouts and group (empty without a record); a
    RecordError says why the instance cannot be used.
    """
    if params["instance"] is None:
        served = {"url": params["url"] or DEFAULT_URL, "served_name": params["served_name"]}
        return params["name"], {**served, "api_key": params["api_key"]}
    record = find(params["config_dir"], params["instance"])
    timeouts = {name: record[name] for name in ("load_timeout", "drain_timeout", "stop_timeout")}
    served = {"url": record["url"], "served_name": record["served_name"], "api_key": api_key(record)}
    return record["unit"], {**served, **timeouts, "group": record["group"]}


def settings_from(params, target: dict) -> Settings:
    """Settings from the module's checked parameters over the target's (a record checks its own)."""
    given = {name: params[name] for name in ("load_timeout", "stop_timeout", "drain_timeout")}
    chosen = {name: target.get(name) if given[name] is None else given[name] for name in given}
    for name, default in DEFAULT_SECONDS.items():
        chosen[name] = default if chosen[name] is None else chosen[name]
    seconds = {name: positive_seconds({**params, **chosen}[name], name) for name in POSITIVE_SECONDS}
    drain = chosen["drain_timeout"]
    return Settings(
        url=check_base_url(target["url"]),
        served_name=target["served_name"],
        api_key=target["api_key"],
        drain_timeout=drain,
        kill_orphans=params["kill_orphans"],
        journal_lines=params["journal_lines"],
        group_ranks=target.get("group", {}).get("data_parallel_size", 0),
        **seconds,
    )


def elapsed(since: float) -> float:
    return round(time.monotonic() - since, 3)


# How a stop's count of aborted requests reads, by how it was known (see RETURN: aborted_requests_bound).
ABORTED_WORDING = {
    "exact": "{count} requests aborted",
    "at least": "at least {count} requests aborted (others may have ended unseen: SIGKILL, or a journal that did "
    "not settle)",
    "estimate": "about {count} requests aborted (an estimate: the server did not count them itself, as the "
    "collection's llmops_vllm_dev_guard.CutOffRequests middleware does)",
}


def stop_summary(stop: dict) -> str:
    hang = stop["api_server_hang"]
    if hang:
        how = f"the API server did not exit after its engine stopped; {hang['connections']} connections open; killed"
    else:
        how = "SIGKILL after stop_timeout" if stop["escalated"] else "SIGTERM"
    parts = [f"stopped in {stop['elapsed']:g} s ({how})"]
    if stop["drain"]:
        in_flight = "an unknown number of" if stop["in_flight"] is None else stop["in_flight"]
        parts.append(f"drained {in_flight} requests in flight for {stop['drain']['elapsed']:g} s")
    if stop["aborted_requests"] or stop["aborted_requests_bound"] == "at least":
        parts.append(ABORTED_WORDING[stop["aborted_requests_bound"]].format(count=stop["aborted_requests"]))
    if stop["refused_requests"]:
        parts.append(f"{stop['refused_requests']} requests that came after SIGTERM refused")
    orphans = stop["orphans"]
    if orphans["found"]:
        ended = len(orphans["terminated"]) + len(orphans["killed"])
        parts.append(f"{len(orphans['found'])} orphan processes found, {ended} ended")
    return "; ".join(parts)


def engine_death_summary(death: str, restarts: int) -> str:
    restarted = f"; systemd has restarted it {restarts} time{'s' if restarts != 1 else ''}" if restarts else ""
    return f"its last run ended because {death}{restarted}"


def run_steps(steps: Steps, lifecycle: Lifecycle, before, result: dict) -> list[str]:
    """Carry out the steps, their reports into `result`; what each did, in words."""
    messages = []
    served_name = lifecycle.settings.served_name
    if steps.stop:
        stop = result["stop"] = lifecycle.stop(before)
        result["changed"] |= bool(stop["orphans"]["terminated"] + stop["orphans"]["killed"])
        messages.append(stop_summary(stop))
    if steps.start:
        # After a stop, the start follows the unit's new state (its run ended, a new invocation will begin).
        start = result["start"] = lifecycle.start(lifecycle.unit.state() if steps.stop else before)
        messages.append(
            f"serving {served_name!r} {start['elapsed']:g} s after the start"
            f" (systemd {start['systemd_start']:g} s, model load {start['load']:g} s)"
        )
    if steps.wake:
        wake = result["wake"] = lifecycle.wake()
        messages.append(
            f"woke in {wake['wake']:g} s; serving {served_name!r} {wake['elapsed']:g} s after the wake-up"
            " (a completion of one token answered)"
        )
    if steps.wait_ready:
        waited = lifecycle.wait_ready()
        if not steps.sleep:
            messages.append(f"already running; serving {served_name!r} ({waited['elapsed']:g} s wait)")
    if steps.sleep:
        report = result["sleep"] = lifecycle.sleep(before)
        drained = f"; drained {report['drain']['elapsed']:g} s" if report["drain"] else ""
        aborted = f"; {report['aborted_requests']} requests aborted" if report["aborted_requests"] else ""
        messages.append(f"asleep in {report['sleep']:g} s (level {report['level']}){drained}{aborted}")
    return messages


def main():
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str"},
            "instance": {"type": "str"},
            "config_dir": {"type": "path", "default": DEFAULT_CONFIG_DIR},
            "state": {"type": "str", "required": True, "choices": ["started", "stopped", "restarted", "asleep"]},
            "url": {"type": "str"},
            "served_name": {"type": "str"},
            "api_key": {"type": "str", "no_log": True},
            "load_timeout": {"type": "float"},
            "drain_timeout": {"type": "float"},
            "stop_timeout": {"type": "float"},
            "kill_timeout": {"type": "float", "default": 10},
            "kill_orphans": {"type": "bool", "default": True},
            "orphan_grace": {"type": "float", "default": 5},
            "poll_interval": {"type": "float", "default": 1},
            "journal_lines": {"type": "int", "default": 40},
        },
        required_one_of=[("name", "instance")],
        mutually_exclusive=[("instance", option) for option in ("name", "url", "served_name", "api_key")],
        supports_check_mode=True,
    )
    started = time.monotonic()
    state = module.params["state"]
    try:
        check_options(module.params)
        name, target = target_from(module.params)
        settings = settings_from(module.params, target)
    except ValueError as error:  # RecordError included
        module.fail_json(msg=str(error))
    if settings.api_key:  # read from the instance's EnvironmentFile: never shown
        module.no_log_values.add(settings.api_key)
    if not name.endswith(UNIT_SUFFIXES):
        name += ".service"

    unit = Unit(name, module.run_command)
    lifecycle = Lifecycle(unit, settings)
    result = {
        "unit": name,
        "changed": False,
        "daemon_reloaded": False,
        "reset_failed": None,
        "start": None,
        "stop": None,
        "restarts": 0,
        "engine_death": None,
        "sleep": None,
        "wake": None,
        "asleep": None,
    }
    try:
        before = unit.state()
        if not before.exists:
            module.fail_json(
                msg=f"systemd does not know the unit {name} (LoadState {before.load_state}): check the name"
            )
        if needs_daemon_reload(before):
            if not module.check_mode:
                unit.daemon_reload()
                before = unit.state()
            result.update(changed=True, daemon_reloaded=True)
        running = not before.stopped and not before.crashed
        # Only a unit that systemd restarted, or one that is not running, can have a run that ended by itself.
        death = unit.last_engine_death(before.stopped) if before.restarts or not running else None
        result.update(restarts=before.restarts, engine_death=death)
        messages = [engine_death_summary(death, before.restarts)] if death else []
        # A server that sleeps answers /health: only its own word says whether it serves.
        sleeping = (lifecycle.asleep() if state == "asleep" else is_sleeping(settings.url)) if running else None
        now = condition(before, sleeping)
        try:
            steps = steps_to(state, now)
        except Refused as refused:
            module.fail_json(
                msg=f"{name} is {before.active_state}: {refused}", **{**result, "elapsed": elapsed(started)}
            )
        if module.check_mode:
            orphans = lifecycle.find_orphans(before) if steps.orphans_now else []
            result["changed"] |= steps.changes or bool(orphans and settings.kill_orphans)
            result["orphans"] = [process.as_dict() for process in orphans]
        else:
            result["changed"] |= steps.changes
            messages += run_steps(steps, lifecycle, before, result)
            if state == now == "asleep":
                messages.append("already asleep")
        after = unit.state()
        # A stopped unit left failed (killed past its timeout, or crashed before) makes the host read `degraded`;
        # how its run ended is in this result, and in the journal.
        if state == "stopped" and after.active_state == "failed":
            result.update(changed=True, reset_failed=after.outcome())
            messages.append(f"its failed state reset ({after.outcome()})")
            if not module.check_mode:
                unit.reset_failed()
                after = unit.state()
        result["asleep"] = is_sleeping(settings.url) if not after.stopped else None
    except ServiceError as error:
        module.fail_json(msg=f"{name}: {error}", **{**result, **error.details, "elapsed": elapsed(started)})
    except UnitError as error:
        module.fail_json(msg=str(error), **{**result, "elapsed": elapsed(started)})

    result["active_state"] = after.active_state
    result["unit_file_state"] = after.unit_file_state
    result["elapsed"] = elapsed(started)
    result["msg"] = f"{name}: " + ("; ".join(messages) or f"{after.active_state}, nothing to do")
    result["diff"] = {"before": f"{name}: {before.active_state}\n", "after": f"{name}: {after.active_state}\n"}
    if module.check_mode:
        result["diff"]["after"] = f"{name}: {'inactive' if state == 'stopped' else 'active'}\n"
    module.exit_json(**result)


if __name__ == "__main__":
    main()
