#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_memory_wait
short_description: Wait until GPUs' memory is free, and name the processes that still hold it
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Polls the used memory of the chosen GPUs until each uses at most a threshold (O(max_used_mib)), or at
    most O(max_above_baseline_mib) above a O(baseline) read earlier, for O(consecutive) polls in a row.
  - The GPUs are named by index or UUID (O(gpus)), or are those of a systemd unit (O(unit)), from its
    C(CUDA_VISIBLE_DEVICES) in C(Environment=) and C(EnvironmentFile=).
  - A process's memory is free a fraction of a second after it exits, so a wait that times out means a
    process did not exit. The failure names each process still holding memory on each GPU, with its PID,
    name, command line, MiB, systemd unit, and whether it belongs to O(owner_unit).
  - With O(terminate_leftovers), on timeout it ends the vLLM processes among them that belong to
    O(owner_unit) or to no unit (orphans of a stopped server) with SIGTERM, then SIGKILL after O(grace) seconds.
    Then it waits again, up to O(timeout). Other processes are never signalled, only named.
  - On a host without an NVIDIA driver it fails and says what was missing. Plays that also run on CPU hosts
    skip it with C(when) V(vllm_gpus.present) after M(llmops.vllm.gpu_facts).
extends_documentation_fragment:
  - llmops.vllm.attributes
  - llmops.vllm.nvidia
attributes:
  check_mode:
    support: full
    details: It waits and reads in check mode too, but never signals a process; it reports the processes
      it would end in RV(would_terminate).
  diff_mode:
    support: none
  idempotent:
    support: full
    details: It changes something only when it ends leftover processes.
