# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark's load generator: prompts streamed at a concurrency level over keep-alive connections.

Standard library only (asyncio), so it runs with any host's python3. One asyncio protocol per connection
feeds what arrives to the parsers of `streamed_response`.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from ansible_collections.llmops.vllm.plugins.module_utils.bench.error import BenchError
from ansible_collections.llmops.vllm.plugins.module_utils.bench.streamed_response import (
    HTTPResponseParser,
    RequestResult,
    StreamedRequest,
)

ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass
class Target:
    """Where and what to ask: the endpoint's parts, and the JSON body of every request but its prompt."""

    host: str
    port: int
    path: str
    use_tls: bool
    headers: bytes
    endpoint: str
    body: dict
    validate_certs: bool = True

    @classmethod
    def build(cls, url, endpoint, model, output_len, api_key=None, ignore_eos=True, validate_certs=True):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BenchError(f"url must be http(s)://HOST[:PORT][/PREFIX], got {url!r}")
        prefix = parts.path.rstrip("/").removesuffix("/v1")
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        port = parts.port or (443 if parts.scheme == "https" else 80)
        headers = f"Host: {host}:{port}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
        if api_key:
            headers += f"Authorization: Bearer {api_key}\r\n"
        body = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
        body["max_completion_tokens" if endpoint == "chat" else "max_tokens"] = output_len
        if ignore_eos:
            body["ignore_eos"] = True
        return cls(
            host=parts.hostname,
            port=port,
            path=prefix + ENDPOINT_PATHS[endpoint],
            use_tls=parts.scheme == "https",
            headers=headers.encode(),
            endpoint=endpoint,
            body=body,
            validate_certs=validate_certs,
        )

    def request_bytes(self, prompt: str) -> bytes:
        body = dict(self.body)
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        payload = json.dumps(body).encode()
        head = f"POST {self.path} HTTP/1.1\r\n".encode() + self.headers
        return head + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload

    def ssl_context(self):
        if not self.use_tls:
            return None
        context = ssl.create_default_context()
        if not self.validate_certs:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


class _Connection(asyncio.Protocol):
    """One keep-alive connection; `send` streams one request through it and returns its RequestResult."""

    def __init__(self):
        self.transport = None
        self.closed = False
        self._parser = None
        self._waiter = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        now = time.perf_counter()
        try:
            self._parser.feed(data, now)
        except (ValueError, UnicodeDecodeError) as error:
            self._settle(error)
            return
        if self._parser.complete:
            self._settle(None)

    def connection_lost(self, exc):
        self.closed = True
        if self._parser is None or self._parser.complete:
            return
        if exc is None and self._parser.ends_at_close:
            self._parser.complete = True
            self._settle(None)
        else:
            self._settle(exc or ConnectionError("the server closed the connection before the response ended"))

    def _settle(self, error):
        if self._waiter is not None and not self._waiter.done():
            if error is None:
                self._waiter.set_result(None)
            else:
                self._waiter.set_exception(error)

    async def send(self, request: bytes, prompt_tokens: int) -> RequestResult:
        stream = StreamedRequest(0.0, prompt_tokens)

        def on_body(data, now):
            if self._parser.status == 200:
                stream.on_body(data, now)
            else:
                stream.on_error_body(data, now)

        self._parser = HTTPResponseParser(on_body)
        self._waiter = asyncio.get_running_loop().create_future()
        stream.result.start = time.perf_counter()
        self.transport.write(request)
        await self._waiter
        if not self._parser.keep_alive:
            # Closed now, not when connection_lost runs later: the worker's next request needs a new connection.
            self.closed = True
            self.transport.close()
        return stream.finish(self._parser.status, self._parser.reason)


async def _open(target: Target) -> _Connection:
    loop = asyncio.get_running_loop()
    _transport, connection = await loop.create_connection(
        _Connection,
        target.host,
        target.port,
        ssl=target.ssl_context(),
        server_hostname=target.host if target.use_tls else None,
    )
    return connection


class PromptFeed:
    """The prompts of one level, in order: once each, or, with a deadline, round and round until it passes."""

    def __init__(self, prompts: list, stop_at: float | None = None):
        self._prompts = prompts
        self._stop_at = stop_at
        self._next = 0

    def take(self):
        """The next (prompt, prompt tokens), or None when the level has sent all it should."""
        if self._stop_at is None:
            if self._next == len(self._prompts):
                return None
        elif time.perf_counter() >= self._stop_at:
            return None
        item = self._prompts[self._next % len(self._prompts)]
        self._next += 1
        return item


async def _worker(target, feed, results, timeout):
    """Send the feed's prompts one at a time over one connection until the feed ends."""
    connection = None
    while (item := feed.take()) is not None:
        prompt, prompt_tokens = item
        request = target.request_bytes(prompt)
        start = time.perf_counter()
        try:
            if connection is None or connection.closed:
                connection = await asyncio.wait_for(_open(target), timeout)
            results.append(await asyncio.wait_for(connection.send(request, prompt_tokens), timeout))
        except asyncio.TimeoutError:
            results.append(RequestResult(start=start, error=f"no complete response within {timeout:g} s"))
            connection = _discard(connection)
        except (OSError, ValueError) as error:
            results.append(RequestResult(start=start, error=f"{type(error).__name__}: {error}"))
            connection = _discard(connection)
    _discard(connection)


def _discard(connection):
    if connection is not None and connection.transport is not None:
        connection.transport.close()
    return None


async def _drive(target, prompts, concurrency, timeout, duration):
    results = []
    started = time.perf_counter()
    feed = PromptFeed(prompts, started + duration if duration else None)
    await asyncio.gather(*(_worker(target, feed, results, timeout) for _connection in range(concurrency)))
    return results, time.perf_counter() - started


def run_level(target, prompts, concurrency, timeout, duration=None):
    """Send `prompts` (text, expected prompt tokens) with at most `concurrency` requests in flight.

    With `duration`, no request starts after that many seconds (the prompts cycle until then). Returns the
    RequestResults, the wall-clock duration and the CPU seconds this process used meanwhile.
    """
    cpu_before = time.process_time()
    results, elapsed = asyncio.run(_drive(target, prompts, concurrency, timeout, duration))
    return results, elapsed, time.process_time() - cpu_before
