# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One row of the fleet's status table per instance, from what llmops.vllm.vllm_instance_info returns, and one per
multi-host group, whose members are rows of several hosts."""

from __future__ import annotations


def _clock(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def status_row(instance: dict, host: str, gpus: dict) -> dict:
    """The row of one instance: model, port, unit state, uptime, restarts, load, KV cache and GPU memory.

    gpus: the host's vllm_gpus facts (llmops.vllm.gpu_facts); an instance that names no GPUs uses them all.
    """
    on_gpus = []
    if gpus.get("present"):
        on_gpus = [gpu for gpu in gpus["gpus"] if not instance["gpus"] or gpu["index"] in instance["gpus"]]
    kv_cache = instance.get("kv_cache_usage")
    death = instance.get("engine_death")
    group = instance.get("group") or {}
    return {
        "host": host,
        "instance": instance["instance"],
        "model": instance["model"],
        "port": instance["port"],
        "state": instance["active_state"]
        + (", asleep" if instance.get("asleep") else "")
        + ("" if instance["enabled"] else ", disabled"),
        "uptime": _clock(instance.get("uptime")),
        "restarts": instance.get("restarts"),
        "engine_death": f"{host} {instance['instance']}: {death}" if death else None,
        "running": instance.get("requests_running"),
        "waiting": instance.get("requests_waiting"),
        "kv": None if kv_cache is None else round(kv_cache * 100, 1),
        "gpu_mib": sum(gpu["memory_used_mib"] for gpu in on_gpus) if on_gpus else None,
        "group": {"role": group["role"], "head": group["head"]["name"]} if group else None,
    }


# What the group's head alone knows: a worker's record reads its metrics at the head, the same figures again.
HEAD_ONLY = ("port", "uptime", "running", "waiting", "kv", "gen_tok_s", "prompt_tok_s")


def group_rows(rows: list[dict]) -> list[dict]:
    """The status rows with each multi-host group as one row, where its head's row is: its hosts (the head first),
    each host's state where they differ, the restarts and GPU memory of every host, how each member's engine died,
    and what the head alone knows (its port, uptime, requests, KV cache, tokens per second)."""
    members: dict[tuple, list[dict]] = {}
    for row in rows:
        if row.get("group"):
            members.setdefault((row["instance"], row["group"]["head"]), []).append(row)
    merged, done = [], set()
    for row in rows:
        key = (row["instance"], row["group"]["head"]) if row.get("group") else None
        if key is None:
            merged.append(row)
            continue
        if key in done:
            continue
        done.add(key)
        group = sorted(members[key], key=lambda member: member["group"]["role"] != "head")
        head = group[0] if group[0]["group"]["role"] == "head" else {}
        states = {member["state"] for member in group}
        known = {
            name: [member[name] for member in group if member[name] is not None] for name in ("restarts", "gpu_mib")
        }
        merged.append(
            {
                **{name: head.get(name) for name in HEAD_ONLY if name in row},
                "host": "+".join(member["host"] for member in group),
                "instance": row["instance"],
                "model": row["model"],
                "state": states.pop() if len(states) == 1 else "; ".join(f"{m['host']} {m['state']}" for m in group),
                **{name: sum(values) if values else None for name, values in known.items()},
                "engine_death": "; ".join(member["engine_death"] for member in group if member["engine_death"]) or None,
                "group": {"role": "group", "head": key[1]},
            }
        )
    return merged
