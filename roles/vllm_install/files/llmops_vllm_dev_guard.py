# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""ASGI middleware for a vLLM server with VLLM_SERVER_DEV_MODE=1: other hosts reach the API, nothing else.

Sleep mode's HTTP controls exist only in vLLM's development mode, which also opens /collective_rpc (any method
of every worker), /reset_*, /server_info, the weight-update endpoints and more; vLLM's --api-key guards none of
them, only the paths under /v1, /v2, /inference and /cohere. The llmops.vllm collection adds this middleware
(`--middleware llmops_vllm_dev_guard.LoopbackOnlyDevEndpoints`) wherever it opens development mode: a client on
loopback (the host itself: the collection's modules) reaches everything; any other client reaches only the API
paths below, and gets 403 for the rest.

uvicorn takes the client address from X-Forwarded-For only when the request comes from 127.0.0.1 (its
forwarded_allow_ips default), so a proxy on the host that sets that header keeps its clients remote here; a
proxy that does not set it makes every client look local, and must refuse these paths itself.
"""

from __future__ import annotations

import ipaddress
import json

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


def is_local(client) -> bool:
    """Whether the ASGI client (host, port) is the host itself; a Unix socket (no address) is."""
    if not client:
        return True
    try:
        address = ipaddress.ip_address(str(client[0]).split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def is_api_path(path: str) -> bool:
    return path.startswith(API_PREFIXES) or path.rstrip("/") in API_PATHS


class LoopbackOnlyDevEndpoints:
    """Refuse (403) every path but the API's to clients other than loopback."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or is_local(scope.get("client")):
            return await self.app(scope, receive, send)
        path = scope.get("path", "").removeprefix(scope.get("root_path", ""))
        if is_api_path(path):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(REFUSAL)).encode())],
            }
        )
        return await send({"type": "http.response.body", "body": REFUSAL})
