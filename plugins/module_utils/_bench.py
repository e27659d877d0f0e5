# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A streaming benchmark client for OpenAI-compatible servers, measuring what `vllm bench serve` measures.

Standard library only (asyncio, json, random), so it runs with any host's python3. One asyncio protocol per
connection parses HTTP/1.1, chunked transfer coding and server-sent events incrementally, wherever the network
splits the bytes; `StreamedRequest` applies vLLM's timing rules to the events:
- TTFT: from sending the request to the first event that has `choices` (text may be empty);
- ITL: the gaps between later events with `choices`; E2EL: from sending to the last event with `choices`;
- output and prompt tokens: the `usage` event (`stream_options.include_usage`);
- TPOT: (E2EL - TTFT) / (output tokens - 1), for requests with more than one output token.
`level_metrics` aggregates the requests of one concurrency level under `vllm bench serve`'s field names, with
numpy's conventions (population std, linear percentiles, 0 for an empty list).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# How many failed requests' error texts a level keeps: enough to see the pattern, small enough for a report.
KEPT_ERRORS = 5
FIXED_PROMPT = (
    "The quick brown fox jumps over the lazy dog while the inference server streams tokens back to its clients"
)


class BenchError(Exception):
    """A benchmark that cannot run or that failed its baseline, with a message for the user."""


# ---------------------------------------------------------------------------------------------- parsing


