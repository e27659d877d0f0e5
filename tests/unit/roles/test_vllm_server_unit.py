"""The vllm_server role's unit as Ansible renders it, and its preflight's refusals as Ansible runs them.

The unit is rendered from roles/vllm_server/templates/vllm.service.j2 with the role's defaults and vars through
Ansible's own templating (the collection's filters included), and its device rules are resolved against the
/proc/devices of an H200 and of a driver-535 host as systemd resolves them. The preflight runs for real with
ansible-playbook on this machine, in check mode, and must refuse before anything is written.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.llmops.vllm.plugins.module_utils.service.sandbox import allowed_majors, character_devices

ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles" / "vllm_server"
PROC_DEVICES = ROOT / "tests" / "unit" / "fixtures" / "proc-devices"
REQUIRED = {
    "vllm_server_instance": "tiny",
    "vllm_server_model_path": "/var/lib/vllm/models/tiny",
    "vllm_server_served_name": "tiny",
    "vllm_server_vllm_version": "0.26.0",
}


def _trusted(value):
    """Role files are trusted templates, as Ansible trusts them when it loads a role."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {key: _trusted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_trusted(item) for item in value]
    return value


def render_unit(template="vllm.service.j2", **overrides):
    variables = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    variables |= yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    variables |= REQUIRED | overrides | {"ansible_managed": "Ansible managed"}
    variables = _trusted(variables)
    command = Templar(loader=DataLoader(), variables=variables).template(
        trust_as_template("{{ __vllm_server_command_line }}")
    )
    # What the role registers when it writes the instance's files: the record's path.
    written = {"__vllm_server_command": command, "__vllm_server_files": {"path": "/etc/vllm/tiny.json"}}
    templar = Templar(loader=DataLoader(), variables=variables | written)
    return templar.template(trust_as_template((ROLE / "templates" / template).read_text()))


def directives(unit, name):
    return [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(name + "=")]


@pytest.mark.parametrize("fixture", ["h200-580.txt", "driver-535.txt"])
def test_the_rendered_device_rules_open_the_gpus_the_control_device_and_uvm_on_old_and_new_drivers(fixture):
    devices = character_devices((PROC_DEVICES / fixture).read_text())
    rules = directives(render_unit(), "DeviceAllow")
    assert all(rule.endswith(" rw") for rule in rules)
    uvm = next(major for major, names in devices.items() if "nvidia-uvm" in names)
    caps = next(major for major, names in devices.items() if "nvidia-caps" in names)
    assert allowed_majors(rules, devices) == {195, uvm, caps}


def test_the_rules_before_nvidia_frontend_was_added_would_open_no_gpu_on_a_535_driver():
    devices = character_devices((PROC_DEVICES / "driver-535.txt").read_text())
    rules = [rule for rule in directives(render_unit(), "DeviceAllow") if not rule.startswith("char-nvidia-frontend")]
    assert 195 not in allowed_majors(rules, devices)


def test_the_cpu_build_gets_no_nvidia_device_and_no_sandbox_renders_no_device_policy():
    assert directives(render_unit(vllm_server_device="cpu"), "DeviceAllow") == []
    assert directives(render_unit(vllm_server_device="cpu"), "DevicePolicy") == ["closed"]
    unsandboxed = render_unit(vllm_server_hardening=False)
    for name in ("DevicePolicy", "DeviceAllow", "SystemCallFilter", "ProtectHome", "PrivateTmp"):
        assert directives(unsandboxed, name) == []


def test_locked_memory_is_systemds_default_unless_the_role_is_told_infinity():
    assert directives(render_unit(), "LimitMEMLOCK") == []
    assert directives(render_unit(vllm_server_limit_memlock="infinity"), "LimitMEMLOCK") == ["infinity"]


def test_a_system_call_added_to_the_filter_comes_after_the_privileged_set_it_is_taken_back_from():
    unit = render_unit(vllm_server_system_call_filter=["@system-service", "~@privileged", "pidfd_getfd"])
    # systemd applies SystemCallFilter= lines in order: an allow line after a ~ line adds the call back.
    assert directives(unit, "SystemCallFilter") == ["@system-service", "~@privileged", "pidfd_getfd"]
    assert directives(render_unit(), "SystemCallFilter") == ["@system-service", "~@privileged"]


