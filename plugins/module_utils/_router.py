# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM's router (the PyPI package vllm-router) in front of vLLM instances: its record, its workers, its HTTP API.

One router per host. Its record, CONFIG_DIR/router.json, says where it listens, which model its workers serve,
how it checks their health and where its key lives; CONFIG_DIR/workers.json lists the base URLs of its workers,
which the router reads when it starts and which `llmops.vllm.vllm_router_workers` keeps in step with the live
router. A worker is an instance, reached at the URL that `worker_url` derives from the instance's own record.

What the router (0.1.17) does, read from its wheel and seen against it:
- It forwards a client's Authorization header to the worker as it came, so a router needs no key of its own to
  reach its workers; they must all take the key that its clients send.
- Its own `--api-key` is the key it sends for data-parallel routing alone; it checks nothing. Its management
  routes (/add_worker, /remove_worker, /list_workers, /workers) answer anyone. The Rust core can check every
  request's key against a URL (`api_key_validation_urls`, which the launcher does not expose): the collection's
  launcher gives it a key check on loopback, so that without the key nothing of the router answers.
- /add_worker waits until the worker answers /health; /remove_worker stops new requests to the worker at once,
  and requests in flight on it stream to their end.
- It forwards paths it does not know (/sleep, /collective_rpc) to a worker, without the client's key: a worker on
  loopback would take them as the host's own. So the router reaches every instance over the network.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import urllib.parse
from contextlib import contextmanager

from ansible_collections.llmops.vllm.plugins.module_utils._file_writer import current_text, write_if_changed
from ansible_collections.llmops.vllm.plugins.module_utils._instance_record import (
    WILDCARD_HOSTS,
    local_url,
    remote_url,
)
from ansible_collections.llmops.vllm.plugins.module_utils._systemd import environment_file, parse_environment_file
from ansible_collections.llmops.vllm.plugins.module_utils._vllm_api import (
    check_base_url,
    get,
    metric_total,
    post,
    served_models,
)

DEFAULT_CONFIG_DIR = "/etc/vllm-router"
RECORD_FILE = "router.json"
WORKERS_FILE = "workers.json"
API_KEY_VARIABLE = "VLLM_ROUTER_API_KEY"
# The router's metrics stay on loopback unless asked otherwise: they name every worker's URL.
METRICS_HOST = "127.0.0.1"
POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "consistent_hash")
# Flags that the role sets from the record, or that would put a secret on the command line.
RESERVED_FLAGS = ("--host", "--port", "--worker-urls", "--api-key", "--prometheus-host", "--prometheus-port")
RECORD_FIELDS = (
    "unit",
    "host",
    "port",
    "url",
    "served_name",
    "version",
    "python",
    "policy",
    "health_check_interval",
    "health_failure_threshold",
    "health_check_timeout",
    "queue_timeout",
    "metrics_url",
    "secrets",
    "workers_file",
)
# Router metrics (its /metrics, on the Prometheus port): requests it completed, and those that ended in an error.
REQUESTS_METRIC = "vllm_router_requests_total"
ERRORS_METRIC = "vllm_router_request_errors_total"
FIX = "run playbooks/router.yml"
RETRIES_METRIC = "vllm_router_retries_total"


class RouterError(ValueError):
    """The router cannot be used as asked; the message says what was expected, what was found, what to do."""


