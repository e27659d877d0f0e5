# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""ASGI middlewares that the llmops.vllm collection adds to vLLM servers: what other hosts may reach.

LoopbackOnlyDevEndpoints, for a server with VLLM_SERVER_DEV_MODE=1: other hosts reach the API, nothing else.
Sleep mode's HTTP controls exist only in vLLM's development mode, which also opens /collective_rpc (any method
of every worker), /reset_*, /server_info, the weight-update endpoints and more; vLLM's --api-key guards none of
them, only the paths under /v1, /v2, /inference and /cohere. The collection adds it
(`--middleware llmops_vllm_dev_guard.LoopbackOnlyDevEndpoints`) wherever it opens development mode: a client on
loopback (the host itself: the collection's modules) reaches everything; any other client reaches only the API
paths below, and gets 403 for the rest.

MetricsReaders, in every server: /metrics tells which models run, how loaded they are and how fast they answer,
and --api-key does not guard it either. It answers the host itself and the addresses and networks listed in
/etc/vllm/metrics-readers (one per line; the vllm_targets role writes the monitoring hosts there), read again
whenever the file changes, and 403 to any other client.

uvicorn takes the client address from X-Forwarded-For only when the request comes from 127.0.0.1 (its
forwarded_allow_ips default), so a proxy on the host that sets that header keeps its clients remote here; a
proxy that does not set it makes every client look local, and must refuse these paths itself.
"""

from __future__ import annotations

import ipaddress
import json
import os

# What a client on another host may reach: the API (vLLM's --api-key guards the prefixes), the health and
# metrics probes, and the tokenizer and pooling endpoints that vLLM serves without development mode.
API_PREFIXES = ("/v1/", "/v2/", "/inference/", "/cohere/")
API_PATHS = frozenset(
    (
        "/health",
        "/ping",
        "/version",
        "/metrics",
        "/load",
        "/tokenize",
        "/detokenize",
        "/invocations",
        "/pooling",
        "/classify",
        "/score",
        "/rerank",
    )
)
REFUSAL = json.dumps(
    {"error": "vLLM's development endpoints answer only on the host itself (llmops.vllm: llmops_vllm_dev_guard)"}
).encode("utf-8")
READERS_FILE = "/etc/vllm/metrics-readers"
METRICS_PATH = "/metrics"
METRICS_REFUSAL = json.dumps(
    {
        "error": f"/metrics answers the host itself and the readers in {READERS_FILE} alone"
        " (llmops.vllm: llmops_vllm_dev_guard)"
    }
).encode("utf-8")


def _address(host):
    """An ASGI client's or server's host as an address (an IPv4-mapped IPv6 one as IPv4); None for a name."""
    try:
        address = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return None
    return getattr(address, "ipv4_mapped", None) or address


def is_local(client) -> bool:
    """Whether the ASGI client (host, port) is the host itself; a Unix socket (no address) is."""
    if not client:
        return True
    address = _address(client[0])
    return address is not None and address.is_loopback


def is_api_path(path: str) -> bool:
    return path.startswith(API_PREFIXES) or path.rstrip("/") in API_PATHS


def is_same_host(client, server) -> bool:
    """Whether the client connected from the very address it reached: the host itself, on one of its own
    addresses (the collection's modules reach a server that listens on one address there)."""
    if not client or not server:
        return False
    address = _address(client[0])
    return address is not None and address == _address(server[0])


def _path(scope) -> str:
    return scope.get("path", "").removeprefix(scope.get("root_path", ""))


async def _forbid(scope, send, body: bytes):
    if scope["type"] == "websocket":
        return await send({"type": "websocket.close", "code": 1008})
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    return await send({"type": "http.response.body", "body": body})


def parse_readers(text: str) -> tuple:
    """The networks of a readers file, one per line; comments (#) and lines that are no network are skipped."""
    networks = []
    for line in text.splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                continue
    return tuple(networks)


class ReadersFile:
    """The networks of the readers file, read again when it changes; none while there is no file."""

    def __init__(self, path: str):
        self.path = path
        self.seen = None
        self.networks = ()

    def allows(self, host) -> bool:
        try:
            status = os.stat(self.path)
            seen = (status.st_mtime_ns, status.st_size, status.st_ino)
        except OSError:
            seen = None
        if seen != self.seen:
            try:
                with open(self.path, encoding="utf-8") as readers:
                    self.networks = parse_readers(readers.read())
            except (OSError, UnicodeError):
                self.networks = ()
            self.seen = seen
        address = _address(host)
        return address is not None and any(address in network for network in self.networks)


class LoopbackOnlyDevEndpoints:
    """Refuse (403) every path but the API's to clients other than loopback."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or is_local(scope.get("client")) or is_api_path(_path(scope)):
            return await self.app(scope, receive, send)
        return await _forbid(scope, send, REFUSAL)


class MetricsReaders:
    """Refuse (403) /metrics to clients other than the host itself and the readers in READERS_FILE."""

    def __init__(self, app, readers_file: str = READERS_FILE):
        self.app = app
        self.readers = ReadersFile(readers_file)

    async def __call__(self, scope, receive, send):
        client = scope.get("client")
        if (
            scope["type"] != "http"
            or not _path(scope).startswith(METRICS_PATH)
            or is_local(client)
            or is_same_host(client, scope.get("server"))
            or self.readers.allows(client[0])
        ):
            return await self.app(scope, receive, send)
        return await _forbid(scope, send, METRICS_REFUSAL)
