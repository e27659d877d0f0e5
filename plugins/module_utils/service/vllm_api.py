# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a vLLM server says over HTTP: health, the served models, its Prometheus metrics, its sleep. Stdlib only."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

# Requests that the engine holds: running ones and queued ones.
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
# A metric sample line: name, optional {labels}, value (the optional timestamp is ignored).
METRIC_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")
# Seconds a request waits for the server's answer unless its caller says otherwise.
REQUEST_TIMEOUT = 5.0
# The header by which vLLM's API server hands a request to one data parallel rank.
DATA_PARALLEL_RANK_HEADER = "X-data-parallel-rank"
# The server is reached directly, never through a proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Reply:
    status: int | None  # None when no HTTP answer came (refused, timed out)
    body: str
    error: str | None = None

    def describe(self) -> str:
        return f"HTTP {self.status}" if self.status is not None else self.error or "no answer"


def check_base_url(url: str) -> str:
    """The server's base URL without a trailing slash; raise ValueError for anything else."""
    parsed = urllib.parse.urlsplit(url or "")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"url must be the server's base URL such as http://127.0.0.1:8000, got {url!r}")
    if parsed.path.rstrip("/") not in ("", "/v1") or parsed.query or parsed.fragment:
        raise ValueError(f"url must be the server's base URL without a path beyond /v1, got {url!r}")
    return f"{parsed.scheme}://{parsed.netloc}"


def get(base_url: str, path: str, api_key: str | None = None, timeout: float = REQUEST_TIMEOUT) -> Reply:
    return _send(urllib.request.Request(base_url + path), api_key, timeout)


def post(
    base_url: str,
    path: str,
    api_key: str | None = None,
    timeout: float = REQUEST_TIMEOUT,
    body: dict | None = None,
    headers: dict | None = None,
) -> Reply:
    """POST `body` as JSON, or nothing, as vLLM's control endpoints take (/sleep?level=1, /wake_up)."""
    data = b"" if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(base_url + path, data=data, method="POST", headers=headers or {})
    if body is not None:
        request.add_header("Content-Type", "application/json")
    return _send(request, api_key, timeout)


def _send(request: urllib.request.Request, api_key: str | None, timeout: float) -> Reply:
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return Reply(response.status, response.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as error:
        return Reply(error.code, error.read().decode("utf-8", "replace"))
    except (OSError, ValueError) as error:  # refused, reset, timed out, or a half-written reply
        return Reply(None, "", error=str(getattr(error, "reason", None) or error))


def is_sleeping(base_url: str, timeout: float = REQUEST_TIMEOUT) -> bool | None:
    """Whether the server sleeps (GET /is_sleeping); None when it has no sleep endpoints or does not answer.

    The endpoint exists only with VLLM_SERVER_DEV_MODE=1, which a server started with sleep mode has.
    """
    reply = get(base_url, "/is_sleeping", timeout=timeout)
    if reply.status != 200:
        return None
    try:
        return bool(json.loads(reply.body)["is_sleeping"])
    except (ValueError, KeyError, TypeError):
        return None


def one_token_completion(
    base_url: str, served_name: str, api_key: str | None, timeout: float = 30.0, data_parallel_rank: int | None = None
) -> Reply:
    """A real completion of one token: proof that the engine computes, not only that the HTTP server answers.

    With `data_parallel_rank`, the API server hands it to that data parallel rank's engine (vLLM's
    X-data-parallel-rank header): /health answers for the API server, not for each engine behind it."""
    body = {"model": served_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    headers = {} if data_parallel_rank is None else {DATA_PARALLEL_RANK_HEADER: str(data_parallel_rank)}
    return post(base_url, "/v1/completions", api_key, timeout, body=body, headers=headers)


def served_models(body: str) -> list[str]:
    """The model IDs of a /v1/models reply; [] when the reply is not the expected JSON."""
    try:
        return [model["id"] for model in json.loads(body)["data"]]
    except (ValueError, KeyError, TypeError):
        return []


def metric_samples(metrics_text: str, name: str) -> list[float]:
    """The values of a metric, one per label set (engine, model); ValueError for one that is not a number."""
    samples = []
    for line in metrics_text.splitlines():
        sample = METRIC_SAMPLE.match(line)
        if sample and sample.group(1) == name:
            samples.append(float(sample.group(2)))
    return samples


def metric_total(metrics_text: str, name: str) -> float | None:
    """The sum of a metric over all its label sets (engines, models), or None when absent."""
    samples = metric_samples(metrics_text, name)
    return sum(samples) if samples else None


def requests_in_engine(base_url: str, timeout: float = REQUEST_TIMEOUT) -> int | None:
    """Running plus waiting requests from /metrics (open without the API key), or None when unreadable."""
    reply = get(base_url, "/metrics", timeout=timeout)
    if reply.status != 200:
        return None
    counts = [metric_total(reply.body, name) for name in (REQUESTS_RUNNING, REQUESTS_WAITING)]
    return None if counts[0] is None else int(sum(count or 0 for count in counts))