def test_the_new_options_are_declared_with_their_defaults():
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    for name in ("vllm_server_limit_memlock", "vllm_server_device_allow"):
        assert specs[name]["default"] == defaults[name], name


@pytest.fixture
def run_preflight(run_role_tasks):
    """The role's preflight on this machine, in check mode, as a play runs it: (rc, failure messages). This machine
    runs no systemd to ask which limits a unit gets: that probe is the integration tests' (test_clashes.py)."""
    no_limits = {"vllm_server_limit_nofile": 0, "vllm_server_limit_memlock": ""}
    return lambda **variables: run_role_tasks("vllm_server", "preflight", REQUIRED | no_limits | variables)


def test_the_preflight_passes_the_defaults_and_reads_this_hosts_devices(run_preflight):
    # /proc/devices of this machine is read for real; it has no NVIDIA driver, so no group can miss one.
    assert run_preflight(vllm_server_python="/usr/bin/python3") == (0, [])


def test_the_preflight_refuses_weights_in_tmp_and_expandable_segments_naming_each(run_preflight):
    rc, failures = run_preflight(
        vllm_server_python="/usr/bin/python3",
        vllm_server_model_path="/tmp/tinyllama",
        vllm_server_env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    )
    assert rc == 2
    (message,) = failures
    assert message.startswith("Instance tiny cannot run under its unit's sandbox: ")
    assert (
        "the weights (vllm_server_model_path) is /tmp/tinyllama, under /tmp, which the unit's PrivateTmp=yes" in message
    )
    assert "PYTORCH_CUDA_ALLOC_CONF turns on torch's expandable segments" in message


@pytest.fixture
def link_outside_tmp():
    """A directory in /dev/shm, which neither ProtectHome= nor PrivateTmp= hides, for symbolic links."""
    directory = Path(tempfile.mkdtemp(prefix="llmops-sandbox-", dir="/dev/shm"))
    yield directory
    shutil.rmtree(directory)


def test_the_preflight_follows_the_venvs_interpreter_to_the_python_it_links_to(run_preflight, link_outside_tmp):
    interpreter = link_outside_tmp / "python"
    base = "/root/.pyenv/versions/3.11.7/bin/python3.11"
    interpreter.symlink_to(base)
    rc, failures = run_preflight(vllm_server_python=str(interpreter))
    assert rc == 2
    assert f"(vllm_server_python) is {base}, under /root, which the unit's ProtectHome=yes" in failures[0]


def render_environment(**overrides):
    variables = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    variables |= yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    variables = _trusted(variables | REQUIRED | overrides)
    return Templar(loader=DataLoader(), variables=variables).template(
        trust_as_template("{{ __vllm_server_environment }}")
    )


@pytest.mark.parametrize("home", ["/var/lib/vllm", "/srv/vllm"])
def test_pythons_bytecode_and_vllms_caches_go_under_the_home_that_the_sandbox_lets_the_server_write(home):
    """On the H200 the machine's torch had no bytecode (0 of 2,141 modules compiled): every start of each of the
    server's two processes compiled torch again, about 10 s each. The interpreter keeps what it compiles under the
    service's home, the one directory the unit may write, so the next start reads it."""
    unit = render_unit(vllm_server_home=home)
    environment = render_environment(vllm_server_home=home, vllm_server_model="tiny", vllm_server_vllm_version="0.32.0")
    assert directives(unit, "ReadWritePaths") == [home]
    assert environment["PYTHONPYCACHEPREFIX"] == f"{home}/.cache/python-bytecode"
    # vLLM's compile cache, one directory per release and entry, and Triton's kernels in it: none in the private /tmp.
    assert environment["HOME"] == home
    assert environment["VLLM_CACHE_ROOT"] == f"{home}/.cache/vllm/0.32.0/tiny"
    assert environment["TRITON_CACHE_DIR"] == f"{home}/.cache/vllm/0.32.0/tiny/triton"
    assert directives(unit, "PrivateTmp") == ["yes"]


def start_preparations(unit):
    """The unit's ExecStartPre= commands as systemd runs them: quotes undone, `$$` and `%%` read as `$` and `%`."""
    return [
        [argument.replace("$$", "$").replace("%%", "%") for argument in shlex.split(line)]
        for line in directives(unit, "ExecStartPre")
    ]


