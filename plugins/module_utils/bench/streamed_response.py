# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One streamed response of an OpenAI-compatible server, parsed as it arrives and timed as `vllm bench serve` times it.

Standard library only. HTTP/1.1, chunked transfer coding and server-sent events are parsed incrementally,
wherever the network splits the bytes; `StreamedRequest` applies vLLM's timing rules to the events:
- TTFT: from sending the request to the first event that has `choices` (text may be empty);
- ITL: the gaps between later events with `choices`; E2EL: from sending to the last event with `choices`;
- output and prompt tokens: the `usage` event (`stream_options.include_usage`);
- TPOT: (E2EL - TTFT) / (output tokens - 1), for requests with more than one output token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


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
