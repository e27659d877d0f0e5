"""vllm_service's options: where the unit, URL, key and timeouts come from, and bad input refused before any act."""

import json
import math

import pytest
from ansible.module_utils import basic

from ansible_collections.llmops.vllm.plugins.module_utils.service import lifecycle
from ansible_collections.llmops.vllm.plugins.modules import vllm_service

OLD_KEY = "old-instance-key-7c1"


@pytest.fixture(autouse=True)
def no_process_of_this_machine(monkeypatch):
    """A stop looks in /proc for orphans of its unit, and ends them: here it finds none, so that a test never ends
    the processes of a server that runs on this machine under the same unit name (a local host's vllm-tiny)."""
    monkeypatch.setattr(lifecycle, "list_processes", lambda proc: [])


@pytest.fixture
def commands(monkeypatch):
    """Every command the module runs; systemctl show answers that the unit is loaded and stopped."""
    ran = []

    def run_command(self, command, **_kwargs):
        ran.append(command)
        if command[:2] == ["systemctl", "show"]:
            return 0, "LoadState=loaded\nActiveState=inactive\nSubState=dead\nMainPID=0\n", ""
        return 0, "", ""

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    return ran


@pytest.fixture
def started_with(monkeypatch):
    """Stand in for the start itself and keep the settings it was given."""
    seen = []

    def start(self, before):
        seen.append(self.settings)
        return {"systemd_start": 0.1, "load": 1.0, "elapsed": 1.1}

    monkeypatch.setattr(vllm_service.Lifecycle, "start", start)
    monkeypatch.setattr(vllm_service.Unit, "last_engine_death", lambda self, stopped: None)
    return seen


def test_an_instance_starts_with_its_own_key_and_load_timeout(
    run_module, tmp_path, commands, started_with, write_instance
):
    """The rollback's defect: an old instance came back with today's key and a global 600 s load timeout."""
    write_instance(tmp_path, "kimi_k25", 8001, load_timeout=1800, key=OLD_KEY, host="127.0.0.2")
    result = run_module(vllm_service.main, {"instance": "kimi_k25", "config_dir": str(tmp_path), "state": "started"})
    [settings] = started_with
    assert result["unit"] == "vllm-kimi_k25.service" and result["changed"] is True
    assert settings.load_timeout == 1800 and settings.api_key == OLD_KEY
    # It waits where the server listens, not at 127.0.0.1.
    assert (settings.url, settings.served_name) == ("http://127.0.0.2:8001", "kimi_k25-served")
    assert (settings.drain_timeout, settings.stop_timeout) == (30, 45)
    assert OLD_KEY not in json.dumps(result)


def test_timeouts_given_replace_the_record_s(run_module, tmp_path, commands, started_with, write_instance):
    write_instance(tmp_path, "tiny", 8000, load_timeout=300, key="k")
    args = {"instance": "tiny", "config_dir": str(tmp_path), "state": "started", "load_timeout": 20, "stop_timeout": 5}
    run_module(vllm_service.main, args)
    assert (started_with[0].load_timeout, started_with[0].stop_timeout, started_with[0].drain_timeout) == (20, 5, 30)


