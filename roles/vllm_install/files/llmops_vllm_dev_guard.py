# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""ASGI middlewares that the llmops.vllm collection adds to vLLM servers: what other hosts may reach, and which
requests a server did not finish.

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

CutOffRequests, in every server: one line on standard error (the unit's journal) for each API request whose answer
the server did not finish, so that a stop can tell how many requests it cut off from what the server itself saw
rather than from a count read at an instant before it (vLLM's gauges lag, and requests start and end meanwhile).
On ACCOUNT_SIGNAL it writes the same line for each request it is still answering, then ACCOUNTED: a stop asks for
that before it kills a server that will not end its answers itself (an API server that outlived its engine).

RetryableAborts, in every server: a completion that a stopping or pausing vLLM did not serve gets 503 with
Retry-After, which clients and vLLM's router retry (on another instance where there is one). vLLM itself answers
200 and an empty stream (or a completion with no text) for a request its engine aborted before the first token,
which a client takes for an answer; and 500 for a request that arrives while it drains at a stop, when its
executors are already shut down.

uvicorn takes the client address from X-Forwarded-For only when the request comes from 127.0.0.1 (its
forwarded_allow_ips default), so a proxy on the host that sets that header keeps its clients remote here; a
proxy that does not set it makes every client look local, and must refuse these paths itself.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import signal
import sys
import time

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


# The start of the line CutOffRequests writes: llmops.vllm's vllm_service counts these lines in the journal.
CUT_OFF_MARK = "llmops.vllm: request cut off:"
# The signal that asks CutOffRequests for the requests it is still answering, and the line that ends its answer.
ACCOUNT_SIGNAL = signal.SIGUSR2
ACCOUNTED = "llmops.vllm: requests still open:"
# Answers whose last word is a finish reason: a completion or chat completion, streamed or not.
FINISHING_PATHS = ("/v1/completions", "/v1/chat/completions")
FINISH_REASON = re.compile(rb'"finish_reason":\s*"([a-z_]+)"')
# vLLM's finish reasons for an answer it did not finish.
NOT_FINISHED = (b"abort", b"error")


# The answer of RetryableAborts, in the shape of vLLM's own errors.
ABORTED_REFUSAL = json.dumps(
    {
        "error": {
            "message": "The server answered none of this request: it is stopping, going to sleep, or its engine"
            " failed. Send it again (to another instance where there is one).",
            "type": "ServiceUnavailableError",
            "param": None,
            "code": 503,
        }
    }
).encode("utf-8")
# Seconds a refused client is asked to wait before it sends the request again.
ABORTED_RETRY_AFTER = b"1"
# Body messages RetryableAborts holds back at most while they show neither a token nor a finish reason.
ABORT_HOLD_LIMIT = 4
# The error of a request that a stopping vLLM could not begin (Python's executors, once shut down, say this).
SHUT_DOWN = b"cannot schedule new futures after shutdown"


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


class Answer:
    """What one request's answer has shown so far: status, body messages, the last finish reason, its end."""

    def __init__(self, finishing: bool):
        self.finishing = finishing
        self.status = None
        self.messages = 0
        self.finish_reason = None
        self.ended = False
        # Written as still open when the server accounted for the requests it was answering.
        self.accounted = False

    def saw(self, message):
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.messages += 1
            body = message.get("body") or b""
            for found in FINISH_REASON.finditer(body):
                self.finish_reason = found.group(1)
            self.ended = not message.get("more_body", False)

    def finished(self) -> bool:
        """Whether the server finished the answer: the whole body sent, no server error, and for a completion a
        last finish reason that is not vLLM's abort or error (a stream cut off ends with neither, or with abort)."""
        if not self.ended or self.status is None or self.status >= 500:
            return False
        if self.status != 200 or not self.finishing:
            return True
        return self.finish_reason is not None and self.finish_reason not in NOT_FINISHED


class CutOffRequests:
    """Write CUT_OFF_MARK, the request and when it began (seconds since the epoch) for each API request (POST under
    an API prefix) whose answer the server did not finish: ended early, failed with a server error, or a completion
    ended without a finish reason or with abort. Client errors (4xx) are answers; a client that goes away before
    its answer counts as cut off too. A stopping server that refuses new requests answers them this way as well:
    their start, after the stop began, tells them apart.

    On ACCOUNT_SIGNAL, the same line for each request still being answered (once: it is not written again when
    that request ends), then ACCOUNTED and their number."""

    # The requests being answered, by their Answer's id: (path, start, Answer).
    answering: dict = {}

    def __init__(self, app):
        self.app = app
        # Outside the main thread no handler can be set: no account then, and a stop counts without it.
        with contextlib.suppress(ValueError):
            signal.signal(ACCOUNT_SIGNAL, self.account)

    @classmethod
    def account(cls, _signum=None, _frame=None):
        still_open = list(cls.answering.values())
        for path, started, answer in still_open:
            answer.accounted = True
            _write_cut_off(path, answer, started, "still open")
        sys.stderr.write(f"{ACCOUNTED} {len(still_open)}\n")
        sys.stderr.flush()

    async def __call__(self, scope, receive, send):
        path = _path(scope)
        if scope["type"] != "http" or scope.get("method") != "POST" or not path.startswith(API_PREFIXES):
            return await self.app(scope, receive, send)
        answer = Answer(path.rstrip("/") in FINISHING_PATHS)
        started = time.time()
        self.answering[id(answer)] = (path, started, answer)

        async def watched_send(message):
            answer.saw(message)
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        finally:
            del self.answering[id(answer)]
            if not answer.finished() and not answer.accounted:
                _write_cut_off(path, answer, started, "ended")


def _write_cut_off(path, answer, started, how):
    reason = answer.finish_reason.decode() if answer.finish_reason else "none"
    sys.stderr.write(
        f"{CUT_OFF_MARK} POST {path} ({how}, status {answer.status}, {answer.messages} body messages, "
        f"finish reason {reason}) started {started:.3f}\n"
    )
    sys.stderr.flush()


STREAM_END = b"[DONE]"


def _payloads(body: bytes) -> list:
    """The payloads of one body message: each event of a stream (its data: lines), or a whole JSON answer."""
    text = body.strip()
    if not text.startswith(b"data:"):
        return [text] if text else []
    return [line.removeprefix(b"data:").strip() for line in text.splitlines() if line.strip()]


def _choice_verdict(choice) -> str | None:
    """ "unserved" (vLLM aborted it), "served" (a token or another finish reason), or None (the role alone)."""
    if not isinstance(choice, dict) or not isinstance(choice.get("delta") or {}, dict):
        return "served"
    if choice.get("finish_reason") == "abort":
        return "unserved"
    delta = choice.get("delta") or {}
    if choice.get("finish_reason") or choice.get("text") or any(value for key, value in delta.items() if key != "role"):
        return "served"
    return None


def _server_error(event) -> bool:
    """An error event of the server's making (code 500 or above: its engine died or failed), not of the request's."""
    error = event.get("error") if isinstance(event, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return isinstance(code, int) and not isinstance(code, bool) and code >= 500


def serve_verdict(body: bytes):
    """What one body message of a completion shows, by its first payload that tells, when nothing served came before
    it: "unserved" (vLLM aborted it, its stream ended, or its engine failed, before any token), "served" (a token,
    another finish reason, an error of the request, anything unknown: the client must have it), or None (nothing
    yet: a chat stream's first chunk names the role alone; a usage chunk)."""
    for payload in _payloads(body):
        if payload == STREAM_END:
            return "unserved"
        try:
            event = json.loads(payload)
        except ValueError:
            return "served"
        if _server_error(event):
            return "unserved"
        choices = event.get("choices") if isinstance(event, dict) else None
        if not isinstance(choices, list) or "error" in event:
            return "served"
        for choice in choices:
            verdict = _choice_verdict(choice)
            if verdict:
                return verdict
    return None


class RetryableAborts:
    """Answer 503, with ABORTED_REFUSAL and Retry-After, for a completion (POST FINISHING_PATHS) that vLLM did not
    serve: a 200 whose body ends, says vLLM aborted it, or carries a server error (a dead engine's), before any
    token; or an error because vLLM is shutting down (raised before any answer, or answered 500). Until that is
    known, the response's start and the body messages without a token (a chat stream's role chunk) are held back,
    at most ABORT_HOLD_LIMIT of them; what vLLM sends after a refusal is dropped. Any other answer passes as vLLM
    sends it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or _path(scope).rstrip("/") not in FINISHING_PATHS:
            return await self.app(scope, receive, send)
        held = []
        state = {"holding": True, "refused": False}

        async def release():
            state["holding"] = False
            for message in held:
                await send(message)
            held.clear()

        async def guarded_send(message):
            if state["refused"]:
                return
            if not state["holding"]:
                return await send(message)
            held.append(message)
            if message["type"] == "http.response.start":
                if message["status"] not in (200, 500):
                    await release()
                return
            verdict = None
            if message["type"] == "http.response.body":
                body = message.get("body") or b""
                if held[0]["status"] == 500:
                    verdict = "unserved" if SHUT_DOWN in body else "served"
                else:
                    verdict = serve_verdict(body)
            ended = message["type"] == "http.response.body" and not message.get("more_body", False)
            if verdict == "unserved" or (ended and verdict is None):
                state["refused"] = True
                held.clear()
                return await _refuse_aborted(send)
            if verdict == "served" or len(held) > ABORT_HOLD_LIMIT:
                await release()

        try:
            await self.app(scope, receive, guarded_send)
        except Exception as error:
            # Raised before any answer, a 500 that the server's outermost layer writes, beyond this middleware.
            if SHUT_DOWN.decode() not in str(error) or not state["holding"]:
                raise
            state["refused"] = True
            held.clear()
            await _refuse_aborted(send)
        finally:
            if held and not state["refused"]:
                await release()


async def _refuse_aborted(send):
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(ABORTED_REFUSAL)).encode()),
                (b"retry-after", ABORTED_RETRY_AFTER),
            ],
        }
    )
    await send({"type": "http.response.body", "body": ABORTED_REFUSAL})
