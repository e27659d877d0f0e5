# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The layout planner for one model over the hosts of an inventory group, served by vLLM's multi-node serving.

`plan_group` checks a multi-host catalog entry (plan/group_layout.py) against the model's config.json and every
host's GPU facts: the model's rules on the layout of the whole group, as `plan` checks them for one host; each
host's GPU count, compute capability and memory on its share of the layout; and the rules that only a group has
(two hosts or more, alike; an address for each; the layout split evenly; tensor parallelism within a host). Every
rule that fails is named, with the host it failed on. For each host it returns its role, its ranks, the vLLM
arguments and the environment it adds to the server's, and its memory plan. Pure: the facts come in as data.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import dataclass

from ansible_collections.llmops.vllm.plugins.module_utils.plan.group_layout import DATA_PARALLEL, group_mode
from ansible_collections.llmops.vllm.plugins.module_utils.plan.model_shape import PlanInputError, model_shape
from ansible_collections.llmops.vllm.plugins.module_utils.plan.planner import (
    Layout,
    gpu_list,
    gpu_rules,
    model_checks,
    planning_settings,
)

HEAD = "head"
WORKER = "worker"
STATUS = {True: "pass", False: "fail", None: "skipped"}


@dataclass(frozen=True)
class Placement:
    """One host's part of the group."""

    # 0 for the head, then the other hosts in inventory order.
    node_rank: int
    # The data parallel ranks that it runs; none where one replica spreads over the hosts.
    data_parallel_ranks: tuple
    # Engines alone, no API server.
    headless: bool

    @property
    def role(self):
        return HEAD if self.node_rank == 0 else WORKER


def placements(layout, group, host_count):
    """The Placement of each node rank, the head's first."""
    if group_mode(layout) == DATA_PARALLEL:
        local = group["data_parallel_size_local"]
        hybrid = group["load_balancing"] == "hybrid"
        return [
            Placement(rank, tuple(range(rank * local, (rank + 1) * local)), headless=rank > 0 and not hybrid)
            for rank in range(host_count)
        ]
    return [Placement(rank, (), headless=rank > 0) for rank in range(host_count)]


def group_serve_args(layout, group, placement, host_count, head_address):
    """The arguments that one host of the group adds to the server's (build_serve_args' for the entry's layout)."""
    hybrid = group["load_balancing"] == "hybrid"
    if group_mode(layout) == DATA_PARALLEL:
        args = ["--data-parallel-size-local", str(len(placement.data_parallel_ranks))]
        # vLLM reads a start rank on a host with an API server as hybrid balancing: the head of one API server has none.
        if placement.headless or hybrid:
            args += ["--data-parallel-start-rank", str(placement.data_parallel_ranks[0])]
        args += ["--data-parallel-address", head_address, "--data-parallel-rpc-port", str(group["rpc_port"])]
        if hybrid:
            args.append("--data-parallel-hybrid-lb")
    else:
        args = ["--nnodes", str(host_count), "--node-rank", str(placement.node_rank)]
        args += ["--master-addr", head_address, "--master-port", str(group["master_port"])]
    if placement.headless:
        args.append("--headless")
    else:
        # vLLM starts an API server per data parallel rank of the host by default; one process serves here, as on
        # one host, so that a stop asks that process which requests it cut off.
        args += ["--api-server-count", "1"]
    return args


def host_environment(host):
    """The variables that one host of the group adds to the server's environment."""
    environment = {"VLLM_HOST_IP": host["address"]}
    if host.get("interface"):
        # Without them gloo and NCCL take the first interface they find, often one the other hosts cannot reach.
        environment["GLOO_SOCKET_IFNAME"] = environment["NCCL_SOCKET_IFNAME"] = host["interface"]
    if host.get("ib_hca"):
        environment["NCCL_IB_HCA"] = host["ib_hca"]
    return environment


def _checked_hosts(hosts):
    if not isinstance(hosts, list) or not all(isinstance(host, dict) for host in hosts):
        raise PlanInputError(f"hosts must be a list of hosts (name, address, gpus), got {hosts!r}")
    names = [host.get("name") for host in hosts]
    if not all(isinstance(name, str) and name for name in names):
        raise PlanInputError(f"every host needs its inventory name; got names {names!r}")
    repeated = sorted(name for name, count in Counter(names).items() if count > 1)
    if repeated:
        raise PlanInputError(f"hosts {repeated} are listed more than once")
    return [{**host, "gpu_list": gpu_list(host.get("gpus"))} for host in hosts]


def _check_hosts(group, names):
    if not names:
        return False, f"inventory group {group['hosts']} has no hosts"
    if len(names) == 1:
        return False, (
            f"inventory group {group['hosts']} has one host ({names[0]}): serve it with a one-host entry (a layout "
            "without group)"
        )
    return True, f"{len(names)} hosts: {', '.join(names)}"


def _check_head(group, names):
    if group["head"] is not None and group["head"] not in names:
        return (
            False,
            f"group.head {group['head']} is not a host of inventory group {group['hosts']} ({', '.join(names)})",
        )
    return True, f"{group['head'] or names[0]} (node rank 0)"