def test_a_unit_by_name_keeps_the_defaults(run_module, commands, started_with):
    run_module(vllm_service.main, {"name": "vllm-tiny", "state": "started", "served_name": "tiny"})
    [settings] = started_with
    assert (settings.url, settings.load_timeout, settings.stop_timeout, settings.api_key) == (
        "http://127.0.0.1:8000",
        600,
        30,
        None,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"load_timeout": -1}, "load_timeout must be more than 0 seconds, got -1.0"),
        ({"load_timeout": math.inf}, "load_timeout must be more than 0 seconds, got inf"),
        ({"stop_timeout": 0}, "stop_timeout must be more than 0 seconds, got 0.0"),
        ({"kill_timeout": -2}, "kill_timeout must be more than 0 seconds, got -2.0"),
        ({"orphan_grace": -0.5}, "orphan_grace must be more than 0 seconds, got -0.5"),
        ({"poll_interval": 0}, "poll_interval must be more than 0 seconds, got 0.0"),
        ({"drain_timeout": -3}, "drain_timeout must be 0 (no drain) or more seconds, got -3"),
        ({"drain_timeout": math.nan}, "drain_timeout must be 0 (no drain) or more seconds, got nan"),
        ({"journal_lines": 0}, "journal_lines must be 1 or more, got 0"),
        ({"load_timeout": "soon"}, "argument 'load_timeout' is of type str and we were unable to convert to float"),
        (
            {"url": "127.0.0.1:8000"},
            "url must be the server's base URL such as http://127.0.0.1:8000, got '127.0.0.1:8000'",
        ),
        ({"name": "vllm tiny"}, "name must be a systemd unit name such as vllm-tiny.service, got 'vllm tiny'"),
        ({"name": ""}, "name must be a systemd unit name such as vllm-tiny.service, got ''"),
        ({"served_name": None}, "served_name is required to start the unit (state=started), or give instance"),
        ({"name": None}, "one of the following is required: name, instance"),
        ({"instance": "tiny"}, "parameters are mutually exclusive: instance|name"),
        ({"name": None, "served_name": None, "instance": "gone"}, "No instance record for gone in"),
        ({"state": "reloaded"}, "value of state must be one of: started, stopped, restarted, asleep, got: reloaded"),
    ],
)
def test_bad_input_is_refused_before_any_command(run_module, tmp_path, commands, args, message):
    base = {"name": "vllm-tiny.service", "state": "started", "served_name": "tiny", "config_dir": str(tmp_path)}
    result = run_module(
        vllm_service.main, {key: value for key, value in {**base, **args}.items() if value is not None}, fails=True
    )
    assert message in result["msg"]
    assert commands == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"load_timeout": -1}, "load_timeout must be more than 0 seconds, got -1.0"),
        ({"kill_timeout": 0}, "kill_timeout must be more than 0 seconds, got 0.0"),
        ({"drain_timeout": -3}, "drain_timeout must be 0 (no drain) or more seconds, got -3"),
        ({"journal_lines": 0}, "journal_lines must be 1 or more, got 0"),
        ({"instance": "../tiny"}, "instance must be letters, digits and '_.-', starting with a letter or digit"),
    ],
)
def test_bad_input_with_an_instance_is_refused_before_its_record_is_read(
    run_module, tmp_path, commands, monkeypatch, args, message
):
    monkeypatch.setattr(vllm_service, "find", lambda *_args: pytest.fail("the record was read"))
    base = {"instance": "tiny", "config_dir": str(tmp_path), "state": "started"}
    result = run_module(vllm_service.main, {**base, **args}, fails=True)
    assert message in result["msg"]
    assert commands == []


def test_an_instance_whose_record_is_outdated_is_refused_before_any_command(run_module, tmp_path, commands):
    (tmp_path / "old.json").write_text(json.dumps({"instance": "old", "unit": "vllm-old.service", "port": 8000}))
    result = run_module(
        vllm_service.main, {"instance": "old", "config_dir": str(tmp_path), "state": "stopped"}, fails=True
    )
    assert result["msg"].startswith("The instance record of old was written by an older release of llmops.vllm")
    assert commands == []


# ---- one decision for check mode and the real run -------------------------------------------------------

# systemctl show's answer for each condition of the unit (sleeping comes from the server's /is_sleeping).
SHOW = {
    "stopped": "ActiveState=inactive\nSubState=dead\nMainPID=0",
    "restarting": "ActiveState=activating\nSubState=auto-restart\nMainPID=0",
    "running": "ActiveState=active\nSubState=running\nMainPID=100",
    "asleep": "ActiveState=active\nSubState=running\nMainPID=100",
}
ORPHAN_PID = 4242


class Orphan:
    def as_dict(self):
        return {"pid": ORPHAN_PID, "cmdline": "VLLM::EngineCore"}


