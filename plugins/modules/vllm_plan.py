#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_plan
short_description: Check a model's parallel layout against its config.json and the host's GPUs, before any download
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Reads the model's C(config.json) (a local file, or that one file from the Hugging Face hub or the fleet's
    mirror) and checks a
    tensor/pipeline/data/expert parallel layout of a catalog entry against it and against the host's GPU facts.
  - "Rules: attention heads divisible by TP; KV heads divisible by TP, or TP a multiple of them (replication);
    the intermediate shards of routed experts, shared experts and dense MLPs are multiples of the checkpoint's
    quantisation block or group (FP8 128x128 blocks: MiniMax-M2.5 fails at TP 8); MLA (one latent KV head on every
    rank); an FP8-block router whose experts are not a multiple of 16 (vLLM's block matmul fails on it);
    expert parallelism (EP = TP x DP, experts divisible by it); pipeline stages; max_model_len within the
    model's positions; GPU count; compute capability (the entry's C(requires)); memory (weights per GPU from the
    checkpoint's size, KV cache bytes per token from the config, how many max_model_len sequences fit)."
  - Fails with the rule that broke and the layouts that pass on this host (the entry's alternatives, then TP/DP/EP
    combinations up to the GPU count). Warns about an MLA model whose TP spans PCIe links.
  - Without GPU facts (a host without GPUs) the GPU rules are skipped; without a config (a generated model whose
    files do not exist yet) the model rules are skipped. Changes nothing on the host.
extends_documentation_fragment:
  - llmops.vllm.hub
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  model:
    description: The catalog entry, as the P(llmops.vllm.model_catalog#lookup) lookup returns it.
    type: dict
    required: true
  config:
    description: The model's config.json, already read.
    type: dict
  config_path:
    description:
      - Absolute path on the host of the model's config.json, or of the directory that holds it.
      - When that directory holds C(*.safetensors) files and neither O(checkpoint_bytes) nor the entry's
        C(checkpoint_size) is set, their sizes are the checkpoint's size.
    type: path
  hub_repo:
    description: Hugging Face repository (owner/name) to fetch C(config.json) from; only that file is fetched.
    type: str
  hub_revision:
    description: Branch, tag or commit of O(hub_repo).
    type: str
    default: main
  timeout:
    description: Seconds the hub or the mirror may take to answer.
    type: int
    default: 30
  gpus:
    description:
      - The host's GPU facts, the C(vllm_gpus) fact of llmops.vllm.gpu_facts (C(present), C(gpus) with
        C(memory_total_mib), C(memory_used_mib), C(name) and optionally C(compute_capability), C(topology)).
      - Omitted, or C(present=false), skips the rules that need GPUs.
    type: dict
  layout:
    description:
      - C(default) (the entry's layout), the name of one of the entry's alternatives, C(auto) (the first layout
        that passes, among the default, the alternatives, then other TP/DP/EP combinations), or a mapping of
        parallel sizes like the entry's C(layout).
    type: raw
    default: default
  max_model_len:
    description: Context length to plan for; defaults to the entry's, else the model's C(max_position_embeddings).
    type: int
  checkpoint_bytes:
    description: Size of the weights in bytes; defaults to the entry's C(checkpoint_size).
    type: int
  runtime_overhead_gib:
    description: GiB per GPU besides weights and KV cache (activations, CUDA graphs, NCCL buffers).
    type: float
    default: 3.0
  model_path:
    description: The C(--model) of the returned serve arguments; defaults to the hub repository or the entry's name.
    type: str
  host:
    description: The C(--host) of the returned serve arguments.
    type: str
    default: 0.0.0.0
  port:
    description: The C(--port) of the returned serve arguments.
    type: int
    default: 8000
  group_hosts:
    description:
      - For a multi-host entry (one with C(group)), every host of its inventory group in inventory order, each
        C(name) (the inventory name), C(address) (the IP address that the other hosts reach it on) and C(gpus)
        (its C(vllm_gpus) facts); optionally C(interface) (the network interface between the hosts) and
        C(ib_hca) (C(NCCL_IB_HCA)).
      - The group is planned over all of them; RV(group) is this host's part, the host named by O(group_host).
    type: list
    elements: dict
  group_host:
    description: This host's inventory name, one of O(group_hosts).
    type: str
notes:
  - The weights per GPU are the checkpoint's bytes divided by TP (routed experts by TP x DP, which vLLM spreads them
    over with or without expert parallelism), in the proportions of experts and other weights that the config
    implies; vLLM's own figure differs by a few percent (vision towers, buffers).
"""

EXAMPLES = r"""
- name: Plan MiniMax-M2.5 on this host's GPUs before downloading anything
  llmops.vllm.vllm_plan:
    model: "{{ lookup('llmops.vllm.model_catalog', 'minimax_m25') }}"
    hub_repo: MiniMaxAI/MiniMax-M2.5
    hub_token: "{{ hf_token | default(omit) }}"
    gpus: "{{ vllm_gpus }}"
  register: plan

- name: Pick the first layout that passes, from weights already on the host
  llmops.vllm.vllm_plan:
    model: "{{ lookup('llmops.vllm.model_catalog', 'kimi_k25') }}"
    config_path: /var/lib/vllm/models/kimi_k25
    gpus: "{{ vllm_gpus }}"
    layout: auto
    max_model_len: 65536
"""

RETURN = r"""
group:
  description:
    - For a multi-host entry, this host's part of the group; absent for a one-host entry.
    - C(mode) (C(data_parallel) or C(model_parallel)), C(hosts) (the group's, head first), C(head) (C(name),
      C(address)), C(role) (C(head) or C(worker)), C(node_rank), C(data_parallel_ranks), C(serves_api), C(args)
      (what this host adds to C(vllm serve)) and C(environment) (what it adds to the server's environment).
  returned: success, for a multi-host entry
  type: dict
  sample:
    mode: data_parallel
    hosts: [gpu-a, gpu-b]
    head: {name: gpu-a, address: 10.0.0.1}
    role: worker
    node_rank: 1
    data_parallel_ranks: [1]
    serves_api: false
    args: [--data-parallel-size-local, "1", --data-parallel-start-rank, "1", --data-parallel-address, 10.0.0.1,
           --data-parallel-rpc-port, "29550", --headless]
    environment: {VLLM_HOST_IP: 10.0.0.2}
ok:
  description: Whether every rule passed.
  returned: always
  type: bool
  sample: true
layout:
  description: The layout planned, as parallel sizes.
  returned: always
  type: dict
  sample: {"tensor_parallel_size": 4}
layout_name:
  description: C(default), the alternative's name, C(custom), or for O(layout=auto) the name of the layout chosen.
  returned: always
  type: str
  sample: default
description:
  description: The layout in short (C(TP8 EP8), C(TP1 DP8 EP8)).
  returned: always
  type: str
  sample: TP4
gpus:
  description: GPUs that the layout occupies.
  returned: always
  type: int
  sample: 4
serve_args:
  description: The vLLM server's arguments for this layout and entry.
  returned: always
  type: list
  elements: str
  sample: [--model, MiniMaxAI/MiniMax-M2.5, --served-model-name, minimax-m2.5, --host, 0.0.0.0, --port, "8000",
           --tensor-parallel-size, "4", --max-num-seqs, "256"]
checks:
  description: Each rule with its status (C(pass), C(fail), C(skipped)) and what it found.
  returned: always
  type: list
  elements: dict
  sample: [{"rule": "quantization_alignment", "status": "pass",
            "detail": "intermediate shards routed experts 384 are multiples of the FP8 weight block 128x128"}]
memory:
  description: Memory of one GPU of the layout, in bytes (and GiB rounded), and the concurrency that fits.
  returned: always (null when GPU facts, the config or the checkpoint size are missing)
  type: dict
  sample: {"weights_bytes": 57500000000, "weights_gib": 53.6, "kv_cache_gib": 28.5, "kv_cache_bytes_per_token": 63488,
           "kv_cache_tokens": 481709, "max_model_len": 196608, "max_concurrency_at_max_model_len": 2}
layout_warnings:
  description: What passes but deserves attention (MLA over PCIe, memory already in use).
  returned: always
  type: list
  elements: str
summary:
  description: One line for people.
  returned: always
  type: str
  sample: "minimax_m25 TP4 on 4 GPU(s): weights 53.6 GiB + KV cache 28.5 GiB per GPU, 2 sequence(s) of 196608 tokens"
failed_rule:
  description: The first rule that failed, or null.
  returned: always
  type: str
  sample: quantization_alignment
failed_rules:
  description: Every rule that failed, in the order of RV(checks); the failure's message names each with what it found.
  returned: always
  type: list
  elements: str
  sample: [attention_heads, kv_heads]
passing_layouts:
  description: On failure, the layouts that pass on this host, each with its name, layout, GPUs and memory figures.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "ep8", "layout": {"tensor_parallel_size": 8, "expert_parallel_size": 8}, "gpus": 8,
            "weights_gib": 26.8, "max_concurrency_at_max_model_len": 9}]