class RouterUnreachable(RouterError):
    """No HTTP answer from the router: it is stopped, or not reachable from here."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def worker_url(record: dict, address: str) -> str:
    """Where a router reaches an instance (its record): over the network, never on loopback.

    An instance listening on every address is reached at its host's `address`; one listening on a single
    address, at its record's URL. vLLM's guard of its development endpoints takes a client on loopback for the
    host itself, and the router forwards paths it does not know without the client's key: on loopback, a
    router's client would reach /sleep or /collective_rpc of an instance in development mode.
    """
    listen = record["host"]
    if _is_loopback(listen):
        raise RouterError(
            f"instance {record['instance']} listens on {listen} alone; a router reaches its workers over the network "
            "(see docs/fleet.md, Behind a router): deploy it with vllm_server_host 0.0.0.0 or an address of its host"
        )
    if listen in WILDCARD_HOSTS:
        if not address or _is_loopback(address):
            raise RouterError(
                f"instance {record['instance']} listens on every address, and its host's address for the router is "
                f"{address!r}: set vllm_worker_address to an address of that host that the router reaches"
            )
        return remote_url(record, address)
    return record["url"]


def _whole(value, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RouterError(f"{what} must be a whole number from {low} to {high}, got {value!r}")
    return value


def check_settings(settings: dict) -> dict:
    """The router's settings (the role's inputs), each checked; RouterError names the first bad one."""
    if settings["policy"] not in POLICIES:
        raise RouterError(f"policy must be one of {', '.join(POLICIES)}, got {settings['policy']!r}")
    for name in ("port", "prometheus_port"):
        _whole(settings[name], 1, 65535, name)
    if settings["port"] == settings["prometheus_port"]:
        raise RouterError(f"port and prometheus_port are both {settings['port']}: the router needs two ports")
    for name in ("health_check_interval", "health_failure_threshold", "health_check_timeout", "queue_timeout"):
        _whole(settings[name], 1, 86400, name)
    if not settings["prometheus_host"]:
        settings = {**settings, "prometheus_host": METRICS_HOST}
    for name in ("host", "prometheus_host"):
        if not isinstance(settings[name], str) or not settings[name].strip():
            raise RouterError(f"{name} must be an address to listen on, such as 0.0.0.0, got {settings[name]!r}")
    extra = settings.get("extra_args") or []
    reserved = [arg for arg in extra if str(arg).split("=", 1)[0] in RESERVED_FLAGS]
    if reserved:
        raise RouterError(
            f"extra_args may not set {', '.join(reserved)}: the role sets the address, the ports and the workers, "
            "and the key reaches the router through its EnvironmentFile, never its command line"
        )
    return settings


def router_command(settings: dict, python: str, launcher: str, workers_file: str) -> list[str]:
    """The router unit's command line: the collection's launcher, then vllm-router's own flags."""
    settings = check_settings(settings)
    return [
        python,
        launcher,
        "--workers-file",
        workers_file,
        "--",
        "--host",
        settings["host"],
        "--port",
        str(settings["port"]),
        "--policy",
        settings["policy"],
        "--health-check-endpoint",
        "/health",
        "--health-check-interval-secs",
        str(settings["health_check_interval"]),
        "--health-failure-threshold",
        str(settings["health_failure_threshold"]),
        "--health-check-timeout-secs",
        str(settings["health_check_timeout"]),
        "--queue-timeout-secs",
        str(settings["queue_timeout"]),
        # /add_worker polls a new worker's /health at this interval, the first time at once.
        "--worker-startup-check-interval",
        "1",
        "--prometheus-host",
        settings["prometheus_host"],
        "--prometheus-port",
        str(settings["prometheus_port"]),
        *[str(arg) for arg in settings.get("extra_args") or []],
    ]


def build_record(fields: dict) -> dict:
    """The router's record from its settings: where it listens, is reached, keeps its key and its workers."""
    settings = check_settings(dict(fields))
    if not isinstance(fields.get("served_name"), str) or not fields["served_name"]:
        raise RouterError(
            f"served_name must name the model that the router's workers serve, got {fields.get('served_name')!r}"
        )
    config_dir = fields["config_dir"]
    record = {
        **{name: fields[name] for name in RECORD_FIELDS if name in fields},
        "url": local_url(settings["host"], settings["port"]),
        "metrics_url": local_url(settings["prometheus_host"], settings["prometheus_port"]),
        "secrets": {
            "environment_file": os.path.join(config_dir, "router.env"),
            "api_key_variable": API_KEY_VARIABLE,
        },
        "workers_file": os.path.join(config_dir, WORKERS_FILE),
    }
    missing = [name for name in RECORD_FIELDS if name not in record]
    if missing:
        raise RouterError(f"the router's record lacks {', '.join(missing)}")
    return {name: record[name] for name in RECORD_FIELDS}


def record_path(config_dir: str) -> str:
    return os.path.join(config_dir, RECORD_FILE)