@pytest.fixture
def unit_in(monkeypatch):
    """`unit_in(condition, orphan=False)`: the unit as systemd and the server describe it, and every act the
    lifecycle is asked for recorded instead of done (the list returned)."""
    acts = []

    def set_up(unit_condition, orphan=False):
        show = f"LoadState=loaded\n{SHOW[unit_condition]}\n"
        sleeping = unit_condition == "asleep"
        monkeypatch.setattr(
            basic.AnsibleModule, "run_command", lambda self, command, **_: (0, show, "") if "show" in command else None
        )
        monkeypatch.setattr(vllm_service.Unit, "last_engine_death", lambda self, stopped: None)
        monkeypatch.setattr(vllm_service, "is_sleeping", lambda url: sleeping if unit_condition != "stopped" else None)
        monkeypatch.setattr(vllm_service.Lifecycle, "asleep", lambda self: sleeping)
        monkeypatch.setattr(vllm_service.Lifecycle, "find_orphans", lambda self, before: [Orphan()] if orphan else [])

        def stop(self, before):
            acts.append("stop")
            ended = [ORPHAN_PID] if orphan and self.settings.kill_orphans else []
            orphans = {"found": [Orphan().as_dict()] if orphan else [], "terminated": ended, "killed": []}
            report = {"in_flight": 0, "drain": None, "aborted_requests": 0, "aborted_requests_bound": "exact"}
            report["refused_requests"] = 0
            report["escalated"] = False
            return {**report, "api_server_hang": None, "orphans": orphans, "elapsed": 1.0}

        def act(step, report):
            def record(self, *_before):
                acts.append(step)
                return report

            monkeypatch.setattr(vllm_service.Lifecycle, step, record)

        monkeypatch.setattr(vllm_service.Lifecycle, "stop", stop)
        act("start", {"systemd_start": 0.1, "load": 1.0, "elapsed": 1.1})
        act("wake", {"wake": 0.1, "elapsed": 0.2})
        act("wait_ready", {"load": 0.0, "elapsed": 0.0})
        act("sleep", {"level": 1, "drain": None, "aborted_requests": 0, "sleep": 0.5})
        return acts

    return set_up


# The lifecycle's acts, in order, that each wanted state takes from each condition.
ACTS = {
    ("started", "stopped"): ["start"],
    ("started", "restarting"): ["start"],
    ("started", "running"): ["wait_ready"],
    ("started", "asleep"): ["wake"],
    ("stopped", "stopped"): ["stop"],  # for the orphans
    ("stopped", "restarting"): ["stop"],
    ("stopped", "running"): ["stop"],
    ("stopped", "asleep"): ["stop"],
    ("restarted", "stopped"): ["stop", "start"],
    ("restarted", "restarting"): ["stop", "start"],
    ("restarted", "running"): ["stop", "start"],
    ("restarted", "asleep"): ["stop", "start"],
    ("asleep", "running"): ["wait_ready", "sleep"],
    ("asleep", "asleep"): [],
}