"""

import glob
import json
import math
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.plan.catalog import DERIVED_KEYS, CatalogError, check_entry
from ansible_collections.llmops.vllm.plugins.module_utils.plan.group_planner import plan_group
from ansible_collections.llmops.vllm.plugins.module_utils.plan.model_shape import PlanInputError
from ansible_collections.llmops.vllm.plugins.module_utils.plan.planner import GIB, failure_message, gpu_list, plan
from ansible_collections.llmops.vllm.plugins.module_utils.service.serve_command import ServeSpecError
from ansible_collections.llmops.vllm.plugins.module_utils.weights.listing import WeightsError
from ansible_collections.llmops.vllm.plugins.module_utils.weights.options import hub_problems, where_problems
from ansible_collections.llmops.vllm.plugins.module_utils.weights.sources import (
    hub_endpoint,
    open_source,
    read_source_json,
)


def read_local_config(path):
    """(config, bytes of the *.safetensors beside it or None) from a config.json or its directory."""
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    config_file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    with open(config_file, encoding="utf-8") as stream:
        config = json.load(stream)
    shards = glob.glob(os.path.join(directory, "*.safetensors"))
    return config, (sum(os.path.getsize(shard) for shard in shards) or None)


def fetch_hub_config(module):
    """config.json alone, from the mirror when one is set, else from the hub."""
    params = module.params
    endpoint = hub_endpoint(params["hub_endpoint"])
    source = open_source(
        params["hub_repo"], params["hub_revision"], params["mirror"], endpoint, params["hub_token"], params["timeout"]
    )
    try:
        return read_source_json(source, "config.json")
    except WeightsError as error:
        hint = (
            " (a gated or private repository: set hub_token, vllm_hub_token in the playbooks)"
            if error.status in (401, 403)
            else ""
        )
        module.fail_json(
            msg=f"Cannot read config.json of {params['hub_repo']} at {params['hub_revision']}: {error}{hint}"
        )


def group_option_problems(params, entry):
    """A multi-host entry is planned on its own layout over every host of its group."""
    group = entry["group"]["hosts"]
    problems = []
    if params["layout"] != "default":
        problems.append(f"a multi-host entry is planned on its own layout, not layout {params['layout']!r}")
    if not params["group_hosts"]:
        problems.append(
            f"it is a multi-host entry: give group_hosts, the name, address and GPU facts of every host of {group}, "
            "and group_host, this host's name"
        )
    elif params["group_host"] not in [host.get("name") for host in params["group_hosts"]]:
        problems.append(f"group_host {params['group_host']!r} is not one of the hosts of {group} in group_hosts")
    return problems


def plan_the_group(module, entry, config, checkpoint_bytes):
    """Plans the group over all its hosts and exits with this host's part of it."""
    params = module.params
    try:
        result = plan_group(
            entry,
            config,
            params["group_hosts"],
            max_model_len=params["max_model_len"],
            checkpoint_bytes=checkpoint_bytes,
            runtime_overhead_bytes=int(params["runtime_overhead_gib"] * GIB),
        )
    except PlanInputError as error:
        module.fail_json(msg=f"Cannot plan {entry['name']}: {error}")
    if not result["ok"]:
        module.fail_json(msg=f"Cannot plan {result['reason']}", **result)
    this = next(host for host in result["hosts"] if host["name"] == params["group_host"])
    head = result["hosts"][0]
    ranks = ", ".join(map(str, this["data_parallel_ranks"]))
    part = f"the {this['role']}" + (f", data parallel rank(s) {ranks}" if ranks else f", node rank {this['node_rank']}")
    module.exit_json(
        changed=False,
        ok=True,
        layout=result["layout"],
        layout_name="default",
        description=result["description"],
        summary=f"{entry['name']} {result['description']}: {this['name']} is {part}",
        checks=result["checks"] + this["checks"],
        memory=this["memory"],
        group={
            "mode": result["mode"],
            "hosts": [host["name"] for host in result["hosts"]],
            "head": {"name": head["name"], "address": head["address"]},
            **{key: this[key] for key in ("role", "node_rank", "data_parallel_ranks", "serves_api", "environment")},
            "args": this["group_args"],
        },
    )