def read_record(config_dir: str) -> dict:
    """The router's record on this host; RouterError when there is none or it cannot be used."""
    path = record_path(config_dir)
    text = current_text(path)
    if text is None:
        raise RouterError(f"No router on this host: {path} does not exist (run playbooks/router.yml)")
    try:
        record = json.loads(text)
    except ValueError as error:
        raise RouterError(f"The router's record {path} is not valid JSON ({error}); {FIX}") from error
    missing = [name for name in RECORD_FIELDS if name not in record] if isinstance(record, dict) else RECORD_FIELDS
    if missing:
        raise RouterError(f"The router's record {path} lacks {', '.join(missing)}; {FIX}")
    return record


def router_api_key(record: dict) -> str | None:
    """The key that the router's clients send (the key of its workers), from its EnvironmentFile; None for none."""
    path = record["secrets"]["environment_file"]
    try:
        text = current_text(path)
    except OSError as error:
        raise RouterError(f"Cannot read {path}, the router's EnvironmentFile: {error.strerror or error}") from error
    if text is None:
        raise RouterError(f"The router's EnvironmentFile {path} does not exist; run playbooks/router.yml")
    return parse_environment_file(text).get(record["secrets"]["api_key_variable"]) or None


def environment_text(api_key: str | None) -> str:
    """The router's EnvironmentFile: its key, when its workers take one."""
    variables = {API_KEY_VARIABLE: api_key} if api_key else {}
    return "# Written by llmops.vllm (vllm_router): the key of the router's clients and workers.\n" + (
        environment_file(variables)
    )


def check_worker_urls(urls) -> list[str]:
    """Worker base URLs, each checked, without repeats, in the order given."""
    if not isinstance(urls, (list, tuple)):
        raise RouterError(f"workers must be a list of base URLs, got {urls!r}")
    checked = []
    for url in urls:
        try:
            base = check_base_url(url)
        except ValueError as error:
            raise RouterError(f"worker {url!r}: {error}") from None
        if base not in checked:
            checked.append(base)
    return checked


def workers_text(urls: list[str]) -> str:
    return json.dumps({"workers": list(urls)}, indent=2) + "\n"


def read_workers(path: str) -> list[str]:
    """The workers that the router starts with; [] when the file is not there yet."""
    text = current_text(path)
    if text is None:
        return []
    try:
        return check_worker_urls(json.loads(text)["workers"])
    except (ValueError, KeyError, TypeError) as error:
        raise RouterError(f"The router's workers file {path} cannot be read ({error}); {FIX}") from error


def write_workers(module, path: str, urls: list[str]) -> bool:
    return write_if_changed(module, path, workers_text(urls), 0o644)


