# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The PromQL queries over vLLM's metrics that the alert rules and the Grafana dashboard both read.

Each series that vLLM exports is named once, here (the three that the modules read on the host, in service.vllm_api);
an alert and a panel that show the same thing build their expression with the same method. Every series
scraped from a target of llmops.vllm.vllm_targets carries the target's labels (host, vllm_instance, model,
served_name, gpus, vllm_version): the queries select those targets by `vllm_instance` and keep one series per
instance, whatever engines (data parallelism) it runs.
"""

from __future__ import annotations

from ansible_collections.llmops.vllm.plugins.module_utils.service.vllm_api import (
    KV_CACHE_USAGE,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
)

# As vLLM 0.32 exports them on /metrics (counters with their _total suffix).
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
REQUESTS_FINISHED = "vllm:request_success_total"
PREEMPTIONS = "vllm:num_preemptions_total"
# One series per state (awake, weights_offloaded, discard_all); awake is 1 while the engine is awake.
SLEEP_STATE = "vllm:engine_sleep_state"
# The API server's own process (prometheus_client's process collector): a new value is a new process.
PROCESS_START = "process_start_time_seconds"
# The latency histograms, by the names that bench results and the catalog's SLOs give them.
LATENCY_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2el": "vllm:e2e_request_latency_seconds",
}
LATENCY_TITLES = {"ttft": "time to first token", "itl": "inter-token latency", "e2el": "end-to-end latency"}
# What tells one instance from another (the target's labels); model rides along for the reader.
INSTANCE_LABELS = ("host", "vllm_instance", "model")
# Only the targets of llmops.vllm.vllm_targets carry this label, whatever the scrape job is called.
TARGETS = 'vllm_instance!=""'


class Queries:
    """The expressions for the series selected by `matchers`, rates over `window` (a PromQL duration)."""

    def __init__(self, matchers: str = TARGETS, window: str = "1m"):
        self.matchers = matchers
        self.window = window
        self.by = ", ".join(INSTANCE_LABELS)

    def select(self, metric: str, extra: str = "") -> str:
        return f"{metric}{{{self.matchers}{', ' + extra if extra else ''}}}"

    def _sum(self, inner: str, labels: str = "") -> str:
        return f"sum by ({self.by}{', ' + labels if labels else ''}) ({inner})"

    def up(self) -> str:
        """1 while Prometheus scrapes the instance's /metrics, 0 while it cannot."""
        return f"max by ({self.by}) ({self.select('up')})"

    def restarts(self, window: str) -> str:
        """How often the API server's process started anew within `window`."""
        return self._sum(f"changes({self.select(PROCESS_START)}[{window}])")

    def requests_running(self) -> str:
        return self._sum(self.select(REQUESTS_RUNNING))

    def requests_waiting(self) -> str:
        return self._sum(self.select(REQUESTS_WAITING))

    def requests_in_engine(self) -> str:
        return f"{self.requests_running()}\n+ {self.requests_waiting()}"

    def waiting_growth(self, window: str) -> str:
        """Requests per second by which the queue grew over `window` (a least-squares slope)."""
        return self._sum(f"deriv({self.select(REQUESTS_WAITING)}[{window}])")

    def kv_cache_usage(self) -> str:
        """The fraction of the KV cache in use, of the fullest engine: a sum would not be a fraction."""
        return f"max by ({self.by}) ({self.select(KV_CACHE_USAGE)})"

    def asleep(self) -> str:
        """1 while the engine sleeps (vLLM's sleep mode), 0 while it is awake."""
        awake = self.select(SLEEP_STATE, 'sleep_state="awake"')
        return f"1 - min by ({self.by}) ({awake})"

    def generation_tokens_per_second(self) -> str:
        return self._sum(f"rate({self.select(GENERATION_TOKENS)}[{self.window}])")

    def prompt_tokens_per_second(self) -> str:
        return self._sum(f"rate({self.select(PROMPT_TOKENS)}[{self.window}])")

    def tokens_processed(self, window: str) -> str:
        """Prompt and generated tokens that the engine processed within `window`: 0 when it made no progress."""
        counters = (GENERATION_TOKENS, PROMPT_TOKENS)
        return "\n+ ".join(self._sum(f"increase({self.select(metric)}[{window}])") for metric in counters)

    def requests_finished_per_second(self) -> str:
        """Finished requests per second, by why they finished (stop, length, abort)."""
        return self._sum(f"rate({self.select(REQUESTS_FINISHED)}[{self.window}])", "finished_reason")

    def preemptions_per_second(self) -> str:
        return self._sum(f"rate({self.select(PREEMPTIONS)}[{self.window}])")

    def latency_quantile(self, latency: str, quantile: float, window: str = "") -> str:
        """The `quantile` (0 to 1) of a latency histogram (ttft, itl or e2el), in seconds, over `window`."""
        buckets = self.select(LATENCY_HISTOGRAMS[latency] + "_bucket")
        return f"histogram_quantile({quantile:g}, {self._sum(f'rate({buckets}[{window or self.window}])', 'le')})"