class SSEParser:
    """Server-sent events from bytes split anywhere: `feed` returns the data of each complete event."""

    def __init__(self):
        self._buffer = b""

    def feed(self, data: bytes) -> list[str]:
        self._buffer += data
        if b"\r" in self._buffer:
            self._buffer = self._buffer.replace(b"\r\n", b"\n")
        events = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                return events
            block, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            lines = [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
            if lines:
                events.append(b"\n".join(lines).decode("utf-8"))


class ChunkedDecoder:
    """HTTP/1.1 chunked transfer coding, decoded from bytes split anywhere; `done` after the last chunk."""

    def __init__(self):
        self._buffer = b""
        self._remaining = 0  # bytes of the current chunk still to come
        self._crlf_due = False  # the CRLF that ends a chunk's data
        self.done = False

    def feed(self, data: bytes) -> bytes:
        self._buffer += data
        out = []
        while not self.done:
            if self._remaining:
                take = self._buffer[: self._remaining]
                out.append(take)
                self._buffer = self._buffer[len(take) :]
                self._remaining -= len(take)
                if self._remaining:
                    break
                self._crlf_due = True
            if self._crlf_due:
                if len(self._buffer) < 2:
                    break
                self._buffer = self._buffer[2:]
                self._crlf_due = False
            line_end = self._buffer.find(b"\r\n")
            if line_end < 0:
                break
            size = int(self._buffer[:line_end].split(b";", 1)[0], 16)
            if size == 0:
                # The last chunk: done at the empty line that ends the (rarely present) trailers.
                rest = self._buffer[line_end + 2 :]
                self.done = rest.startswith(b"\r\n") or b"\r\n\r\n" in rest
                break
            self._buffer = self._buffer[line_end + 2 :]
            self._remaining = size
        return b"".join(out)


class HTTPResponseParser:
    """One HTTP/1.1 response, fed as it arrives: status and headers, then the body to `on_body(data, now)`."""

    def __init__(self, on_body):
        self._on_body = on_body
        self._head = b""
        self.status = None
        self.reason = ""
        self.headers: dict[str, str] = {}
        self._chunked = None
        self._length = None
        self.complete = False
        self.keep_alive = True
        self.ends_at_close = False

    def feed(self, data: bytes, now: float) -> None:
        if self.status is None:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self._head[:end].decode("latin-1"), self._head[end + 4 :]
            status_line, *header_lines = head.split("\r\n")
            parts = status_line.split(" ", 2)
            self.status = int(parts[1])
            self.reason = parts[2] if len(parts) > 2 else ""
            for line in header_lines:
                name, _colon, value = line.partition(":")
                self.headers[name.strip().lower()] = value.strip()
            self.keep_alive = self.headers.get("connection", "").lower() != "close"
            if "chunked" in self.headers.get("transfer-encoding", "").lower():
                self._chunked = ChunkedDecoder()
            elif "content-length" in self.headers:
                self._length = int(self.headers["content-length"])
            else:
                self.keep_alive = False
                self.ends_at_close = True
        if self._chunked is not None:
            body = self._chunked.feed(data)
            if body:
                self._on_body(body, now)
            self.complete = self._chunked.done
        elif self._length is not None:
            body = data[: self._length]
            self._length -= len(body)
            if body:
                self._on_body(body, now)
            self.complete = self._length == 0
        elif data:
            self._on_body(data, now)


@dataclass
class RequestResult:
    """One request as `vllm bench serve` records it (seconds; `start` on the perf_counter clock)."""

    start: float = 0.0
    ttft: float = 0.0
    itl: list = field(default_factory=list)
    latency: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    success: bool = False
    error: str = ""


class StreamedRequest:
    """Applies vLLM's timing rules to the body of one streaming response."""

    def __init__(self, start: float, prompt_tokens: int):
        self.result = RequestResult(start=start, prompt_tokens=prompt_tokens)
        self._sse = SSEParser()
        self._error_body = b""
        self._last = start
        self._first = True

    def on_body(self, data: bytes, now: float) -> None:
        for event in self._sse.feed(data):
            if event == "[DONE]":
                continue
            chunk = json.loads(event)
            if chunk.get("choices"):
                if self._first:
                    self._first = False
                    self.result.ttft = now - self.result.start
                else:
                    self.result.itl.append(now - self._last)
                self._last = now
            elif chunk.get("usage"):
                usage = chunk["usage"]
                self.result.output_tokens = usage.get("completion_tokens") or 0
                if usage.get("prompt_tokens") is not None:
                    self.result.prompt_tokens = usage["prompt_tokens"]
            elif "error" in chunk:
                error = chunk["error"]
                self.result.error = error.get("message", str(error)) if isinstance(error, dict) else str(error)

    def on_error_body(self, data: bytes, now: float) -> None:  # pylint: disable=unused-argument
        self._error_body += data

    def finish(self, status: int, reason: str) -> RequestResult:
        result = self.result
        if status != 200:
            result.error = f"HTTP {status} {reason}: {self._error_body.decode('utf-8', 'replace')[:300]}".strip()
        elif result.error:
            result.error = f"error event in the stream: {result.error}"
        elif self._first:
            result.error = "the stream ended without a chunk that has choices"
        else:
            result.success = True
            result.latency = self._last - result.start
        return result


# --------------------------------------------------------------------------------------------- statistics


def percentile(values: list, p: float) -> float:
    """numpy.percentile(values, p) with its default linear interpolation."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * p / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def describe(values: list, percentiles: list) -> dict:
    """Mean, median, population std and percentiles, as numpy computes them; an empty list counts as [0]."""
    values = values or [0.0]
    mean = math.fsum(values) / len(values)
    stats = {
        "mean": mean,
        "median": percentile(values, 50),
        "std": math.sqrt(math.fsum((value - mean) ** 2 for value in values) / len(values)),
    }
    for p in percentiles:
        stats[percentile_name(p)] = percentile(values, p)
    return stats


def percentile_name(p: float) -> str:
    """`p99`, `p99.9`: vLLM's names."""
    return f"p{int(p)}" if int(p) == p else f"p{p}"


def level_metrics(results: list, duration: float, percentiles: list, slos: dict | None = None) -> dict:
    """The metrics of one level, named as `vllm bench serve` names them (times in ms)."""
    good = [r for r in results if r.success]
    failed = [r for r in results if not r.success]
    output = sum(r.output_tokens or 1 for r in good)
    total_input = sum(r.prompt_tokens for r in good)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in good if r.output_tokens > 1]
    samples = {
        "ttft": [r.ttft for r in good],
        "tpot": tpots,
        "itl": [gap for r in good for gap in r.itl],
        "e2el": [r.latency for r in good],
    }
    metrics = {
        "duration": duration,
        "completed": len(good),
        "failed": len(failed),
        "errors": [r.error for r in failed[:KEPT_ERRORS]],
        "total_input_tokens": total_input,
        "total_output_tokens": output,
        "request_throughput": len(good) / duration,
        "request_goodput": None,
        "output_throughput": output / duration,
        "total_token_throughput": (total_input + output) / duration,
    }
    if slos:
        metrics["request_goodput"] = sum(1 for r in good if meets_slos(r, slos)) / duration
    for name, values in samples.items():
        for stat, value in describe(values, percentiles).items():
            metrics[f"{stat}_{name}_ms"] = value * 1000
    return metrics


