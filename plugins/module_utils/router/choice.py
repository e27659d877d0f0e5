# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which instances are a router's workers and their key, from the records of the hosts behind it; the status rows
and the refusals of a router as the playbooks print them."""

from __future__ import annotations

from ansible_collections.llmops.vllm.plugins.module_utils.router.record import RouterError, worker_url


def choose_workers(backends: list[dict], served_name: str = "", names=()) -> dict:
    """The router's workers among the backends' instances and the model they serve; see `chosen_key` for their key.

    backends: one per host, {host, address, instances}, the instances as llmops.vllm.vllm_instance_info returns
    them with their keys. The workers are the running instances named in `names` (all by default) that serve
    `served_name` (by default the one model that they all serve). They must take one key: the router forwards
    its client's key to whichever worker it picks. A multi-host group's worker is left out: the group's head serves
    its API.
    """
    chosen, stopped = [], []
    for backend in backends:
        for instance in backend["instances"]:
            if names and instance["instance"] not in names:
                continue
            if served_name and instance["served_name"] != served_name:
                continue
            # A multi-host group is reached at its head's API server: its headless workers are no router's workers.
            if not (instance.get("group") or {}).get("serves_api", True):
                continue
            if instance.get("active_state") != "active":
                if names:
                    stopped.append(f"{instance['instance']} on {backend['host']} ({instance.get('active_state')})")
                continue
            chosen.append((backend, instance))
    if stopped:
        raise RouterError(f"instances named for the router do not run: {', '.join(stopped)}; start them first")
    if not chosen:
        raise RouterError(
            f"no running instance {'of ' + served_name + ' ' if served_name else ''}on "
            f"{', '.join(backend['host'] for backend in backends) or 'no host'} for the router to send requests to"
        )
    models = sorted({instance["served_name"] for _backend, instance in chosen})
    if len(models) > 1:
        raise RouterError(
            f"the instances serve {', '.join(models)}: a router sends any request to any of its workers, so they must "
            "serve one model; choose it with vllm_router_served_name"
        )
    keys = {}
    for backend, instance in chosen:
        keys.setdefault(instance.get("api_key") or None, []).append(f"{instance['instance']} on {backend['host']}")
    if len(keys) > 1:
        groups = "; ".join(", ".join(holders) for holders in keys.values())
        raise RouterError(
            "the instances take different API keys (one group per key: " + groups + "); the router forwards its "
            "client's key to whichever worker it picks, so its workers must take one key"
        )
    workers = [
        {"host": backend["host"], "instance": instance["instance"], "url": worker_url(instance, backend["address"])}
        for backend, instance in chosen
    ]
    return {"served_name": models[0], "workers": workers, "api_key": next(iter(keys))}


def chosen_workers(backends: list[dict], served_name: str = "", names=()) -> dict:
    """`choose_workers` without the key: what may be shown (a refusal names instances, never a key)."""
    choice = choose_workers(backends, served_name, names)
    return {"served_name": choice["served_name"], "workers": choice["workers"]}


def chosen_key(backends: list[dict], served_name: str = "", names=()) -> str | None:
    """The key that the chosen workers take, and the router's clients send; None for none. Never to be shown."""
    return choose_workers(backends, served_name, names)["api_key"]


def status_rows(router: dict, host: str) -> list[dict]:
    """The rows of a router in the status table: one per worker it lists, or one saying it lists none."""
    state = router["active_state"] + ("" if router["reachable"] else ", not answering")
    base = {"host": host, "router": router["url"], "model": router["served_name"], "state": state}
    workers = router["workers"] or [{"url": None, "healthy": None, "load": None}]
    return [
        {
            **base,
            "worker": worker["url"] or "-",
            "health": {True: "healthy", False: "unhealthy", None: "-"}[worker["healthy"]],
            "in_flight": worker["load"],
        }
        for worker in workers
    ]


def refusals(checked: list[dict], drained_urls: list[str]) -> list[str]:
    """Why instances may not be taken out of these routers now: one phrase per router that does not answer, and per
    router that lists one of `drained_urls` and that the new instance does not fit; [] when they may.

    checked: the results of llmops.vllm.vllm_router_info on each router host (`item`: the host), with `fits` when a
    new instance was compared.
    """
    found = []
    for result in checked:
        router, host = result["router"], result["item"]
        if not router["reachable"]:
            found.append(f"the router on {host} does not answer: {router['error']}")
            continue
        listed = [worker["url"] for worker in router["workers"] if worker["url"] in drained_urls]
        fit = result.get("fits")
        if listed and fit and not fit["ok"]:
            found.append(
                f"the router on {host} sends requests to {', '.join(listed)}, and the instance to take its place "
                f"cannot be its worker: {'; '.join(fit['reasons'])}"
            )
    return found


def routers_listing(checked: list[dict], urls: list[str]) -> list[str]:
    """The router hosts (the results' `item`) whose running router lists one of `urls`."""
    return [
        result["item"] for result in checked if any(worker["url"] in urls for worker in result["router"]["workers"])
    ]
