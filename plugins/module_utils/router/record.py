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

import ipaddress
import json
import os

from ansible_collections.llmops.vllm.plugins.module_utils.common.file_writer import current_text
from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import (
    WILDCARD_HOSTS,
    local_url,
    remote_url,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.systemd import (
    environment_file,
    parse_environment_file,
)

DEFAULT_CONFIG_DIR = "/etc/vllm-router"
# The router's unit, one per host (the vllm_router role's __vllm_router_unit).
ROUTER_UNIT = "vllm-router.service"
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
FIX = "run playbooks/router.yml"


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
