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
# A variable of the collection, a role's own internal ones (__vllm_ROLE_...) included.
IDENTIFIER = re.compile(r"(?<![\w])(?:__)?(vllm_[a-z0-9_]+)")
# A plugin or a role by its full name is not a variable.
FULL_NAME = re.compile(r"llmops\.vllm\.\w+")
# The inventory's own setting, as a playbook reads it (see test_playbooks_read_role_variables_from_the_inventory).
INVENTORY_READ = re.compile(r"hostvars\[inventory_hostname\]\.(vllm_[a-z0-9_]+)")
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
    """Every string value inside `value` (not the keys of its mappings, nor tags, which name no variable)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key != "tags":
                yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def identifiers(text):
    return IDENTIFIER.findall(FULL_NAME.sub("", text))


def owner(identifier):
    """The role whose variable this is (the longest role name it is or starts with), or None."""
    roles = [role for role in ROLES if identifier == role or identifier.startswith(role + "_")]
    return max(roles, key=len) if roles else None


def specs_of(role):
    return yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]


def options_of(role, entry_point="main"):
    """The inputs that an entry point declares; a task file without a spec of its own takes the role's (main)."""
    specs = specs_of(role)
    return specs.get(entry_point, specs["main"]).get("options", {})


def all_options(role):
    return {name: spec for entry_point in specs_of(role).values() for name, spec in entry_point["options"].items()}


def includes_of(path):
    """(task, role, entry point) of each role that a task file or playbook runs."""
    for task in tasks_of(path):
        for key in INCLUDES:
            if key in task:
                yield task, task[key]["name"].removeprefix("llmops.vllm."), task[key].get("tasks_from", "main")


def included_roles(role):
    return {included for path in role_files(role, "tasks") for _task, included, _entry in includes_of(path)}


def collection_settings():
    """The settings of the whole collection (vllm_config_dir, ...): declared by roles, named after none."""
    return {name for role in ROLES for name in all_options(role) if owner(name) is None}


def reads_of(role):
    """Every variable of the collection that a role's task, vars and template files read."""
    texts = [text for path in role_files(role, "tasks", "vars") for text in strings(yaml.safe_load(path.read_text()))]
    texts += [template.read_text() for template in sorted((ROOT / "roles" / role / "templates").glob("*.j2"))]
    return {identifier for text in texts for identifier in identifiers(text)}


def foreign_reads(role):
    """(file, variable) of each variable of another role that this role's files read."""
    allowed = {f"{name}_result" for name in included_roles(role)}
    reads = []
    for path in role_files(role, "tasks", "defaults", "vars"):
        # Only values are read: the keys are this role's variables, or the inputs it gives a role it includes.
        for text in strings(yaml.safe_load(path.read_text())):
            for identifier in identifiers(text):
                if owner(identifier) not in (None, role) and identifier not in allowed:
                    reads.append((path.relative_to(ROOT).as_posix(), identifier))
    for template in sorted((ROOT / "roles" / role / "templates").glob("*.j2")):
        for identifier in identifiers(template.read_text()):
            if owner(identifier) not in (None, role):
                reads.append((template.relative_to(ROOT).as_posix(), identifier))
    return sorted(set(reads))


@pytest.mark.parametrize("role", ROLES)
def test_a_role_reads_only_its_own_variables_and_the_results_of_roles_it_runs(role):
    assert foreign_reads(role) == []


def facts_set(role):
    """(file, name) of each variable that a role's tasks set: set_fact keys, registered results, loop variables."""
    found = []
    for path in role_files(role, "tasks"):
        for task in tasks_of(path):
            loop_var = (task.get("loop_control") or {}).get("loop_var")
            names = [*(task.get("ansible.builtin.set_fact") or {}), task.get("register"), loop_var]
            found += [(path.name, name) for name in names if name and name != "cacheable"]
    return found