options:
  gpus:
    description:
      - GPUs to wait for, by nvidia-smi index or UUID (or a unique start of a UUID), or V(all).
      - Defaults to every GPU, unless O(unit) is given.
    type: list
    elements: str
  unit:
    description:
      - A systemd unit whose GPUs to wait for, those in its C(CUDA_VISIBLE_DEVICES), read from its
        C(Environment=) and C(EnvironmentFile=) settings; every GPU when it sets none.
      - Indices are nvidia-smi's, which are CUDA's too on hosts of one GPU model; on mixed hosts name UUIDs.
      - Also the default of O(owner_unit).
    type: str
  owner_unit:
    description:
      - The systemd unit that the memory is expected to have belonged to. Each process still holding
        memory is reported with whether it belongs to this unit; O(terminate_leftovers) ends only its
        processes and those of no unit.
    type: str
  max_used_mib:
    description:
      - A GPU counts as free when it uses at most this many MiB. Defaults to 1024 unless O(baseline) is given.
      - The driver's own reservation is not counted, as in nvidia-smi; an idle GPU shows 0 to a few MiB.
    type: int
  baseline:
    description:
      - Per-GPU used MiB read earlier, keyed by GPU index or UUID, such as RV(used_mib) of an earlier run.
        A GPU counts as free when it uses at most O(max_above_baseline_mib) more than its baseline.
      - Every GPU waited for needs a value.
    type: dict
  max_above_baseline_mib:
    description: How many MiB above O(baseline) still count as free.
    type: int
    default: 256
  fit_utilization:
    description:
      - A GPU counts as free when a vLLM server with this C(--gpu-memory-utilization) can start on it beside what
        it holds, that is when it uses at most (1 - O(fit_utilization)) times its total, less the 512 MiB that CUDA
        keeps.
      - For a GPU that another server keeps memory on, such as one asleep (M(llmops.vllm.vllm_service)
        O(llmops.vllm.vllm_service#module:state=asleep)).
    type: float
  consecutive:
    description: Clean polls needed in a row, so that memory freed between two allocations is not taken as free.
    type: int
    default: 2
  interval:
    description: Seconds between polls.
    type: float
    default: 0.25
  timeout:
    description: Seconds to wait before failing (or, with O(terminate_leftovers), before ending leftovers).
    type: float
    default: 60
  terminate_leftovers:
    description:
      - On timeout, end the vLLM processes still holding memory that belong to O(owner_unit) or to no
        unit, then wait again up to O(timeout).
    type: bool
    default: false
  grace:
    description: Seconds between SIGTERM and SIGKILL when ending leftovers.
    type: float
    default: 10
seealso:
  - module: llmops.vllm.gpu_facts
"""

EXAMPLES = r"""
- name: Wait until the GPUs of the stopped server are free, naming any process that holds them
  llmops.vllm.gpu_memory_wait:
    unit: vllm-minimax_m25.service
    timeout: 120

- name: Free GPUs 4 to 7, ending vLLM workers orphaned by the old server
  llmops.vllm.gpu_memory_wait:
    gpus: [4, 5, 6, 7]
    owner_unit: vllm-kimi_k25.service
    terminate_leftovers: true
    grace: 15

- name: Read the GPUs before a server starts
  llmops.vllm.gpu_facts:

- name: After it stops, wait until each GPU is back within 512 MiB of what it used before
  llmops.vllm.gpu_memory_wait:
    baseline: "{{ vllm_gpus.gpus | items2dict(key_name='index', value_name='memory_used_mib') }}"
    max_above_baseline_mib: 512

- name: Wait until GPU 0 has room for a server of 0.9 of its memory beside one asleep there
  llmops.vllm.gpu_memory_wait:
    gpus: [0]
    fit_utilization: 0.9

- name: Skip on hosts without GPUs
  llmops.vllm.gpu_memory_wait:
    gpus: all
  when: vllm_gpus.present
"""

RETURN = r"""
backend:
  description: How the driver was read.
  returned: when a driver was found
  type: str
  sample: nvml
gpus:
  description: Each GPU waited for, at the last poll, with the limit it was held to.
  returned: when a driver was found
  type: list
  elements: dict
  sample: [{"index": 0, "uuid": "GPU-d0f1eba3-ac23-d843-fbe6-d95a497ee56c", "memory_used_mib": 0,
            "memory_total_mib": 143771, "limit_mib": 1024}]
used_mib:
  description: Used MiB of each GPU waited for, keyed by index; fit for a later O(baseline).
  returned: when a driver was found
  type: dict
  sample: {"0": 0, "1": 3}
elapsed:
  description: Seconds spent waiting, ending leftovers included.
  returned: when a driver was found
  type: float
  sample: 0.52
polls:
  description: Memory polls made.
  returned: when a driver was found
  type: int
  sample: 3
processes:
  description: >-
    Processes holding memory on the GPUs waited for when the wait timed out, with C(gpu), C(gpu_uuid),
    C(pid), C(name), C(cmdline), C(used_mib), C(unit), C(belongs_to_unit) and C(vllm).
  returned: when the wait timed out
  type: list
  elements: dict
  sample: [{"gpu": 0, "gpu_uuid": "GPU-d0f1...", "pid": 4312, "name": "VLLM::Worker_TP",
            "cmdline": "VLLM::Worker_TP0", "used_mib": 130122, "unit": null, "belongs_to_unit": false, "vllm": true}]
terminated:
  description: >-
    Leftovers ended: C(terminated) (PIDs gone after SIGTERM), C(killed) (after SIGKILL), C(survivors).
  returned: when leftovers were ended
  type: dict
  sample: {"terminated": [4312], "killed": [], "survivors": [], "elapsed": 0.31}
would_terminate:
  description: In check mode, the PIDs that O(terminate_leftovers) would have ended.
  returned: in check mode, when the wait timed out and O(terminate_leftovers) is set
  type: list
  elements: int
  sample: [4312]
gpus_from:
  description: Where the GPUs waited for came from.
  returned: always
  type: str
  sample: CUDA_VISIBLE_DEVICES=0,1 of vllm-tiny.service
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.common.wait import positive_seconds, wait_for
from ansible_collections.llmops.vllm.plugins.module_utils.gpu.memory import (
    VISIBLE_DEVICES,
    GpuSelectionError,
    baseline_mib,
    describe,
    find_holders,
    fit_limits,
    memory_limits,
    memory_state,
    parse_visible_devices,
    select_gpus,
    unit_environment,
)
from ansible_collections.llmops.vllm.plugins.module_utils.gpu.nvidia import (
    BACKEND_OPTION,
    NoDriver,
    NvidiaError,
    open_backend,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.processes import terminate
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import check_unit_name

try:
    import pynvml
except ImportError:
    pynvml = None

DEFAULT_MAX_USED_MIB = 1024


def read_file(path):
    with open(path) as env_file:
        return env_file.read()


def unit_gpus(module, unit):
    """The unit's CUDA_VISIBLE_DEVICES as a list (None: unset, every GPU), and a note of where it came from."""
    systemctl = module.get_bin_path("systemctl", required=True)
    values = {}
    for prop in ("LoadState", "Environment", "EnvironmentFiles"):
        rc, out, err = module.run_command([systemctl, "show", "-P", prop, unit])
        if rc != 0:
            module.fail_json(msg=f"Cannot read {prop} of the unit {unit}: {err.strip()}", rc=rc, stderr=err)
        values[prop] = out
    if values["LoadState"].strip() == "not-found":
        module.fail_json(msg=f"The unit {unit} does not exist on this host, so its GPUs are unknown.")
    value = unit_environment(values["Environment"], values["EnvironmentFiles"], read_file).get(VISIBLE_DEVICES)
    note = (
        f"{VISIBLE_DEVICES}={value} of {unit}" if value is not None else f"every GPU ({unit} sets no {VISIBLE_DEVICES})"
    )
    return parse_visible_devices(value), note


def wanted_gpus(module):
    if module.params["unit"]:
        return unit_gpus(module, module.params["unit"])
    wanted = module.params["gpus"]
    return wanted, "gpus: " + ("all" if wanted is None else ",".join(wanted))


def main():
    module = AnsibleModule(
        argument_spec={
            "gpus": {"type": "list", "elements": "str"},
            "unit": {"type": "str"},
            "owner_unit": {"type": "str"},
            "max_used_mib": {"type": "int"},
            "baseline": {"type": "dict"},
            "max_above_baseline_mib": {"type": "int", "default": 256},
            "fit_utilization": {"type": "float"},
            "consecutive": {"type": "int", "default": 2},
            "interval": {"type": "float", "default": 0.25},
            "timeout": {"type": "float", "default": 60},
            "terminate_leftovers": {"type": "bool", "default": False},
            "grace": {"type": "float", "default": 10},
            "backend": BACKEND_OPTION,
        },
        mutually_exclusive=[("gpus", "unit"), ("max_used_mib", "baseline", "fit_utilization")],
        supports_check_mode=True,
    )
    params = module.params
    try:
        timeout = positive_seconds(params["timeout"], "timeout")
        interval = positive_seconds(params["interval"], "interval")
        grace = positive_seconds(params["grace"], "grace")
        if params["consecutive"] < 1:
            raise ValueError(f"consecutive must be 1 or more, got {params['consecutive']}")
        fit = params["fit_utilization"]
        if fit is not None and not 0 < fit <= 1:
            raise ValueError(f"fit_utilization must be above 0 and at most 1, got {fit:g}")
        for name in ("max_used_mib", "max_above_baseline_mib"):
            if params[name] is not None and params[name] < 0:
                raise ValueError(f"{name} must be 0 MiB or more, got {params[name]}")
        if params["gpus"] is not None and (not params["gpus"] or not all(gpu.strip() for gpu in params["gpus"])):
            raise ValueError(f"gpus must name GPUs by index or UUID (or all), got {params['gpus']}")
        for name in ("unit", "owner_unit"):
            if params[name] is not None:
                check_unit_name(params[name], name)
        for key, value in (params["baseline"] or {}).items():
            baseline_mib(key, value)
        wanted, gpus_from = wanted_gpus(module)
    except (ValueError, GpuSelectionError) as error:
        module.fail_json(msg=str(error))
    owner_unit = params["owner_unit"] or params["unit"]

    try:
        backend = open_backend(params["backend"], pynvml, module.get_bin_path("nvidia-smi"), module.run_command)
    except NoDriver as no_driver:
        module.fail_json(
            msg=f"No NVIDIA driver on this host, so there is no GPU memory to wait for ({gpus_from}): "
            f"{no_driver.reason}. On hosts that may have no GPU, run llmops.vllm.gpu_facts first and add "
            "`when: vllm_gpus.present`.",
            gpus_from=gpus_from,
        )
    try:
        ok, result = wait_for_memory(module, backend, wanted, owner_unit, timeout, interval, grace)
    except GpuSelectionError as error:
        module.fail_json(msg=str(error), gpus_from=gpus_from)
    except NvidiaError as error:
        module.fail_json(msg=f"Reading GPU memory through {backend.name} failed: {error}", gpus_from=gpus_from)
    finally:
        backend.close()
    (module.exit_json if ok else module.fail_json)(gpus_from=gpus_from, **result)


def wait_for_memory(module, backend, wanted, owner_unit, timeout, interval, grace):
    """Wait, end leftovers if asked to, and say who holds memory on timeout: `(ok, result)`."""
    params = module.params
    start = time.monotonic()
    selected = select_gpus(backend.gpus(), wanted)
    max_used = DEFAULT_MAX_USED_MIB if params["max_used_mib"] is None else params["max_used_mib"]
    if params["fit_utilization"] is not None:
        limits = fit_limits(selected, params["fit_utilization"])
    else:
        limits = memory_limits(selected, max_used, params["baseline"], params["max_above_baseline_mib"])

    def wait():
        return wait_for(
            lambda: memory_state(backend.gpus(), limits),
            timeout=timeout,
            interval=interval,
            consecutive=params["consecutive"],
        )

    waited = wait()
    polls = waited.polls
    result = {"changed": False, "backend": backend.name}
    if not waited.ok and params["terminate_leftovers"]:
        leftovers = [holder for holder in find_holders(backend.processes(), selected, owner_unit) if holder.leftover]
        processes = list({holder.process.pid: holder.process for holder in leftovers}.values())
        if module.check_mode and processes:
            result.update(changed=True, would_terminate=[process.pid for process in processes])
            result["msg"] = (
                f"Check mode: would end the leftover vLLM processes {result['would_terminate']} and wait again."
            )
        elif processes:
            result.update(changed=True, terminated=terminate(processes, grace=grace))
            waited = wait()
            polls += waited.polls
    result.update(
        elapsed=round(time.monotonic() - start, 3),
        polls=polls,
        gpus=waited.observed,
        used_mib={str(state["index"]): state["memory_used_mib"] for state in waited.observed},
    )
    if waited.ok or "would_terminate" in result:
        return True, result
    holders = find_holders(backend.processes(), selected, owner_unit)
    result["processes"] = [holder.as_dict() for holder in holders]
    result["msg"] = f"GPU memory still in use after {result['elapsed']} s (timeout {timeout} s): " + describe(
        waited.observed, holders
    )
    return False, result


if __name__ == "__main__":
    main()
