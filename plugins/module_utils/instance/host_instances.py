# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM instances of one host: each a unit of its own with its model, port and GPUs.

Two instances clash when they listen on the same port or share a GPU. An instance that names no GPUs
uses all of them (CUDA_VISIBLE_DEVICES unset), so on a host with GPUs it shares every GPU.
"""

from __future__ import annotations

import re

INSTANCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
DEFAULT_PORT = 8000
RUNNING_STATES = ("active", "activating", "reloading")


class InstanceError(ValueError):
    """The instances cannot be deployed as given; the message lists every problem."""


def parse_gpus(value) -> list[int]:
    """GPU indices from a list (of ints or digit strings) or a comma-separated string; [] for none."""
    if value is None or value == "":
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise InstanceError(f"gpus must be a list of GPU indices or a string such as '0,1', got {value!r}")
    indices = []
    for item in items:
        text = str(item).strip()
        if not text.isdigit():
            raise InstanceError(f"gpus must hold GPU indices (0, 1, ...), got {item!r} in {value!r}")
        indices.append(int(text))
    if len(set(indices)) != len(indices):
        raise InstanceError(f"gpus names a GPU twice: {value!r}")
    return sorted(indices)


def running(records) -> list[dict]:
    """The records (of llmops.vllm.vllm_instance_info) whose unit runs or is starting."""
    return [record for record in records if record.get("active_state", "active") in RUNNING_STATES]


def gpu_set(gpus: list[int], gpu_count: int) -> set[int]:
    """The GPUs an instance uses: those it names, or every one of the host's when it names none."""
    return set(gpus) if gpus else set(range(gpu_count))


def clashes(instance: dict, other: dict, gpu_count: int) -> list[str]:
    """Why two instances cannot run together: the same port, shared GPUs; [] when they can."""
    reasons = []
    if int(instance["port"]) == int(other["port"]):
        reasons.append(f"port {instance['port']}")
    shared = gpu_set(instance["gpus"], gpu_count) & gpu_set(other["gpus"], gpu_count)
    if shared:
        reasons.append("GPU " + ",".join(map(str, sorted(shared))))
    return reasons


def _one(item, index: int, default_port: int, gpu_count: int | None) -> dict:
    if not isinstance(item, dict):
        raise InstanceError(f"instance {index + 1} must be a mapping with model, name, port and gpus, got {item!r}")
    unknown = sorted(set(item) - {"name", "model", "port", "gpus", "catalog_paths"})
    if unknown:
        raise InstanceError(
            f"instance {index + 1} has unknown keys {unknown}; it takes name, model, port, gpus and catalog_paths"
        )
    model = item.get("model")
    if not isinstance(model, str) or not model:
        raise InstanceError(f"instance {index + 1} needs a model (a catalog name), got {model!r}")
    name = item.get("name") or model
    if not isinstance(name, str) or not INSTANCE_NAME.match(name):
        raise InstanceError(
            f"instance name {name!r} must be letters, digits and '_.-', starting with a letter or digit"
        )
    port = item.get("port", default_port)
    if isinstance(port, bool) or not str(port).isdigit() or not 1 <= int(port) <= 65535:
        raise InstanceError(f"instance {name}: port must be a number from 1 to 65535, got {port!r}")
    try:
        gpus = parse_gpus(item.get("gpus"))
    except InstanceError as error:
        raise InstanceError(f"instance {name}: {error}") from None
    if gpus and gpu_count is not None:
        missing = [gpu for gpu in gpus if gpu >= gpu_count]
        if missing:
            has = f"GPUs 0 to {gpu_count - 1}" if gpu_count else "no GPUs"
            raise InstanceError(
                f"instance {name}: GPU {','.join(map(str, missing))} does not exist; the host has {has}"
            )
    catalog_paths = item.get("catalog_paths", [])
    listed = isinstance(catalog_paths, (list, tuple))
    if not listed or not all(path and isinstance(path, str) for path in catalog_paths):
        raise InstanceError(f"instance {name}: catalog_paths must be a list of directories, got {catalog_paths!r}")
    return {
        "name": name,
        "model": model,
        "port": int(port),
        "gpus": gpus,
        "cuda_visible_devices": ",".join(map(str, gpus)),
        **({"catalog_paths": list(catalog_paths)} if catalog_paths else {}),
    }


def normalize(instances, default_port: int = DEFAULT_PORT, gpu_count: int | None = None, active=()) -> list[dict]:
    """Check a host's instance list and fill in the defaults (name: the model, port: default_port).

    `active` are the host's instance records (llmops.vllm.vllm_instance_info); those that run and are
    not in the list must not clash with it. Raises InstanceError naming every clash.
    """
    if not isinstance(instances, (list, tuple)) or not instances:
        raise InstanceError(f"instances must be a non-empty list, got {instances!r}")
    checked = [_one(item, index, default_port, gpu_count) for index, item in enumerate(instances)]
    problems = []
    names = [instance["name"] for instance in checked]
    for name in sorted({name for name in names if names.count(name) > 1}):
        problems.append(f"instance name {name} is used twice")
    count = gpu_count or 0
    for index, instance in enumerate(checked):
        for other in checked[index + 1 :]:
            reasons = clashes(instance, other, count)
            if reasons and instance["name"] != other["name"]:
                problems.append(f"instances {instance['name']} and {other['name']} both use {' and '.join(reasons)}")
        for record in running(active):
            if record["instance"] in names:
                continue
            reasons = clashes(instance, record, count)
            if reasons:
                problems.append(
                    f"instance {instance['name']} would use {' and '.join(reasons)} of instance {record['instance']},"
                    " which is running (stop it with playbooks/stop.yml, or replace it with playbooks/swap.yml)"
                )
    if problems:
        raise InstanceError("; ".join(problems))
    return checked


def displaced(instance: dict, active, gpu_count: int | None = None) -> list[dict]:
    """The running instances that `instance` replaces: those it clashes with, other than itself."""
    return [
        record
        for record in running(active)
        if record["instance"] != instance["name"] and clashes(instance, record, gpu_count or 0)
    ]