@pytest.mark.parametrize("role", ROLES)
def test_a_role_sets_its_own_internal_variables_and_its_result_alone(role):
    """What a role keeps for itself is __ROLE_...; what it gives back is ROLE_result, documented at its door."""
    assert [(path, name) for path, name in facts_set(role)
            if not name.startswith(f"__{role}_") and name != f"{role}_result"] == []  # fmt: skip


def test_the_read_of_another_role_s_output_is_caught():
    """A role's output named as the role itself (the bench role's fact was once `vllm_bench`) is still that role's."""
    assert owner("vllm_bench") == "vllm_bench" and owner("vllm_bench_result") == "vllm_bench"
    assert owner("vllm_server_port") == "vllm_server" and owner("vllm_config_dir") is None
    assert identifiers("{{ __vllm_swap_record.unit }} {{ x | llmops.vllm.vllm_swap_result }}") == ["vllm_swap_record"]


@pytest.mark.parametrize("role", ROLES)
def test_a_role_declares_its_own_settings_and_the_collection_s_never_another_role_s(role):
    """The deploy's door once copied 23 options of the server and weights roles: a role it runs reads its own
    settings from the inventory through its own door, and the includer neither declares nor passes them on."""
    assert [name for name in all_options(role) if owner(name) not in (role, None)] == []


def test_the_collection_s_settings_are_the_records_the_hub_the_mirror_and_the_catalog():
    assert collection_settings() == {
        "vllm_config_dir",
        "vllm_hub_endpoint",
        "vllm_hub_token",
        "vllm_mirror",
        "vllm_catalog_paths",
    }


@pytest.mark.parametrize("name", sorted(collection_settings()))
def test_a_setting_of_the_collection_is_one_declaration_wherever_a_role_reads_it(name):
    """The records directory had ten names, the mirror five: now one name, read by every role that needs it,
    each declaring it word for word alike, with the same default; no role reads it undeclared."""
    readers = sorted(role for role in ROLES if name in reads_of(role))
    declarers = sorted(role for role in ROLES if name in all_options(role))
    assert readers == declarers, (readers, declarers)
    declarations = {role: all_options(role)[name] for role in declarers}
    assert len({yaml.safe_dump(spec) for spec in declarations.values()}) == 1, declarations
    defaults = {
        role: (yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {})[name]
        for role in declarers
    }
    assert set(map(repr, defaults.values())) == {repr(next(iter(declarations.values())).get("default"))}, defaults