def test_the_entries_of_a_release_share_vllms_answers_about_model_classes(tmp_path):
    """vLLM imports a model's class in a Python process of its own at an entry's first start unless
    VLLM_CACHE_ROOT/modelinfos answers: a second entry of the same architecture finds the first one's answer. The
    commands run here as the unit runs them, on a new home, again, and where an older start left a directory."""
    home = tmp_path / "home"
    release = home / ".cache" / "vllm" / "0.26.0"
    for model in ("tiny", "tiny_v2"):
        commands = start_preparations(render_unit(vllm_server_home=str(home), vllm_server_model=model))
        for _start in (1, 2):
            for command in commands:
                subprocess.run(command, check=True)
        assert (release / model / "modelinfos").readlink() == Path("../modelinfos")
    (release / "modelinfos" / "llama.json").write_text("{}")
    assert (release / "tiny_v2" / "modelinfos" / "llama.json").read_text() == "{}"
    older = release / "tiny_old" / "modelinfos"
    older.mkdir(parents=True)
    for command in start_preparations(render_unit(vllm_server_home=str(home), vllm_server_model="tiny_old")):
        subprocess.run(command, check=True)
    assert older.is_dir() and not older.is_symlink() and list(older.iterdir()) == []


def test_a_cache_root_that_the_catalog_entry_chooses_is_left_as_the_user_made_it():
    unit = render_unit(vllm_server_env={"VLLM_CACHE_ROOT": "/var/lib/vllm/my-cache"})
    assert directives(unit, "ExecStartPre") == []


WORKER = {
    "role": "worker", "hosts": ["host-a", "host-b"], "head": {"name": "host-a", "address": "10.0.0.1"},
    "serves_api": False, "environment": {"VLLM_HOST_IP": "10.0.0.2"},
    "args": ["--data-parallel-size-local", "1", "--data-parallel-start-rank", "1", "--data-parallel-address",
             "10.0.0.1", "--data-parallel-rpc-port", "29550", "--headless"],
}  # fmt: skip


def test_a_headless_member_of_a_group_runs_vllm_serve_with_its_part_of_the_group():
    worker = WORKER
    (exec_start,) = directives(render_unit(vllm_server_group_member=worker), "ExecStart")
    argv = shlex.split(exec_start)
    assert argv[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
    assert argv[-9:] == worker["args"]
    (one_host,) = directives(render_unit(), "ExecStart")
    assert shlex.split(one_host)[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]


def test_a_group_member_starts_its_guard_and_one_host_has_none():
    assert directives(render_unit(vllm_server_group_member=WORKER), "Wants")[-1] == "llmops-vllm-guard-tiny.service"
    assert "llmops-vllm-guard" not in render_unit()


def test_the_guard_is_stopped_with_its_member_reads_the_record_and_has_no_key_on_its_command_line():
    guard = render_unit("vllm-group-guard.service.j2", vllm_server_group_member=WORKER, vllm_server_api_key="sk-1")
    assert directives(guard, "PartOf") == ["vllm-tiny.service"]
    (exec_start,) = directives(guard, "ExecStart")
    assert shlex.split(exec_start) == [
        "/opt/vllm/venv/bin/python", "/opt/vllm/llmops_vllm_group_guard.py", "--record", "/etc/vllm/tiny.json",
        "--state", "/var/lib/llmops-vllm-guard/tiny.json", "--interval", "10", "--timeout", "30", "--failures", "3",
    ]  # fmt: skip
    # Its restarts of the member outlast its own restarts, in the one directory it may write.
    assert directives(guard, "StateDirectory") == ["llmops-vllm-guard"]
    assert directives(guard, "EnvironmentFile") == ["/etc/vllm/tiny.env"] and "sk-1" not in guard
    assert directives(guard, "CapabilityBoundingSet") == [""] and directives(guard, "ProtectSystem") == ["strict"]


def test_a_group_member_s_guard_needs_a_port_of_its_own(run_preflight):
    member = {"vllm_server_python": "/usr/bin/python3", "vllm_server_group_member": WORKER}
    assert run_preflight(**member) == (0, [])
    rc, (message,) = run_preflight(**member, vllm_server_port=60000)
    assert rc == 2 and "on port 70000, no port" in message and "set vllm_server_group_guard_port" in message
    rc, (message,) = run_preflight(**member, vllm_server_port=9000, vllm_server_group_guard_port=9000)
    assert rc == 2 and "on port 9000, the instance's own" in message
