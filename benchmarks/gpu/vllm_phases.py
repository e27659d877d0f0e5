# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM's own account of where a load went, read from its log: the GPU harness reads a server's log file, the GPU
host's runner (benchmarks/gpu_host/run.py) the unit's journal."""

from __future__ import annotations

import re

# vLLM's own lines about the phases of a load (vllm/v1/worker/gpu_model_runner.py, compilation/monitor.py,
# v1/engine/core.py, v1/core/kv_cache_utils.py), as vLLM 0.26 prints them.
PHASES = {
    "weights_s": re.compile(r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds"),
    "weights_gib": re.compile(r"Model loading took ([\d.]+) GiB"),
    "compile_s": re.compile(r"torch\.compile took ([\d.]+) s in total"),
    "graphs_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "engine_init_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
    "kv_cache_gib": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    "kv_cache_tokens": re.compile(r"KV cache size: ([\d,]+) tokens"),
    "max_concurrency": re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"),
}

# The moments of a start, in the order they come, each the first line after the unit's `Started` that matches: the
# API server's first line (its interpreter and imports done), the model's config resolved, the engine core's first
# line (the second interpreter), the weights, torch.compile, the KV cache, the CUDA graphs, the engine ready, and the
# server answering. `api_server_first_line` is any line of the unit that systemd did not write.
MARKS = {
    "config_resolved": re.compile(r"Resolved architecture"),
    "engine_first_line": re.compile(r"\(EngineCore"),
    "weights_loaded": re.compile(r"Model loading took"),
    "compiled": re.compile(r"torch\.compile took"),
    "kv_cache_sized": re.compile(r"Available KV cache memory"),
    "graphs_captured": re.compile(r"Graph capturing finished"),
    "engine_ready": re.compile(r"init engine \(profile, create kv cache, warmup model\) took"),
    "serving": re.compile(r"Application startup complete"),
}


def load_phases(lines: list[str]) -> dict:
    """The phases of the first load in `lines` (PHASES); keys without a line are left out."""
    found = {}
    for key, pattern in PHASES.items():
        for line in lines:
            match = pattern.search(line)
            if match:
                found[key] = float(match.group(1).replace(",", ""))
                break
    return found


def start_timeline(entries: list[tuple[float, str, str]]) -> dict:
    """Seconds from the unit's `Started` line to each of MARKS in `entries` ((time, writer, message), the unit's
    journal of one start in order; writer `systemd` for systemd's own lines); marks not reached are left out, and
    without a `Started` line the result is empty."""
    started = next(
        (time for time, writer, message in entries if writer == "systemd" and message.startswith("Started ")), None
    )
    if started is None:
        return {}
    after = [(time, writer, message) for time, writer, message in entries if time >= started]
    found = {}
    first = next((time for time, writer, _message in after if writer != "systemd"), None)
    if first is not None:
        found["api_server_first_line"] = round(first - started, 2)
    for key, pattern in MARKS.items():
        hit = next((time for time, _writer, message in after if pattern.search(message)), None)
        if hit is not None:
            found[key] = round(hit - started, 2)
    return found
