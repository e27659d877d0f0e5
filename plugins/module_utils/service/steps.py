# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The steps that take a vLLM unit from what it is to the state wanted of it.

One decision serves check mode, which reports it, and the real run, which carries it out, so the two
cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import UnitState

WANTED_STATES = ("started", "stopped", "restarted", "asleep")
# What the unit is when the module begins: inactive or failed; waiting for systemd's restart after its main
# process died; running (loading or serving); running and asleep (vLLM's sleep mode).
CONDITIONS = ("stopped", "restarting", "running", "asleep")


class Refused(ValueError):
    """No step takes the unit to the wanted state; the message says what to do first."""


@dataclass(frozen=True)
class Steps:
    """The steps in the order they run, and whether they change the unit (`changes`).

    Orphans that a stop ends are a change that only the stop itself knows of. `orphans_now` says that they can
    be found before it, as the unit is stopped already: check mode lists them.
    """

    stop: bool = False  # drain, SIGTERM, SIGKILL past stop_timeout, then the orphans
    start: bool = False  # start, and wait until it serves
    wake: bool = False  # wake a sleeping server, and prove that it serves
    wait_ready: bool = False  # wait until a running server serves (it may still be loading)
    sleep: bool = False  # put the serving server to sleep
    changes: bool = False
    orphans_now: bool = False


def condition(state: UnitState, sleeping: bool | None) -> str:
    """The unit's condition, one of CONDITIONS; `sleeping` is the server's own word (None: no sleep mode)."""
    if state.stopped:
        return "stopped"
    if state.crashed:
        return "restarting"
    return "asleep" if sleeping else "running"


def steps_to(wanted: str, unit: str) -> Steps:
    """The steps from the unit's condition (CONDITIONS) to the wanted state (WANTED_STATES)."""
    if wanted not in WANTED_STATES or unit not in CONDITIONS:
        raise ValueError(f"no steps from {unit!r} to {wanted!r}")
    running = unit in ("running", "asleep")
    if wanted == "stopped":
        return Steps(stop=True, changes=unit != "stopped", orphans_now=unit == "stopped")
    if wanted == "restarted":
        return Steps(stop=True, start=True, changes=True, orphans_now=unit == "stopped")
    if wanted == "started":
        if not running:
            return Steps(start=True, changes=True)
        return Steps(wake=True, changes=True) if unit == "asleep" else Steps(wait_ready=True)
    if not running:
        raise Refused("only a running server can go to sleep; start it first")
    # A server still loading has nothing to put to sleep yet: it must serve first.
    return Steps() if unit == "asleep" else Steps(wait_ready=True, sleep=True, changes=True)
