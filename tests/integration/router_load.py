"""A client's own count of what a router did to its requests: continuous streamed completions, each one checked.

`StreamingLoad` keeps CONCURRENCY threads sending one streamed completion after another to a base URL until it is
stopped, and records every request: when it started and ended, the HTTP status, the chunks and tokens received,
whether [DONE] came, and the error (with an error answer's body and Retry-After). A request succeeded when it
streamed every token it asked for and [DONE]; one that got a 200 and less than that was truncated; one that got no
HTTP answer at all was refused or reset.
With `retry_503`, a thread that gets a 503 (the router has no worker to send to) sends the same request again
after a short pause, as a client that honours the router's answer would. `pause` is each thread's time between
two requests: a client that thinks, which leaves this 2-core machine's CPUs to the vLLM starts that the test waits
for (without one, three threads kept the serving engine busy at 23 requests a second, and a rollout of the two
hosts took 697 s).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

# Seconds a request may take before the client gives up on it; far above a tiny completion's.
REQUEST_TIMEOUT = 60
# Characters of an error answer's body kept: the error objects of vLLM, the router and the collection whole.
ERROR_BODY = 1000
# Seconds between a 503 and the retry of the same request.
RETRY_PAUSE = 0.2


@dataclass
class Request:
    started: float
    ended: float = 0.0
    status: int | None = None
    chunks: int = 0
    tokens: int | None = None
    done: bool = False
    error: str | None = None
    body: str = ""
    retry_after: str | None = None


@dataclass
class StreamingLoad:
    url: str
    model: str
    api_key: str
    concurrency: int = 3
    max_tokens: int = 16
    retry_503: bool = False
    pause: float = 0.0
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _thread in range(self.concurrency)]

    def __enter__(self) -> StreamingLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def stop_sending(self) -> None:
        """Send no new request; those in flight go on to their end."""
        self._stop.set()

    def stop(self) -> None:
        self.stop_sending()
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT + 10)

    def _run(self) -> None:
        while not self._stop.is_set():
            record = self.send()
            with self._lock:
                self.requests.append(record)
            if record.status == 503 and self.retry_503:
                self._stop.wait(RETRY_PAUSE)
            elif self.pause:
                self._stop.wait(self.pause)

    def send(self, prompt: str = "The router streams") -> Request:
        record = Request(started=time.monotonic())
        target = urllib.parse.urlsplit(self.url)
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=REQUEST_TIMEOUT)
        body = {"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        headers = {"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"}
        try:
            connection.request("POST", "/v1/completions", json.dumps(body), headers)
            response = connection.getresponse()
            record.status = response.status
            record.retry_after = response.getheader("Retry-After")
            if response.status != 200:
                record.body = response.read().decode("utf-8", "replace")[:ERROR_BODY]
            else:
                for line in response:
                    data = line.decode().strip().removeprefix("data: ")
                    if data == "[DONE]":
                        record.done = True
                    elif data.startswith("{"):
                        chunk = json.loads(data)
                        record.chunks += len(chunk.get("choices") or [])
                        if chunk.get("usage"):
                            record.tokens = chunk["usage"]["completion_tokens"]
        except (OSError, http.client.HTTPException, ValueError) as error:
            record.error = repr(error)
        finally:
            connection.close()
            record.ended = time.monotonic()
        return record

    def succeeded(self, record: Request) -> bool:
        return record.status == 200 and record.done and record.tokens == self.max_tokens

    def snapshot(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    def wait_for_successes(self, count: int, timeout: float) -> None:
        """Return once `count` more requests have succeeded; AssertionError after `timeout` s."""
        target = sum(map(self.succeeded, self.snapshot())) + count
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(map(self.succeeded, self.snapshot())) >= target:
                return
            time.sleep(0.2)
        raise AssertionError(f"{count} more requests did not succeed within {timeout} s: {self.counts()}")

    def counts(self) -> dict:
        """What the client saw: succeeded, truncated (200 and less than every token and [DONE]), answered with
        another HTTP status (by status), refused or reset (no answer)."""
        requests = self.snapshot()
        statuses = {}
        for record in requests:
            if record.status not in (None, 200):
                statuses[record.status] = statuses.get(record.status, 0) + 1
        return {
            "requests": len(requests),
            "succeeded": sum(map(self.succeeded, requests)),
            "truncated": sum(1 for record in requests if record.status == 200 and not self.succeeded(record)),
            "other_status": statuses,
            "no_answer": sum(1 for record in requests if record.status is None),
        }

    def failures(self) -> list[Request]:
        return [record for record in self.snapshot() if not self.succeeded(record)]
