# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus targets of a host's vLLM instances, from their records: file-based service discovery.

A host's instances become one file_sd file, a list of target groups with one target each: the address where
Prometheus scrapes the instance's /metrics and labels that say what it is (host, vllm_instance, model,
served_name, gpus, vllm_version). An instance is a target while systemd is to run it: its unit is enabled, or it
runs (an instance asleep after a sleep swap). An instance that stop.yml or a swap has stopped and disabled is
not, so an alert never follows a planned stop. Where an instance is reached comes from its record, the one writer
of its URL.

The guard of each member of a multi-host group (the group guard, which restarts its member when the group stops
serving) is a target of its own job, at the port that the member's record gives (`group.guard_port`) on the
address that its server listens on, with the labels host, vllm_instance and model.

The host's router (vllm-router, one per host) is a target of its own job, at the address and port of its metrics
that its unit's command line gives (`--prometheus-host`, `--prometheus-port`).
"""

from __future__ import annotations

import ipaddress
import urllib.parse

from ansible_collections.llmops.vllm.plugins.module_utils.instance.host_instances import RUNNING_STATES
from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import (
    WILDCARD_HOSTS,
    local_url,
    remote_url,
)


def is_target(active_state: str, unit_file_state: str) -> bool:
    """Whether systemd is to run the instance: its unit is enabled, or it runs now."""
    return unit_file_state == "enabled" or active_state in RUNNING_STATES


def _netloc(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc


def only_local(record: dict) -> bool:
    """Whether the server listens on loopback alone, where no other host reaches it."""
    try:
        return ipaddress.ip_address(record["host"]).is_loopback
    except ValueError:  # a host name
        return record["host"] == "localhost"


def scrape_address(record: dict, address: str, local: bool) -> str:
    """HOST:PORT where Prometheus reads the instance's /metrics: on the host itself (`local`), or from another
    host through `address`, this host's, when the server listens on every address."""
    if local or record["host"] not in WILDCARD_HOSTS:
        return _netloc(record["url"])
    return _netloc(remote_url(record, address))


def labels(record: dict, host: str) -> dict:
    """The target's labels; `gpus` is `all` for an instance that names none (every GPU of the host, if any)."""
    return {
        "host": host,
        "vllm_instance": record["instance"],
        "model": record["model"],
        "served_name": record["served_name"],
        "gpus": ",".join(map(str, record["gpus"])) or "all",
        "vllm_version": record["vllm_version"],
    }


def target_groups(records: list[dict], host: str, address: str, local: bool) -> list[dict]:
    """The file_sd groups of the records, for a Prometheus on the host (`local`) or on another one.

    From another host, an instance that listens on loopback alone is out of reach: it is left out (see
    `only_local`). So is a member of a multi-host group that serves no API (a headless worker): its group's
    metrics are the head's, whose own record makes the target.
    """
    return [
        {"targets": [scrape_address(record, address, local)], "labels": labels(record, host)}
        for record in records
        if (local or not only_local(record)) and record.get("group", {}).get("serves_api", True)
    ]


def _listener_target(listen_host: str, port: int, address: str, local: bool) -> str | None:
    """HOST:PORT where Prometheus reads what listens on `listen_host`:`port` beside the instances (a group guard, the
    router), placed as an instance's record places its server so that both are reached the same way; None from
    another host when it listens on loopback alone."""
    listener = {"host": listen_host, "url": local_url(listen_host, port), "port": port}
    if not local and only_local(listener):
        return None
    return scrape_address(listener, address, local)


def guard_target_groups(records: list[dict], host: str, address: str, local: bool) -> list[dict]:
    """The file_sd groups of the group guards of the records' multi-host group members, for a Prometheus on the host
    (`local`) or on another one, which does not reach a guard on loopback. A guard listens where its member's server
    does, on its own port."""
    groups = []
    for record in records:
        port = record.get("group", {}).get("guard_port")
        target = _listener_target(record["host"], port, address, local) if port else None
        if target:
            labels = {"host": host, "vllm_instance": record["instance"], "model": record["model"]}
            groups.append({"targets": [target], "labels": labels})
    return groups


def router_target_groups(metrics: tuple[str, int] | None, host: str, address: str, local: bool) -> list[dict]:
    """The file_sd group of the host's router, whose metrics listen on `metrics` (address, port; None: no router),
    for a Prometheus on the host (`local`) or on another one, which does not reach metrics on loopback: then none."""
    target = _listener_target(*metrics, address, local) if metrics else None
    return [{"targets": [target], "labels": {"host": host}}] if target else []
