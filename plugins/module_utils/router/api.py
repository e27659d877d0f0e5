# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The router's HTTP API, its own counts of requests, and the check that a worker serves the router's model."""

from __future__ import annotations

import urllib.parse

from ansible_collections.llmops.vllm.plugins.module_utils.router.record import RouterError, RouterUnreachable
from ansible_collections.llmops.vllm.plugins.module_utils.router.workers import parse_worker_list, parse_worker_states
from ansible_collections.llmops.vllm.plugins.module_utils.service.vllm_api import (
    get,
    metric_total,
    post,
    served_models,
)

# Router metrics (its /metrics, on the Prometheus port): requests it completed, and those that ended in an error.
REQUESTS_METRIC = "vllm_router_requests_total"
ERRORS_METRIC = "vllm_router_request_errors_total"
RETRIES_METRIC = "vllm_router_retries_total"


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
