# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One row of the fleet's status table per instance, from what llmops.vllm.vllm_instance_info returns."""

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
    }
