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
