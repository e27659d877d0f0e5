# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The instance record: the one source of truth about a vLLM instance on its host.

One JSON file per instance, CONFIG_DIR/INSTANCE.json, written when the instance is deployed
(llmops.vllm.vllm_instance) and read by everything that acts on it afterwards: its unit, where it listens
and where the host reaches it (the URL is computed here and nowhere else), its served name, its GPUs,
weights, interpreter and vLLM release, and the timeouts of its load, drain and stop. It names where the
instance's API key lives (the EnvironmentFile and the variable) and never holds the key: `api_key` reads it
from there for the modules that must send it.
"""

from __future__ import annotations

import ipaddress
import json
import os

from ansible_collections.llmops.vllm.plugins.module_utils.instance.host_instances import INSTANCE_NAME
from ansible_collections.llmops.vllm.plugins.module_utils.service.systemd import (
    environment_file,
    parse_environment_file,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.vllm_api import check_base_url

DEFAULT_CONFIG_DIR = "/etc/vllm"
# The record and the unit are world-readable; the EnvironmentFile, which holds the key, is root's alone.
RECORD_MODE = UNIT_MODE = 0o644
ENVIRONMENT_MODE = 0o600
RECORD_SUFFIX = ".json"
API_KEY_VARIABLE = "VLLM_API_KEY"
# A server listening on every address is reached from its host on loopback.
WILDCARD_HOSTS = ("0.0.0.0", "::")
TEXT_FIELDS = ("instance", "unit", "model", "served_name", "host", "url", "model_path", "python", "vllm_version")
TIMEOUT_FIELDS = {"load_timeout": 1, "drain_timeout": 0, "stop_timeout": 1}
# Fields added since the first release that an older record is read with, at the value it had then.
OPTIONAL_FIELDS = {"sleep_mode": False, "group": {}}
# A member of a multi-host group: its part of the group (empty for a one-host instance).
GROUP_ROLES = ("head", "worker")
FIELDS = (*TEXT_FIELDS, "port", "gpus", "layout", "secrets", *TIMEOUT_FIELDS, *OPTIONAL_FIELDS)
# What every record has had since the first release: enough to list an instance and check clashes.
CORE_FIELDS = ("instance", "unit", "port")
FIX = "deploy the instance again (playbooks/deploy.yml), or remove the file if the instance is gone"


class RecordError(ValueError):
    """A record that cannot be used, or one that is not there; the message names the file or the instance."""


def local_url(host: str, port: int) -> str:
    """Where the server listening on `host`:`port` is reached from its own host."""
    address = "127.0.0.1" if host in WILDCARD_HOSTS else host
    try:
        if ipaddress.ip_address(address).version == 6:
            address = f"[{address}]"
    except ValueError:  # a host name
        pass
    return f"http://{address}:{port}"


def group_url(host: str, port: int, group: dict) -> str:
    """Where the group that an instance belongs to serves: its own API server, or the head's for a member that
    serves no API (a headless worker); for a one-host instance its own."""
    if group and not group["serves_api"]:
        return local_url(group["head"]["address"], port)
    return local_url(host, port)


def remote_url(record: dict, address: str) -> str:
    """Where the instance is reached from elsewhere (the controller), through the host's `address`."""
    return local_url(address, record["port"])


def check_instance_name(name, option: str = "instance") -> str:
    """`name` when it can name an instance (its record's file, its unit); RecordError naming `option` otherwise.

    Checked before any record is read: a name such as '../x' must not reach a path.
    """
    if not isinstance(name, str) or not INSTANCE_NAME.match(name):
        raise RecordError(f"{option} must be letters, digits and '_.-', starting with a letter or digit, got {name!r}")
    return name


def record_path(config_dir: str, instance: str) -> str:
    return os.path.join(config_dir, instance + RECORD_SUFFIX)


def _is_text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _is_url(value) -> bool:
    try:
        check_base_url(value)
    except ValueError:
        return False
    return True


def _is_whole(value, low: int, high: float = float("inf")) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and low <= value <= high


def _is_seconds(value, minimum: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value >= minimum


def _is_group(value) -> bool:
    if value == {}:
        return True
    return (
        isinstance(value, dict)
        and value.get("role") in GROUP_ROLES
        and isinstance(value.get("hosts"), list)
        and len(value["hosts"]) > 1
        and all(_is_text(host) for host in value["hosts"])
        and isinstance(value.get("head"), dict)
        and _is_text(value["head"].get("name"))
        and _is_text(value["head"].get("address"))
        and isinstance(value.get("serves_api"), bool)
        and _is_whole(value.get("data_parallel_size"), 1)
        and ("guard_port" not in value or _is_whole(value["guard_port"], 1, 65535))
    )


def _is_secrets(value) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("environment_file"), str)
        and os.path.isabs(value["environment_file"])
        and _is_text(value.get("api_key_variable"))
    )


# Each field's check, and what a value that fails it is not.
CHECKS = {
    **{field: (_is_text, "a non-empty text") for field in TEXT_FIELDS},
    "url": (lambda value: _is_text(value) and _is_url(value), "a base URL such as http://127.0.0.1:8000"),
    "port": (lambda value: _is_whole(value, 1, 65535), "a port number"),
    "gpus": (
        lambda value: isinstance(value, list) and all(_is_whole(gpu, 0) for gpu in value),
        "a list of GPU indices",
    ),
    "layout": (lambda value: isinstance(value, dict), "a mapping"),
    "secrets": (_is_secrets, "{environment_file: ABSOLUTE PATH, api_key_variable: NAME}"),
    "sleep_mode": (lambda value: isinstance(value, bool), "true or false"),
    "group": (
        _is_group,
        "{} or a group member {role: head|worker, hosts: [two or more], head: {name, address}, serves_api, "
        "data_parallel_size, guard_port (a port)}",
    ),
    **{
        field: (
            lambda value, minimum=minimum: _is_seconds(value, minimum),
            f"a number of seconds of at least {minimum}",
        )
        for field, minimum in TIMEOUT_FIELDS.items()
    },
}


