# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where a multi-host catalog entry runs: the inventory group that serves it and how its layout spreads.

An entry with `group` is one model served by every host of an inventory group through vLLM's own multi-node
serving. Its `layout` counts over the whole group; `group` places it. A layout with data parallel ranks
(data_parallel_size above 1) puts whole ranks on each host (vLLM's --data-parallel-* flags, headless workers);
one without spreads a single replica's tensor x pipeline ranks over the hosts (vLLM's --nnodes flags).
`check_group` is pure and names the key that is wrong.
"""

from __future__ import annotations

import numbers
import re

DATA_PARALLEL = "data_parallel"
MODEL_PARALLEL = "model_parallel"
# Ansible warns on group names that are not valid variable names.
INVENTORY_GROUP = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# `internal`: one API server on the head, vLLM balancing over every rank; `hybrid`: an API server on every host
# for its own ranks (vLLM's --data-parallel-hybrid-lb), behind a router.
LOAD_BALANCING = ("internal", "hybrid")
# How the hosts reach each other. Only an NVLink domain that spans hosts carries a tensor parallel all-reduce at
# the speed of NVLink within a host.
INTERCONNECTS = ("ethernet", "infiniband", "nvlink")
# vLLM's defaults: the port that data parallel hosts dial on the head, and torch's rendezvous port.
DEFAULT_RPC_PORT = 29550
DEFAULT_MASTER_PORT = 29501
GROUP_DEFAULTS = {
    # The host whose address the others dial and that serves the API; unset: the group's first host.
    "head": None,
    "data_parallel_size_local": None,
    "load_balancing": "internal",
    "interconnect": None,
    "rpc_port": None,
    "master_port": None,
}
# Flags that differ from host to host, written for each host from the group: in extra_args they would be the same
# on every host.
GROUP_FLAGS = (
    "--headless",
    "--data-parallel-size-local",
    "--data-parallel-start-rank",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--data-parallel-hybrid-lb",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
)
# Variables that name a host's own address and network devices: each host gets its own from its inventory.
HOST_VARIABLES = ("VLLM_HOST_IP", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA")


def _whole(value):
    """A whole number from a number or its text (what `-e key=8` gives); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def group_mode(layout):
    """`data_parallel` where the layout has data parallel ranks to place on hosts, else `model_parallel`."""
    return DATA_PARALLEL if _whole(layout.get("data_parallel_size", 1)) > 1 else MODEL_PARALLEL


def _port(group, key, default):
    port = _whole(group[key] if group[key] is not None else default)
    if port is None or not 1 <= port <= 65535:
        raise ValueError(f"group.{key} must be a port from 1 to 65535, got {group[key]!r}")
    return port


def _not_in_mode(group, key, why):
    if group[key] is not None:
        raise ValueError(f"group.{key} {why}; remove it")


def check_group(group, layout):
    """The entry's group with defaults filled in, checked against its (already checked) layout; ValueError naming
    the key otherwise."""
    if not isinstance(group, dict):
        raise ValueError(f"group must be a mapping with hosts (an inventory group), got {group!r}")
    unknown = sorted(set(group) - set(GROUP_DEFAULTS) - {"hosts"})
    if unknown:
        raise ValueError(f"group has unknown keys {unknown}; known keys: {['hosts', *GROUP_DEFAULTS]}")
    group = dict(GROUP_DEFAULTS, **group)
    if not isinstance(group.get("hosts"), str) or not INVENTORY_GROUP.match(group["hosts"]):
        raise ValueError(
            f"group.hosts must name an inventory group (letters, digits and underscores), got {group.get('hosts')!r}"
        )
    head = group["head"]
    if head is not None and (not isinstance(head, str) or not head or any(char.isspace() for char in head)):
        raise ValueError(f"group.head must be the inventory name of one host of the group, got {head!r}")
    if group["load_balancing"] not in LOAD_BALANCING:
        raise ValueError(f"group.load_balancing must be one of {list(LOAD_BALANCING)}, got {group['load_balancing']!r}")
    if group["interconnect"] is not None and group["interconnect"] not in INTERCONNECTS:
        raise ValueError(f"group.interconnect must be one of {list(INTERCONNECTS)}, got {group['interconnect']!r}")

    data_parallel_size = _whole(layout.get("data_parallel_size", 1))
    if group_mode(layout) == MODEL_PARALLEL:
        no_ranks = "places data parallel ranks, and the layout has none (data_parallel_size 1)"
        _not_in_mode(group, "data_parallel_size_local", no_ranks)
        _not_in_mode(group, "rpc_port", "is dialled by data parallel hosts, and the layout has no data parallel ranks")
        if group["load_balancing"] == "hybrid":
            raise ValueError(
                "group.load_balancing hybrid balances data parallel ranks, and the layout has one replica "
                "(data_parallel_size 1); set internal"
            )
        group["master_port"] = _port(group, "master_port", DEFAULT_MASTER_PORT)
        return group

    local = _whole(group["data_parallel_size_local"])
    if local is None or local < 1:
        raise ValueError(
            "group.data_parallel_size_local (the data parallel ranks on each host) must be a whole number of at "
            f"least 1 with data_parallel_size {data_parallel_size}, got {group['data_parallel_size_local']!r}"
        )
    if data_parallel_size % local:
        raise ValueError(
            f"group.data_parallel_size_local {local} does not divide data_parallel_size {data_parallel_size}: "
            "every host runs the same number of ranks"
        )
    if local == data_parallel_size:
        raise ValueError(
            f"group.data_parallel_size_local {local} puts all {data_parallel_size} data parallel ranks on one host: "
            "that is a one-host entry (remove group)"
        )
    _not_in_mode(group, "master_port", "is the rendezvous of one replica over hosts; data parallel hosts dial rpc_port")
    group["data_parallel_size_local"] = local
    group["rpc_port"] = _port(group, "rpc_port", DEFAULT_RPC_PORT)
    return group


def check_group_entry_settings(entry):
    """Refuse what a multi-host entry cannot hold: other layouts, per-host flags or variables shared by all hosts."""
    if entry["alternatives"]:
        raise ValueError(
            f"a multi-host entry has one layout; alternatives {sorted(entry['alternatives'])} need entries of their own"
        )
    for arg in entry["extra_args"]:
        flag = arg.split("=", 1)[0].replace("_", "-")
        if flag in GROUP_FLAGS:
            raise ValueError(f"{flag} in extra_args: the group writes it for each host from group and layout")
    for name in HOST_VARIABLES:
        if name in entry["env"]:
            raise ValueError(
                f"env sets {name}, which each host of a group needs its own of: the group planner writes it from "
                "the host's inventory (address, interface, ib_hca)"
            )
