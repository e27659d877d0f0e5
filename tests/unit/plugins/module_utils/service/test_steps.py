"""The one decision behind vllm_service's check mode and its real run: every wanted state from every condition."""

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.service.steps import (
    CONDITIONS,
    WANTED_STATES,
    Refused,
    Steps,
    condition,
    steps_to,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import parse_show

STOP = Steps(stop=True, changes=True)
RESTART = Steps(stop=True, start=True, changes=True)
# (wanted, condition) -> the steps, or the refusal's message.
TABLE = {
    ("started", "stopped"): Steps(start=True, changes=True),
    ("started", "restarting"): Steps(start=True, changes=True),
    ("started", "running"): Steps(wait_ready=True),
    ("started", "asleep"): Steps(wake=True, changes=True),
    # A stopped unit changes only when orphans end, which the stop alone knows; check mode finds them now.
    ("stopped", "stopped"): Steps(stop=True, orphans_now=True),
    ("stopped", "restarting"): STOP,
    ("stopped", "running"): STOP,
    ("stopped", "asleep"): STOP,
    ("restarted", "stopped"): Steps(stop=True, start=True, changes=True, orphans_now=True),
    ("restarted", "restarting"): RESTART,
    ("restarted", "running"): RESTART,
    ("restarted", "asleep"): RESTART,
    ("asleep", "stopped"): "only a running server can go to sleep; start it first",
    ("asleep", "restarting"): "only a running server can go to sleep; start it first",
    ("asleep", "running"): Steps(wait_ready=True, sleep=True, changes=True),
    ("asleep", "asleep"): Steps(),
}


def test_the_table_covers_every_wanted_state_from_every_condition():
    assert set(TABLE) == {(wanted, unit) for wanted in WANTED_STATES for unit in CONDITIONS}


@pytest.mark.parametrize(("wanted", "unit"), sorted(TABLE))
def test_steps_from_each_condition(wanted, unit):
    expected = TABLE[wanted, unit]
    if isinstance(expected, str):
        with pytest.raises(Refused, match=expected):
            steps_to(wanted, unit)
    else:
        assert steps_to(wanted, unit) == expected


def test_a_state_or_condition_it_does_not_know_is_an_error():
    with pytest.raises(ValueError, match="no steps from 'running' to 'reloaded'"):
        steps_to("reloaded", "running")
    with pytest.raises(ValueError, match="no steps from 'dead' to 'started'"):
        steps_to("started", "dead")


def show(active, sub):
    return parse_show("vllm-tiny.service", f"LoadState=loaded\nActiveState={active}\nSubState={sub}\n")


@pytest.mark.parametrize(
    ("active", "sub", "sleeping", "expected"),
    [
        ("inactive", "dead", None, "stopped"),
        ("failed", "failed", None, "stopped"),
        # systemd waits RestartSec before it starts a unit whose main process died: not running.
        ("activating", "auto-restart", None, "restarting"),
        ("activating", "start", None, "running"),  # still loading: it runs
        ("active", "running", None, "running"),  # no sleep mode
        ("active", "running", False, "running"),
        ("active", "running", True, "asleep"),
        ("deactivating", "stop-sigterm", False, "running"),
    ],
)
def test_condition_of_a_unit(active, sub, sleeping, expected):
    assert condition(show(active, sub), sleeping) == expected