@pytest.mark.parametrize(("orphan", "kill_orphans"), [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize(("wanted", "unit_condition"), sorted(ACTS))
def test_check_mode_predicts_what_the_real_run_does(run_module, unit_in, wanted, unit_condition, orphan, kill_orphans):
    acts = unit_in(unit_condition, orphan)
    args = {"name": "vllm-tiny.service", "state": wanted, "served_name": "tiny", "kill_orphans": kill_orphans}
    predicted = run_module(vllm_service.main, {**args, "_ansible_check_mode": True})
    assert acts == []
    done = run_module(vllm_service.main, args)
    assert acts == ACTS[wanted, unit_condition]
    assert predicted["changed"] == done["changed"]
    # An orphan of a stopped unit is found before the stop; others appear only once the unit has stopped.
    if unit_condition == "stopped" and "stop" in acts:
        assert predicted["orphans"] == done["stop"]["orphans"]["found"]
    if wanted == unit_condition == "asleep":
        assert done["msg"] == "vllm-tiny.service: already asleep"


def test_an_orphan_is_ended_unless_asked_not_to(run_module, unit_in):
    unit_in("stopped", orphan=True)
    ended = run_module(vllm_service.main, {"name": "vllm-tiny.service", "state": "stopped"})
    assert ended["changed"] and ended["stop"]["orphans"]["terminated"] == [ORPHAN_PID]
    left = run_module(vllm_service.main, {"name": "vllm-tiny.service", "state": "stopped", "kill_orphans": False})
    assert not left["changed"] and left["stop"]["orphans"]["terminated"] == []


@pytest.mark.parametrize("check_mode", [True, False])
@pytest.mark.parametrize("unit_condition", ["stopped", "restarting"])
def test_only_a_running_server_goes_to_sleep(run_module, unit_in, unit_condition, check_mode):
    acts = unit_in(unit_condition)
    args = {"name": "vllm-tiny.service", "state": "asleep", "served_name": "tiny", "_ansible_check_mode": check_mode}
    result = run_module(vllm_service.main, args, fails=True)
    active = {"stopped": "inactive", "restarting": "activating"}[unit_condition]
    assert result["msg"] == f"vllm-tiny.service is {active}: only a running server can go to sleep; start it first"
    assert acts == []


@pytest.mark.parametrize("check_mode", [True, False])
def test_a_stop_that_leaves_the_unit_failed_resets_it_and_says_how_its_run_ended(
    run_module, unit_in, monkeypatch, check_mode
):
    """A failed unit makes the host read `degraded`: the stop resets it, after saying how its run ended."""
    acts = unit_in("running")
    failed = "ActiveState=failed\nSubState=failed\nMainPID=0\nResult=signal\nExecMainCode=2\nExecMainStatus=9"
    shown = {"now": SHOW["running"]}
    commands = []

    def run_command(self, command, **_):
        commands.append(command)
        if "reset-failed" in command:
            shown["now"] = SHOW["stopped"]
            return 0, "", ""
        return 0, f"LoadState=loaded\n{shown['now']}\n", ""

    def stop(self, before):
        acts.append("stop")
        shown["now"] = failed  # killed past its stop timeout
        orphans = {"found": [], "terminated": [], "killed": []}
        return {"in_flight": 0, "drain": None, "aborted_requests": 0, "aborted_requests_bound": "exact",
                "refused_requests": 0, "escalated": True, "api_server_hang": None, "orphans": orphans,
                "elapsed": 1.0}  # fmt: skip

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(vllm_service.Lifecycle, "stop", stop)
    if check_mode:
        shown["now"] = failed  # a unit that had crashed by itself
    result = run_module(vllm_service.main, {"name": "vllm-tiny.service", "state": "stopped",
                                            "_ansible_check_mode": check_mode})  # fmt: skip
    assert result["changed"]
    assert result["reset_failed"] == "result signal, main process killed with status 9"
    assert "its failed state reset (result signal, main process killed with status 9)" in result["msg"]
    resets = [command for command in commands if "reset-failed" in command]
    if check_mode:
        assert resets == [] and result["active_state"] == "failed"
    else:
        assert resets == [["systemctl", "reset-failed", "vllm-tiny.service"]] and result["active_state"] == "inactive"


def test_a_stop_that_leaves_the_unit_inactive_resets_nothing(run_module, unit_in):
    unit_in("running")
    result = run_module(vllm_service.main, {"name": "vllm-tiny.service", "state": "stopped"})
    assert result["reset_failed"] is None


@pytest.mark.parametrize("shown, returned", [("UnitFileState=enabled\n", "enabled"), ("", "")])
def test_the_result_says_what_systemd_says_of_the_unit_at_boot(run_module, monkeypatch, shown, returned):
    """The server role leaves systemd_service out where the unit is already enabled as asked."""

    def run_command(self, command, **_kwargs):
        if command[:2] == ["systemctl", "show"]:
            return 0, f"LoadState=loaded\nActiveState=inactive\nSubState=dead\nMainPID=0\n{shown}", ""
        return 0, "", ""

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    result = run_module(vllm_service.main, {"name": "vllm-tiny.service", "state": "stopped"})
    assert result["unit_file_state"] == returned