def _problems(record: dict, required=FIELDS) -> list[str]:
    """What makes a record unusable, one phrase each; [] for a good one. Fields beyond `required` may be missing."""
    missing = [field for field in required if field not in record]
    problems = [f"lacks {', '.join(missing)}"] if missing else []
    for field in FIELDS:
        check, expected = CHECKS[field]
        if field in record and not check(record[field]):
            problems.append(f"has {field} {record[field]!r}, not {expected}")
    return problems


def build_record(fields: dict) -> dict:
    """The record of an instance from its fields (FIELDS less url, which is computed); RecordError if unusable."""
    record = {field: fields.get(field, OPTIONAL_FIELDS.get(field)) for field in FIELDS if field != "url"}
    if isinstance(record["host"], str) and isinstance(record["port"], int) and _is_group(record["group"]):
        record["url"] = group_url(record["host"], record["port"], record["group"])
    problems = _problems(record)
    if problems:
        raise RecordError(f"The record of instance {fields.get('instance')!r} " + "; ".join(problems))
    return {field: record[field] for field in FIELDS}


def read_record(path: str) -> dict:
    """One instance record, checked; RecordError names the file and what is wrong with it.

    A record that an older release of the collection wrote lacks fields: it is read (for listings and clash
    checks), with `outdated` naming what it lacks; `usable` refuses to act on it.
    """
    try:
        with open(path, encoding="utf-8") as record_file:
            record = json.load(record_file)
    except OSError as error:
        raise RecordError(f"Cannot read the instance record {path}: {error.strerror or error}") from error
    except ValueError as error:
        raise RecordError(f"The instance record {path} is not valid JSON ({error}); {FIX}") from error
    if not isinstance(record, dict):
        raise RecordError(f"The instance record {path} holds a {type(record).__name__}, not an object; {FIX}")
    problems = _problems(record, required=CORE_FIELDS)
    if problems:
        raise RecordError(f"The instance record {path} {'; '.join(problems)}; {FIX}")
    record = {**OPTIONAL_FIELDS, **{field: record[field] for field in FIELDS if field in record}}
    if "url" in record:
        record["url"] = check_base_url(record["url"])
    return {**record, "outdated": [field for field in FIELDS if field not in record]}


def usable(record: dict) -> dict:
    """The record, when it has every field that acting on the instance needs; RecordError otherwise."""
    missing = [field for field in FIELDS if field not in record]
    if missing:
        raise RecordError(
            f"The instance record of {record['instance']} was written by an older release of llmops.vllm and lacks "
            f"{', '.join(missing)}; deploy the instance again (playbooks/deploy.yml)"
        )
    return record


def read_records(config_dir: str) -> list[dict]:
    """The records of every instance in config_dir, sorted by instance name; [] without the directory."""
    if not os.path.exists(config_dir):
        return []
    if not os.path.isdir(config_dir):
        raise RecordError(f"config_dir {config_dir} is not a directory")
    # Only the records are opened: the INSTANCE.env files beside them hold secrets.
    found = {}
    for entry in sorted(os.listdir(config_dir)):
        path = os.path.join(config_dir, entry)
        if entry.endswith(RECORD_SUFFIX) and os.path.isfile(path):
            record = read_record(path)
            if record["instance"] in found:
                first = found[record["instance"]][0]
                raise RecordError(f"The instance records {first} and {path} both name instance {record['instance']}")
            found[record["instance"]] = (path, record)
    return [found[name][1] for name in sorted(found)]


def choose(records: list[dict], names: list[str] | None, config_dir: str) -> list[dict]:
    """The records of the instances asked for; RecordError names those without one."""
    if names is None:
        return records
    known = [record["instance"] for record in records]
    unknown = [name for name in names if name not in known]
    if unknown:
        here = ", ".join(known) if known else "none"
        raise RecordError(
            f"No instance record for {', '.join(unknown)} in {config_dir}; the instances here are: {here}"
        )
    return [record for record in records if record["instance"] in names]


def find(config_dir: str, instance: str) -> dict:
    """The record of one instance, to act on; RecordError when it has none or an outdated one."""
    return usable(choose(read_records(config_dir), [instance], config_dir)[0])


def api_key(record: dict, read_text=None) -> str | None:
    """The instance's API key, from the EnvironmentFile that its record names; None when it has none."""
    secrets = usable(record)["secrets"]
    path = secrets["environment_file"]
    try:
        text = read_text(path) if read_text else _read_text(path)
    except OSError as error:
        raise RecordError(
            f"Cannot read {path}, the EnvironmentFile of instance {record['instance']}: {error.strerror or error}"
        ) from error
    return parse_environment_file(text).get(secrets["api_key_variable"]) or None


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as environment_file:
        return environment_file.read()


def record_text(record: dict) -> str:
    """The record as its file holds it: the same record always gives the same bytes."""
    return json.dumps(record, indent=2, sort_keys=True) + "\n"


def environment_text(unit: str, variables: dict) -> str:
    """The EnvironmentFile of an instance's unit: its variables, the API key among them."""
    return f"# Written by llmops.vllm (vllm_instance): the environment of {unit}, secrets included.\n" + (
        environment_file(variables)
    )