@pytest.mark.parametrize("path", all_task_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_no_task_sets_a_setting_of_the_collection_for_the_roles_it_runs(path):
    """A setting given with -e wins over any task's vars or fact: the tune once gave the swap its candidates'
    directory as vllm_catalog_paths, and a user's -e vllm_catalog_paths hid every candidate. What a role adds to a
    setting goes through an option of the role it runs (vllm_swap_model_catalog_paths)."""
    settings = collection_settings()
    set_here = [
        (task.get("name"), name)
        for task in tasks_of(path)
        for values in (task.get("vars"), task.get("ansible.builtin.set_fact"), task.get("set_fact"))
        if isinstance(values, dict)
        for name in values
        if name in settings
    ]
    assert set_here == []


@pytest.mark.parametrize("role", ROLES)
def test_every_role_declares_its_entry_points(role):
    specs = specs_of(role)
    entry_points = {path.stem for path in role_files(role, "tasks")}
    assert "main" in specs and set(specs) <= entry_points
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    assert set(defaults) == set(all_options(role)), "defaults/main.yml and meta/argument_specs.yml name other variables"


def test_playbooks_are_lists_of_roles():
    assert not (ROOT / "playbooks" / "tasks").exists()
    for path in PLAYBOOKS:
        for play in yaml.safe_load(path.read_text()):
            tasks = [task for key in ("pre_tasks", "tasks", "post_tasks") for task in play.get(key) or []]
            assert all(any(key in task for key in INCLUDES) for task in tasks), (
                f"{path.name}: a task that is not a role"
            )


def playbook_values(path):
    """The strings that a playbook gives its roles: their vars and the vars of the tasks that run them."""
    for play in yaml.safe_load(path.read_text()):
        for role in play.get("roles") or []:
            yield from strings(role.get("vars") or {})
        for task in (task for key in ("pre_tasks", "tasks", "post_tasks") for task in play.get(key) or []):
            yield from strings(task.get("vars") or {})


@pytest.mark.parametrize("path", PLAYBOOKS, ids=[path.name for path in PLAYBOOKS])
def test_playbooks_read_role_variables_from_the_inventory(path):
    """A playbook gives a role what the inventory says: vllm_swap_default_port from vllm_server_port. Read plainly,
    vllm_server_port would be the value that vllm_deploy passes on to vllm_server under that name, which is the
    default port again: a loop. hostvars holds the inventory's (and -e's) setting alone."""
    plays = yaml.safe_load(path.read_text())
    ran = {included for _task, included, _entry in includes_of(path)} | {
        role["role"].removeprefix("llmops.vllm.") for play in plays for role in play.get("roles") or []
    }
    plain = []
    for text in playbook_values(path):
        for identifier in identifiers(INVENTORY_READ.sub("", text)):
            if owner(identifier) is not None and identifier not in {f"{name}_result" for name in ran}:
                plain.append(identifier)
    assert plain == []


def test_every_reader_of_the_records_is_told_where_they_are():
    """config_dir reaches every read of the records: a changed records directory once hid every instance."""
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


def test_the_module_defaults_group_holds_every_module():
    """group/llmops.vllm.vllm in module_defaults reaches each module of the collection."""
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())
    modules = sorted(path.stem for path in (ROOT / "plugins" / "modules").glob("*.py") if not path.stem.startswith("_"))
    assert runtime["action_groups"]["vllm"] == modules


CONDITIONS = ("when", "failed_when", "changed_when", "until", "that")
JINJA = re.compile(r"\{\{(.*?)\}\}|\{%-?(.*?)-?%\}", re.S)


def expressions(value, condition=False):
    """The Jinja expressions inside a task file's value: a condition whole, else what {{ }} and {% %} enclose."""
    if isinstance(value, str):
        yield from (
            [value] if condition else (body for match in JINJA.finditer(value) for body in match.groups() if body)
        )
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from expressions(item, condition or key in CONDITIONS)
    elif isinstance(value, list):
        for item in value:
            yield from expressions(item, condition)


def bool_reads_without_the_filter(text, names):
    return [name for name in names if re.search(rf"(?<!\w){name}\b(?!\s*\|\s*bool\b)", text)]


@pytest.mark.parametrize("role", ROLES)
def test_a_bool_setting_is_read_through_the_bool_filter(role):
    """`-e vllm_rollout_gate=false` is the string 'false', and a role's argument spec checks it without converting
    it: read plainly, it is true, and the rollout gated every host that its user had told it not to gate."""
    names = {name for name, spec in all_options(role).items() if spec.get("type") == "bool"}
    texts = [
        text
        for path in role_files(role, "tasks", "vars", "handlers")
        for text in expressions(yaml.safe_load(path.read_text()))
    ]
    texts += [
        text
        for template in sorted((ROOT / "roles" / role / "templates").glob("*.j2"))
        for text in expressions(template.read_text())
    ]
    assert sorted({name for text in texts for name in bool_reads_without_the_filter(text, names)}) == []


def test_a_plain_read_of_a_bool_setting_is_caught():
    names = {"vllm_rollout_gate"}
    assert bool_reads_without_the_filter("x if vllm_rollout_gate else {}", names) == ["vllm_rollout_gate"]
    assert bool_reads_without_the_filter("x if vllm_rollout_gate | bool else {}", names) == []
    assert list(expressions({"when": "vllm_rollout_gate", "msg": "set vllm_rollout_gate={{ a }}"})) == [
        "vllm_rollout_gate",
        " a ",
    ]