def _address_problem(host):
    address = host.get("address")
    if not address:
        return f"{host['name']} has no address"
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return f"{host['name']}'s address {address!r} is not an IP address, which VLLM_HOST_IP must be"
    if parsed.is_loopback or parsed.is_unspecified:
        return f"{host['name']}'s address {address} is not one that the other hosts can reach"
    return None


def _check_addresses(hosts):
    problems = [problem for problem in map(_address_problem, hosts) if problem]
    by_address = Counter(host.get("address") for host in hosts if host.get("address"))
    problems += [
        f"{', '.join(host['name'] for host in hosts if host.get('address') == address)} share address {address}"
        for address, count in by_address.items()
        if count > 1
    ]
    if problems:
        return False, "; ".join(problems) + " (each host needs an address of its own that the others reach)"
    return True, ", ".join(f"{host['name']} {host['address']}" for host in hosts)


def _gpu_kinds(gpus):
    kinds = Counter((gpu.get("name", "GPU"), gpu["memory_total_mib"]) for gpu in gpus)
    return " + ".join(f"{count} x {name} ({memory} MiB)" for (name, memory), count in sorted(kinds.items()))


def _check_same_gpus(hosts):
    by_kind = {}
    for host in hosts:
        if host["gpu_list"]:
            by_kind.setdefault(_gpu_kinds(host["gpu_list"]), []).append(host["name"])
    if len(by_kind) > 1:
        listed = "; ".join(f"{', '.join(names)}: {kind}" for kind, names in by_kind.items())
        return False, f"the hosts of a group need the same GPUs, as every rank takes the same share: {listed}"
    return True, f"{next(iter(by_kind), 'no GPUs')} on each host"


def _share_per_host(layout, group, mode, host_count):
    """GPUs that each host gives the layout, or None where the layout does not split evenly over the hosts."""
    if mode == DATA_PARALLEL:
        return group["data_parallel_size_local"] * layout.tensor * layout.pipeline
    replica = layout.tensor * layout.pipeline
    return None if replica % host_count else replica // host_count


def _check_host_count(layout, group, mode, host_count):
    if mode == DATA_PARALLEL:
        local = group["data_parallel_size_local"]
        needed = layout.data // local
        if needed != host_count:
            return False, (
                f"data_parallel_size {layout.data} at data_parallel_size_local {local} per host needs {needed} hosts; "
                f"inventory group {group['hosts']} has {host_count}"
            )
        return True, f"{local} data parallel rank(s) on each of the {host_count} hosts"
    replica = layout.tensor * layout.pipeline
    if replica % host_count:
        return False, f"{layout.describe()} takes {replica} GPUs, which do not split evenly over {host_count} hosts"
    return True, f"{replica // host_count} GPUs on each of the {host_count} hosts"


def _check_tensor_parallel_across_hosts(layout, group, per_host, host_count):
    if not per_host % layout.tensor:
        return True, f"each tensor parallel group of {layout.tensor} stays within a host ({per_host} GPUs each)"
    if group["interconnect"] == "nvlink":
        return True, f"tensor parallel groups of {layout.tensor} cross hosts over NVLink (group.interconnect nvlink)"
    network = group["interconnect"] or "group.interconnect not stated"
    return False, (
        f"tensor parallel groups of {layout.tensor} do not fit the {per_host} GPUs that each host gives, so they "
        f"cross hosts and every layer's all-reduce goes over the network ({network}), "
        f"far slower than NVLink within a host; keep tensor parallelism within a host and spread over hosts with "
        f"pipeline stages (tensor_parallel_size {per_host}, pipeline_parallel_size {host_count}) or data/expert "
        "parallel ranks; group.interconnect nvlink states that the hosts share one NVLink domain, which allows it"
    )


def _group_checks(layout, group, mode, hosts, per_host):
    names = [host["name"] for host in hosts]
    checks = [("hosts", *_check_hosts(group, names))]
    if len(names) < 2:
        return checks
    checks += [
        ("head", *_check_head(group, names)),
        ("addresses", *_check_addresses(hosts)),
        ("same_gpus", *_check_same_gpus(hosts)),
        ("host_count", *_check_host_count(layout, group, mode, len(names))),
    ]
    if mode != DATA_PARALLEL and per_host:
        checks.append(
            ("tensor_parallel_across_hosts", *_check_tensor_parallel_across_hosts(layout, group, per_host, len(names)))
        )
    return checks


def _host_checks(shape, layout, mode, host, per_host, settings, cpu_group):
    """(checks, memory) of one host on its share of the layout; in a group of CPU hosts the GPU rules are skipped,
    as on one host without GPUs."""
    gpus = host["gpu_list"]
    if not gpus and cpu_group:
        return [("gpus", None, "no GPUs on any host of the group: GPU count and memory not checked")], None
    if not gpus:
        missing = "no GPUs in its facts (vllm_gpus.present false), unlike other hosts of the group"
        return [("gpus", False, missing)], None
    if per_host is None:
        return [("gpu_count", None, "not checked: the layout does not split evenly over the hosts")], None
    if per_host > len(gpus):
        if mode == DATA_PARALLEL:
            rank = Layout(tensor=layout.tensor, pipeline=layout.pipeline).describe()
            share = f"{per_host // (layout.tensor * layout.pipeline)} data parallel rank(s) of {rank} need"
        else:
            share = f"its share of {layout.describe()} is"
        return [("gpu_count", False, f"{share} {per_host} GPUs; this host has {len(gpus)}")], None
    checks, memory = gpu_rules(shape, layout, gpus[:per_host], settings)
    return [("gpu_count", True, f"{per_host} of {len(gpus)} GPUs"), *checks], memory


