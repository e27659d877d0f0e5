# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Waiting for GPU memory to be free: which GPUs, how much use counts as free, and who still holds it.

Pure functions over the plain data of `gpu.nvidia` and `service.processes`; the module polls them with
`common.wait.wait_for`.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from ansible_collections.llmops.vllm.plugins.module_utils.gpu.nvidia import Gpu, GpuProcess
from ansible_collections.llmops.vllm.plugins.module_utils.service.processes import Process, is_vllm, read_process
from ansible_collections.llmops.vllm.plugins.module_utils.service.systemd import (
    parse_environment_assignments,
    parse_environment_file,
    parse_environment_files_property,
)

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
# MiB of a GPU's total that CUDA never gives out (the driver's own reservation, which nvidia-smi does not count
# as used): a server that asks for a share of the total needs this much more free.
CUDA_RESERVED_MIB = 512


class GpuSelectionError(ValueError):
    """GPUs or limits asked for that do not match this host."""


def unit_environment(environment_property: str, files_property: str, read) -> dict:
    """A unit's environment as its processes get it: Environment=, then each EnvironmentFile= over it.

    `read(path)` returns a file's text or raises OSError; a missing optional (`-`) file is skipped as
    systemd skips it.
    """
    variables = parse_environment_assignments(environment_property)
    for path, optional in parse_environment_files_property(files_property):
        try:
            variables.update(parse_environment_file(read(path)))
        except OSError as error:
            if not optional:
                raise GpuSelectionError(f"cannot read the unit's EnvironmentFile {path}: {error}") from None
    return variables