def serve_options(params):
    """The options that go into the planned serve arguments."""
    return {name: params[name] for name in ("max_model_len", "model_path", "host", "port")}


def option_problems(params, entry):
    """What is wrong with the options, one phrase each; checked before config.json is read."""
    optional_at_least_one = ("checkpoint_bytes", "max_model_len")
    problems = [
        f"{name} must be a whole number of at least 1, got {params[name]}"
        for name in optional_at_least_one
        if params[name] is not None and params[name] < 1
    ]
    if params["timeout"] < 1:
        problems.append(f"timeout must be 1 second or more, got {params['timeout']}")
    if not 0 <= params["runtime_overhead_gib"] < math.inf:
        problems.append(f"runtime_overhead_gib must be 0 GiB or more, got {params['runtime_overhead_gib']}")
    if params["config_path"] is not None and not os.path.isabs(params["config_path"]):
        problems.append(f"config_path must be an absolute path, got {params['config_path']!r}")
    if params["hub_repo"] is not None:
        problems += hub_problems(params["hub_repo"], params["hub_revision"], ("hub_repo", "hub_revision"))
    # The environment's hub counts only where the hub is asked.
    problems += where_problems(params["mirror"], params["hub_endpoint"], None if params["hub_repo"] else {})
    layout = params["layout"]
    if "group" in entry:
        return problems + group_option_problems(params, entry)
    if not isinstance(layout, (str, dict)):
        problems.append(f"layout must be auto, default, an alternative's name or a mapping, got {layout!r}")
    else:
        # Without config.json and GPUs the planner checks the layout's name or sizes and the serve options alone.
        try:
            plan(entry, layout=layout, **serve_options(params))
        except (PlanInputError, ServeSpecError) as error:
            problems.append(str(error))
    try:
        gpu_list(params["gpus"])
    except PlanInputError as error:
        problems.append(str(error))
    return problems