@contextmanager
def workers_lock(path: str):
    """One change of the router's workers at a time: hosts of one play drain through the same router at once."""
    with open(path + ".lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def plan_workers(current: list[str], workers=None, add=(), remove=()) -> tuple[list[str], list[str], list[str]]:
    """(to add, to remove, the workers after): the exact set `workers`, or `current` with `add` and less `remove`."""
    current = check_worker_urls(current)
    if workers is not None:
        wanted = check_worker_urls(workers)
    else:
        gone = check_worker_urls(remove)
        wanted = [url for url in current if url not in gone] + [
            url for url in check_worker_urls(add) if url not in current and url not in gone
        ]
    return (
        [url for url in wanted if url not in current],
        [url for url in current if url not in wanted],
        wanted,
    )


def parse_worker_list(body: str) -> list[str]:
    """The URLs of /list_workers ({"urls": [...]}), sorted; RouterError for another answer."""
    try:
        # The router lists them in its hash map's order, which changes from one start to the next.
        return sorted(check_worker_urls(json.loads(body)["urls"]))
    except (ValueError, KeyError, TypeError) as error:
        raise RouterError(f"the router's /list_workers answered {body[:200]!r}, not a list of URLs") from error


def parse_worker_states(body: str) -> list[dict]:
    """Each worker of /workers with its health and the requests the router has in flight on it, sorted by URL."""
    try:
        states = [
            {"url": check_base_url(worker["url"]), "healthy": bool(worker["is_healthy"]), "load": worker.get("load")}
            for worker in json.loads(body)["workers"]
        ]
        return sorted(states, key=lambda state: state["url"])
    except (ValueError, KeyError, TypeError) as error:
        raise RouterError(f"the router's /workers answered {body[:200]!r}, not a list of workers") from error


def router_counts(metrics_text: str) -> dict:
    """The router's own counts of requests: completed, ended in an error, retried."""
    return {
        "requests": int(metric_total(metrics_text, REQUESTS_METRIC) or 0),
        "errors": int(metric_total(metrics_text, ERRORS_METRIC) or 0),
        "retries": int(metric_total(metrics_text, RETRIES_METRIC) or 0),
    }


class RouterApi:
    """The router's HTTP API at `url`, each request with the key of its clients."""

    def __init__(self, url: str, api_key: str | None, timeout: float = 5.0):
        self.url = url
        self.api_key = api_key
        self.timeout = timeout

    def _refused(self, reply, what: str) -> RouterError:
        if reply.status is None:
            return RouterUnreachable(f"the router at {self.url} cannot be reached ({reply.describe()}) to {what}")
        if reply.status in (401, 403):
            return RouterError(
                f"the router at {self.url} refuses its own key (HTTP {reply.status}) to {what}: its EnvironmentFile "
                "and its key check disagree; run playbooks/router.yml"
            )
        return RouterError(f"the router at {self.url} answered {reply.describe()} to {what}: {reply.body[:300]}")

    def worker_list(self) -> list[str]:
        reply = get(self.url, "/list_workers", self.api_key, self.timeout)
        if reply.status != 200:
            raise self._refused(reply, "list its workers")
        return parse_worker_list(reply.body)

    def worker_states(self) -> list[dict]:
        reply = get(self.url, "/workers", self.api_key, self.timeout)
        if reply.status != 200:
            raise self._refused(reply, "describe its workers")
        return parse_worker_states(reply.body)

    def add(self, url: str, timeout: float) -> None:
        """Add a worker; the router answers once the worker answers /health, within `timeout`."""
        reply = post(self.url, "/add_worker?url=" + urllib.parse.quote(url, safe=""), self.api_key, timeout)
        if reply.status != 200:
            raise self._refused(reply, f"add the worker {url}")

    def remove(self, url: str) -> None:
        reply = post(self.url, "/remove_worker?url=" + urllib.parse.quote(url, safe=""), self.api_key, self.timeout)
        if reply.status != 200:
            raise self._refused(reply, f"remove the worker {url}")


def check_worker(url: str, served_name: str, api_key: str | None, timeout: float = 5.0) -> None:
    """That the instance at `url`, asked from the router's host with the router's key, serves `served_name`."""
    reply = get(url, "/v1/models", api_key, timeout)
    if reply.status is None:
        raise RouterError(f"the router's host cannot reach the worker {url} ({reply.describe()})")
    if reply.status in (401, 403):
        raise RouterError(
            f"the worker {url} refuses the key of the router's clients (HTTP {reply.status}): every worker of a "
            "router must take the key its clients send; give the instance the router's key (vllm_server_api_key)"
        )
    listed = served_models(reply.body)
    if reply.status != 200 or served_name not in listed:
        raise RouterError(
            f"the worker {url} serves {listed or reply.describe()}, not {served_name!r}, the model of the router: "
            "the router sends any request to any worker"
        )


def choose_workers(backends: list[dict], served_name: str = "", names=()) -> dict:
    """The router's workers among the backends' instances and the model they serve; see `chosen_key` for their key.

    backends: one per host, {host, address, instances}, the instances as llmops.vllm.vllm_instance_info returns
    them with their keys. The workers are the running instances named in `names` (all by default) that serve
    `served_name` (by default the one model that they all serve). They must take one key: the router forwards
    its client's key to whichever worker it picks.
    """
    chosen, stopped = [], []
    for backend in backends:
        for instance in backend["instances"]:
            if names and instance["instance"] not in names:
                continue
            if served_name and instance["served_name"] != served_name:
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
