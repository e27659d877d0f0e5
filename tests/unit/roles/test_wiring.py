"""How the roles and playbooks are wired: each role a room with a door, each instance's facts from its record.

Static checks of the YAML, so that a seam like a rollback's global timeout, a URL computed again, or a setting
that does not reach every reader shows here, before any host does.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
ROLES = sorted(path.name for path in (ROOT / "roles").iterdir() if path.is_dir())
PLAYBOOKS = sorted((ROOT / "playbooks").glob("*.yml"))
IDENTIFIER = re.compile(r"\b(vllm_[a-z0-9_]+)")
INCLUDES = ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role")


def role_files(role, *subdirs):
    for subdir in subdirs:
        yield from sorted((ROOT / "roles" / role / subdir).glob("*.yml"))


def tasks_of(path):
    """Every task of a task file or playbook, blocks and rescues flattened."""
    data = yaml.safe_load(path.read_text()) or []
    found = []

    def walk(items):
        for item in items or []:
            if not isinstance(item, dict):
                continue
            found.append(item)
            for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks"):
                walk(item.get(key))

    walk(data)
    return found


def all_task_files():
    files = [path for role in ROLES for path in role_files(role, "tasks")]
    return files + PLAYBOOKS + sorted((ROOT / "playbooks" / "tasks").glob("*.yml"))


def module_tasks(module):
    return [(path, task) for path in all_task_files() for task in tasks_of(path) if module in task]


def strings(value):
    """Every string value inside `value` (not the keys of its mappings)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def owner(identifier):
    """The role whose variable this is (the longest role name it starts with), or None (a role's own name too)."""
    roles = [role for role in ROLES if identifier.startswith(role + "_")]
    return max(roles, key=len) if roles else None


def included_roles(role):
    return {
        task[key]["name"].removeprefix("llmops.vllm.")
        for path in role_files(role, "tasks")
        for task in tasks_of(path)
        for key in INCLUDES
        if key in task
    }


def foreign_reads(role):
    """(file, variable) of each variable of another role that this role's files read."""
    allowed = {f"{name}_result" for name in included_roles(role)}
    reads = []
    for path in role_files(role, "tasks", "defaults", "vars"):
        # Only values are read: the keys are this role's variables, or the inputs it gives a role it includes.
        for text in strings(yaml.safe_load(path.read_text())):
            for identifier in IDENTIFIER.findall(text):
                if owner(identifier) not in (None, role) and identifier not in allowed:
                    reads.append((path.relative_to(ROOT).as_posix(), identifier))
    for template in sorted((ROOT / "roles" / role / "templates").glob("*.j2")):
        for identifier in IDENTIFIER.findall(template.read_text()):
            if owner(identifier) not in (None, role):
                reads.append((template.relative_to(ROOT).as_posix(), identifier))
    return sorted(set(reads))


@pytest.mark.parametrize("role", ROLES)
def test_a_role_reads_only_its_own_variables_and_the_results_of_roles_it_runs(role):
    assert foreign_reads(role) == []


@pytest.mark.parametrize("role", ROLES)
def test_every_role_declares_its_entry_points(role):
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    entry_points = {path.stem for path in role_files(role, "tasks")}
    assert "main" in specs and set(specs) <= entry_points
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    options = set().union(*(spec.get("options", {}) for spec in specs.values()))
    assert set(defaults) == options, "defaults/main.yml and meta/argument_specs.yml must name the same variables"


def test_playbooks_are_lists_of_roles():
    assert not (ROOT / "playbooks" / "tasks").exists()
    for path in PLAYBOOKS:
        for play in yaml.safe_load(path.read_text()):
            tasks = [task for key in ("pre_tasks", "tasks", "post_tasks") for task in play.get(key) or []]
            assert all(any(key in task for key in INCLUDES) for task in tasks), (
                f"{path.name}: a task that is not a role"
            )


def test_every_reader_of_the_records_is_told_where_they_are():
    """config_dir reaches every read of the records: a changed vllm_server_config_dir hid every instance."""
    readers = module_tasks("llmops.vllm.vllm_instance_info")
    assert readers
    unaware = [
        task["name"] for _path, task in readers if "config_dir" not in (task["llmops.vllm.vllm_instance_info"] or {})
    ]
    assert unaware == []


@pytest.mark.parametrize("module", ["llmops.vllm.vllm_service", "llmops.vllm.vllm_bench"])
def test_every_step_on_an_instance_takes_its_endpoint_key_and_timeouts_from_its_record(module):
    """The rollback waited a global 600 s with today's key; the swap waited at 127.0.0.1; bench.yml used
    vllm_server_port: each step names its instance, and the module reads the rest from the record."""
    steps = module_tasks(module)
    assert steps
    for path, task in steps:
        args = task[module]
        assert "instance" in args and "config_dir" in args, f"{path.name}: {task['name']}"
        given = {"url", "api_key", "load_timeout", "drain_timeout", "stop_timeout", "served_name"}
        for key in given & set(args):
            # Only a client on the controller is given the URL, and the key, as the record has them.
            assert "__vllm_bench_record" in args[key] or "__vllm_bench_url" in args[key], f"{path.name}: {key}"


def test_no_url_is_computed_outside_the_instance_record():
    texts = [
        (path, text)
        for path in all_task_files() + [p for role in ROLES for p in role_files(role, "defaults", "vars")]
        for text in strings(yaml.safe_load(path.read_text()))
    ]
    assert [(path.name, text) for path, text in texts if "http://" in text or "127.0.0.1" in text] == []