def main():
    module = AnsibleModule(
        argument_spec={
            "model": {"type": "dict", "required": True},
            "config": {"type": "dict"},
            "config_path": {"type": "path"},
            "hub_repo": {"type": "str"},
            "hub_revision": {"type": "str", "default": "main"},
            "hub_token": {"type": "str", "no_log": True},
            "hub_endpoint": {"type": "str"},
            "mirror": {"type": "str"},
            "timeout": {"type": "int", "default": 30},
            "gpus": {"type": "dict"},
            "layout": {"type": "raw", "default": "default"},
            "max_model_len": {"type": "int"},
            "checkpoint_bytes": {"type": "int"},
            "runtime_overhead_gib": {"type": "float", "default": 3.0},
            "model_path": {"type": "str"},
            "host": {"type": "str", "default": "0.0.0.0"},
            "port": {"type": "int", "default": 8000},
            "group_hosts": {"type": "list", "elements": "dict"},
            "group_host": {"type": "str"},
        },
        mutually_exclusive=[("config", "config_path", "hub_repo")],
        required_together=[("group_hosts", "group_host")],
        supports_check_mode=True,
    )
    params = module.params
    name = params["model"].get("name", "model")
    try:
        entry = check_entry(name, {key: value for key, value in params["model"].items() if key not in DERIVED_KEYS})
    except CatalogError as error:
        module.fail_json(msg=str(error))
    problems = option_problems(params, entry)
    if problems:
        module.fail_json(msg=f"Cannot plan {name}: " + "; ".join(problems))

    config, local_bytes = params["config"], None
    if params["config_path"]:
        try:
            config, local_bytes = read_local_config(params["config_path"])
        except (OSError, ValueError) as error:
            module.fail_json(msg=f"Cannot read the config.json of {name} at {params['config_path']}: {error}")
    elif params["hub_repo"]:
        config = fetch_hub_config(module)

    checkpoint_bytes = params["checkpoint_bytes"] or entry["checkpoint_bytes"] or local_bytes
    if "group" in entry:
        plan_the_group(module, entry, config, checkpoint_bytes)
    try:
        result = plan(
            entry,
            config=config,
            gpus=params["gpus"],
            layout=params["layout"],
            checkpoint_bytes=checkpoint_bytes,
            runtime_overhead_bytes=int(params["runtime_overhead_gib"] * GIB),
            **serve_options(params),
        )
    except (PlanInputError, ServeSpecError) as error:
        module.fail_json(msg=f"Cannot plan {name}: {error}")
    for warning in result["layout_warnings"]:
        module.warn(warning)
    if not result["ok"]:
        module.fail_json(msg=failure_message(result), **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