def parse_visible_devices(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as GPU indices or UUIDs; None when unset, which leaves every GPU visible.

    CUDA ignores everything from the first negative index on, so `-1` hides all GPUs.
    """
    if value is None:
        return None
    wanted = []
    for item in (part.strip() for part in value.split(",")):
        if item.startswith("-") and item[1:].isdigit():
            break
        if item.startswith("MIG-"):
            raise GpuSelectionError(f"{VISIBLE_DEVICES} names a MIG device ({item}); name whole GPUs instead")
        if item:
            wanted.append(item)
    return wanted


def _listing(gpus: list[Gpu]) -> str:
    return ", ".join(f"{gpu.index} ({gpu.uuid})" for gpu in gpus) or "none"


def _find(gpus: list[Gpu], item: str) -> Gpu:
    if item.isdigit():
        matches = [gpu for gpu in gpus if gpu.index == int(item)]
    else:  # a UUID, or a unique start of one, as CUDA_VISIBLE_DEVICES accepts
        matches = [gpu for gpu in gpus if gpu.uuid.lower() == item.lower()] or [
            gpu for gpu in gpus if gpu.uuid.lower().startswith(item.lower())
        ]
    if len(matches) != 1:
        problem = "matches several GPUs" if matches else "is not on this host"
        raise GpuSelectionError(f"GPU {item!r} {problem}; the GPUs here are {_listing(gpus)}")
    return matches[0]


def select_gpus(gpus: list[Gpu], wanted: list[str] | None) -> list[Gpu]:
    """The GPUs named by index or UUID, in the order given; None or ["all"] names them all."""
    if wanted is None or [str(item).strip().lower() for item in wanted] == ["all"]:
        return list(gpus)
    chosen = []
    for item in wanted:
        gpu = _find(gpus, str(item).strip())
        if gpu not in chosen:
            chosen.append(gpu)
    return chosen


def fit_limits(gpus: list[Gpu], utilization: float) -> dict:
    """The most MiB each GPU may use so that a vLLM server asking for `utilization` of it can start.

    vLLM refuses to start when a GPU's free memory is less than --gpu-memory-utilization times its total.
    """
    return {gpu.index: max(0, int(gpu.memory_total_mib * (1 - utilization)) - CUDA_RESERVED_MIB) for gpu in gpus}


def memory_limits(gpus: list[Gpu], max_used_mib: int, baseline: dict | None, max_above_baseline_mib: int) -> dict:
    """The most MiB each GPU (by index) may use to count as free: a fixed threshold, or baseline + margin.

    Baseline keys are GPU indices (as strings, the way Ansible passes dict keys) or UUIDs.
    """
    if baseline is None:
        return {gpu.index: max_used_mib for gpu in gpus}
    limits = {}
    for gpu in gpus:
        key = next((key for key in (str(gpu.index), gpu.index, gpu.uuid) if key in baseline), None)
        if key is None:
            raise GpuSelectionError(
                f"baseline has no value for GPU {gpu.index} ({gpu.uuid}); its keys are {sorted(map(str, baseline))}"
            )
        limits[gpu.index] = baseline_mib(key, baseline[key]) + max_above_baseline_mib
    return limits


def baseline_mib(key, value) -> int:
    """A baseline's MiB of one GPU; GpuSelectionError for a value that is not a number of MiB, 0 or more."""
    try:
        mib = None if isinstance(value, bool) else int(value)
    except (TypeError, ValueError):
        mib = None
    if mib is None or mib < 0:
        raise GpuSelectionError(f"baseline value for GPU {key} is {value!r}, not a number of MiB")
    return mib


def memory_state(gpus: list[Gpu], limits: dict) -> tuple[bool, list[dict]]:
    """A wait check: whether every GPU in `limits` uses at most its limit, and what each one uses."""
    observed = [
        {
            "index": gpu.index,
            "uuid": gpu.uuid,
            "memory_used_mib": gpu.memory_used_mib,
            "memory_total_mib": gpu.memory_total_mib,
            "limit_mib": limits[gpu.index],
        }
        for gpu in gpus
        if gpu.index in limits
    ]
    if len(observed) != len(limits):
        raise GpuSelectionError(f"GPUs {sorted(limits)} were asked for but the driver now lists {_listing(gpus)}")
    return all(state["memory_used_mib"] <= state["limit_mib"] for state in observed), observed


@dataclass(frozen=True)
class Holder:
    """A process that the driver says holds memory on one of the GPUs waited for."""

    gpu: Gpu
    driver: GpuProcess
    process: Process | None  # None when the PID is not visible here (another PID namespace) or has exited
    owner_unit: str | None

    @property
    def leftover(self) -> bool:
        """A vLLM process that no other unit owns: safe to end when asked to clean up after the owner."""
        return bool(self.process and is_vllm(self.process) and self.process.unit in (None, self.owner_unit))

    def as_dict(self) -> dict:
        process = self.process
        return {
            "gpu": self.gpu.index,
            "gpu_uuid": self.gpu.uuid,
            "pid": self.driver.pid,
            "name": process.name if process else self.driver.name,
            "cmdline": process.cmdline if process else "",
            "used_mib": self.driver.used_mib,
            "unit": process.unit if process else None,
            "belongs_to_unit": None if self.owner_unit is None else bool(process and process.unit == self.owner_unit),
            "vllm": bool(process and is_vllm(process)),
        }


def find_holders(
    processes: list[GpuProcess], gpus: list[Gpu], owner_unit: str | None, read=read_process
) -> list[Holder]:
    """The driver's processes on `gpus`, with what /proc says about each (name, command line, unit)."""
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    holders = []
    for found in processes:
        if found.gpu_uuid in by_uuid:
            process = read(found.pid)
            if process and not same_program(found.name, process):
                process = None  # the driver's PID names another process here: not ours to describe or end
            holders.append(Holder(by_uuid[found.gpu_uuid], found, process, owner_unit))
    return holders


def same_program(driver_name: str, process: Process) -> bool:
    """Whether /proc's process runs the program the driver names for that PID.

    The driver gives PIDs as the host sees them; in a container the same PID may be another process.
    """
    if not driver_name:  # the driver could not say; nothing to compare
        return True
    program = process.cmdline.split(" ", 1)[0]
    named = posixpath.basename(driver_name)
    return named in (posixpath.basename(program), process.name) or process.cmdline.startswith(driver_name)


def describe(observed: list[dict], holders: list[Holder]) -> str:
    """One sentence per GPU still over its limit, naming every process on it."""
    sentences = []
    for state in observed:
        if state["memory_used_mib"] <= state["limit_mib"]:
            continue
        on_gpu = [holder.as_dict() for holder in holders if holder.gpu.index == state["index"]]
        named = "; ".join(_describe_holder(holder) for holder in on_gpu) or (
            "the driver lists no process on it (one in another container or PID namespace?)"
        )
        sentences.append(
            f"GPU {state['index']} ({state['uuid']}) uses {state['memory_used_mib']} MiB, "
            f"more than {state['limit_mib']} MiB: {named}."
        )
    return " ".join(sentences)


def _describe_holder(holder: dict) -> str:
    memory = "? MiB" if holder["used_mib"] is None else f"{holder['used_mib']} MiB"
    text = f"PID {holder['pid']} {holder['name'] or '?'} ({memory}"
    text += f", unit {holder['unit']}" if holder["unit"] else ", in no systemd unit"
    if holder["belongs_to_unit"] is not None:
        text += ", belongs to the unit" if holder["belongs_to_unit"] else ", not the unit's"
    text += ")"
    return text + (f": {holder['cmdline']}" if holder["cmdline"] else "")