def meets_slos(result: RequestResult, slos: dict) -> bool:
    """vLLM's goodput rule: every given SLO (ms) met; a one-token request has a TPOT of 0."""
    tpot = (result.latency - result.ttft) / (result.output_tokens - 1) if result.output_tokens > 1 else 0.0
    measured = {"ttft": result.ttft, "tpot": tpot, "e2el": result.latency}
    return all(measured[name] * 1000 <= limit for name, limit in slos.items())


def is_higher_better(metric: str) -> bool:
    """Throughputs and goodput grow when things get better; latencies shrink."""
    return metric.endswith(("_throughput", "_goodput"))


def regressions(levels: list, baseline_levels: list, metrics: list, max_percent: float) -> tuple[list, list]:
    """Compare each level with the baseline level of the same concurrency.

    Returns (comparisons, regressions): one dict per (concurrency, metric) found in both, and those worse than
    `max_percent`.
    """
    baseline_by_concurrency = {level["max_concurrency"]: level for level in baseline_levels}
    comparisons = []
    for level in levels:
        base = baseline_by_concurrency.get(level["max_concurrency"])
        if base is None:
            continue
        for metric in metrics:
            if base.get(metric) is None or level.get(metric) is None:
                raise BenchError(f"metric {metric} is missing from the result or from the baseline")
            before, now = float(base[metric]), float(level[metric])
            change = (now - before) / before * 100 if before else 0.0
            worse = -change if is_higher_better(metric) else change
            comparisons.append(
                {
                    "max_concurrency": level["max_concurrency"],
                    "metric": metric,
                    "baseline": before,
                    "current": now,
                    "change_percent": change,
                    "regressed": worse > max_percent,
                }
            )
    if not comparisons:
        raise BenchError(
            f"the baseline has none of the levels {[level['max_concurrency'] for level in levels]}"
            f" (it has {sorted(baseline_by_concurrency)})"
        )
    return comparisons, [c for c in comparisons if c["regressed"]]


def describe_regression(item: dict, max_percent: float) -> str:
    return (
        f"C={item['max_concurrency']} {item['metric']}: {item['current']:.2f} against the baseline's "
        f"{item['baseline']:.2f} ({item['change_percent']:+.1f}%, allowed {max_percent:g}% worse)"
    )


# ------------------------------------------------------------------------------------------------ prompts


def fixed_prompts(count: int, input_len: int) -> list:
    """Prompts of about `input_len` words (about a token each), distinct from the first word on so that
    prefix caching does not make them cheaper than real traffic."""
    sentence = FIXED_PROMPT.split()
    words = (sentence * (input_len // len(sentence) + 1))[: max(input_len - 1, 0)]
    return [" ".join([f"{index}:", *words]) for index in range(count)]


def added_special_tokens(tokenizer) -> int:
    """How many special tokens (a BOS, typically) the tokenizer adds to every prompt when the server encodes it."""
    processor = tokenizer.post_processor
    return processor.num_special_tokens_to_add(False) if processor is not None else 0


def random_token_prompts(tokenizer, count: int, input_len: int, seed: int) -> list:
    """Prompts that the server encodes to `input_len` tokens, built as `vllm bench serve --dataset-name random`
    builds them: from a random offset, consecutive tokens of the model's vocabulary (special tokens left
    out), as text that encodes back to their number, plus the special tokens that the tokenizer adds.

    The workload is vLLM's, not only its length: at the same token count, prompts of random single tokens
    (bytes that decode to broken UTF-8) took 12-61 % longer to prefill than these on the tiny model's server
    (vllm:request_prefill_time_seconds, C=8, three rounds).
    """
    special = set(tokenizer.get_added_tokens_decoder())
    vocabulary = [token_id for token_id in range(tokenizer.get_vocab_size()) if token_id not in special]
    length = max(input_len - added_special_tokens(tokenizer), 1)
    rng = random.Random(seed)
    prompts = []
    for index in range(count):
        offset = rng.randrange(len(vocabulary))
        ids = [vocabulary[(offset + index + position) % len(vocabulary)] for position in range(length)]
        text = tokenizer.decode(ids)
        # Decoding and encoding again may merge or split tokens: trim, or pad with random tokens, until the
        # length holds.
        for _attempt in range(10):
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            if len(ids) == length:
                break
            ids = ids[:length] + [rng.choice(vocabulary) for _position in range(length - len(ids))]
            text = tokenizer.decode(ids)
        prompts.append(text)
    return prompts


# ----------------------------------------------------------------------------------------------- driving


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