def _as_checks(checks):
    return [{"rule": rule, "status": STATUS[passed], "detail": detail} for rule, passed, detail in checks]


def group_hosts(names, hostvars):
    """The hosts of a group as plan_group takes them, from the inventory: each one's address (vllm_worker_address,
    else ansible_host, else its name), GPU facts (vllm_gpus, read in this play), and where set its network interface
    (vllm_network_interface) and InfiniBand HCAs (vllm_nccl_ib_hca)."""
    unknown = [name for name in names if name not in hostvars]
    if unknown:
        raise PlanInputError(f"{', '.join(unknown)} not in the inventory")
    hosts = []
    for name in names:
        found = hostvars[name]
        host = {
            "name": name,
            "address": found.get("vllm_worker_address") or found.get("ansible_host") or name,
            "gpus": found.get("vllm_gpus"),
        }
        optional = {"interface": found.get("vllm_network_interface"), "ib_hca": found.get("vllm_nccl_ib_hca")}
        hosts.append({**host, **{key: value for key, value in optional.items() if value}})
    return hosts


def plan_group(entry, config, hosts, **options):
    """Plan a multi-host catalog entry over the hosts of its inventory group.

    entry: a checked catalog entry with `group`; config: config.json as a dict, or None (model rules skipped);
    hosts: the group's hosts in inventory order, each {name, address, gpus (the vllm_gpus facts), and optionally
    interface (the network interface the hosts reach each other on) and ib_hca (NCCL_IB_HCA)}. options:
    max_model_len, checkpoint_bytes, runtime_overhead_bytes, as `plan` takes them.

    Returns `ok`, `mode` (`data_parallel` or `model_parallel`), the layout, `checks` (the model's and the group's
    rules), `hosts` (each host with its role, node rank, data parallel ranks, whether it serves the API, the GPUs it
    gives, `group_args`, `environment`, its `checks` and `memory`; the head first), `failed_rules` (every rule that
    failed, on the group or on any host) and `reason` (what each found, host by host).
    """
    group = entry.get("group")
    if not group:
        raise PlanInputError(f"{entry['name']} has no group: it is planned on one host")
    hosts = _checked_hosts(hosts)
    shape = None if config is None else model_shape(config)
    settings = planning_settings(entry, shape, options)
    layout = Layout.from_mapping(entry["layout"])
    mode = group_mode(entry["layout"])
    per_host = _share_per_host(layout, group, mode, len(hosts)) if hosts else None
    group_checks = model_checks(shape, layout, settings) + _as_checks(
        _group_checks(layout, group, mode, hosts, per_host)
    )
    cpu_group = not any(host["gpu_list"] for host in hosts)
    head_name = group["head"] if group["head"] in [host["name"] for host in hosts] else None
    ordered = sorted(hosts, key=lambda host: host["name"] != head_name)
    # Without an address for each host, what the hosts would dial and announce is unknown.
    reachable = any(check["rule"] == "addresses" and check["status"] == "pass" for check in group_checks)
    head_address = ordered[0]["address"] if reachable else None
    planned = []
    for host, placement in zip(ordered, placements(entry["layout"], group, len(ordered)), strict=True):
        checks, memory = _host_checks(shape, layout, mode, host, per_host, settings, cpu_group)
        planned.append(
            {
                "name": host["name"],
                "address": host.get("address"),
                "role": placement.role,
                "node_rank": placement.node_rank,
                "data_parallel_ranks": list(placement.data_parallel_ranks),
                "serves_api": not placement.headless,
                "gpus": per_host,
                "group_args": group_serve_args(entry["layout"], group, placement, len(ordered), head_address)
                if reachable
                else None,
                "environment": host_environment(host) if reachable else None,
                "checks": _as_checks(checks),
                "memory": memory,
            }
        )
    failures = [(None, check) for check in group_checks if check["status"] == "fail"]
    failures += [(host["name"], check) for host in planned for check in host["checks"] if check["status"] == "fail"]
    description = f"{layout.describe()} over {len(hosts)} host(s) of {group['hosts']}"
    result = {
        "ok": not failures,
        "mode": mode,
        "layout": layout.as_mapping(),
        "description": description,
        "checks": group_checks,
        "hosts": planned,
        "failed_rules": list(dict.fromkeys(check["rule"] for _host, check in failures)),
        "reason": None,
    }
    if failures:
        result["reason"] = f"{entry['name']} {description}: " + "; ".join(
            f"{host}: {check['detail']}" if host else check["detail"] for host, check in failures
        )
    return result
