# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run `vllm bench serve` once per concurrency level in one process and print, per level, one JSON line with
its saved result's headline fields and the CPU seconds the client used while benchmarking.

Runs on the server host with the vLLM venv's python (compare_vllm_bench.py copies it there). The CPU time is
taken around vLLM's own `benchmark()` coroutine, so the imports and the prompt sampling before it do not count,
as they do not count for llmops.vllm.vllm_bench either.

usage: python vllm_bench_serve_cpu.py ENV_FILE CONCURRENCY:REQUESTS:SEED... -- VLLM_BENCH_SERVE_ARGS...
(ENV_FILE is the unit's EnvironmentFile; its VLLM_API_KEY, if any, becomes OPENAI_API_KEY, which vLLM's client sends.)
"""

import json
import os
import shlex
import sys
import tempfile
import time

FIELDS = (
    "completed",
    "failed",
    "duration",
    "total_output_tokens",
    "output_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "median_itl_ms",
)


def api_key_from(env_text):
    """VLLM_API_KEY of a systemd EnvironmentFile (values may be quoted), or None."""
    for line in env_text.splitlines():
        name, _equals, value = line.strip().partition("=")
        if name == "VLLM_API_KEY":
            return shlex.split(value)[0] if value else None
    return None


def main():
    separator = sys.argv.index("--")
    env_file, levels, bench_args = sys.argv[1], sys.argv[2:separator], sys.argv[separator + 1 :]
    # vLLM is imported here, not at the top, so that the controller can import api_key_from without it.
    from vllm.benchmarks import serve  # pylint: disable=import-outside-toplevel
    from vllm.entrypoints.cli.main import main as vllm_main  # pylint: disable=import-outside-toplevel

    with open(env_file, encoding="utf-8") as handle:
        api_key = api_key_from(handle.read())
    if api_key:
        os.environ["OPENAI_API_KEY"] = api_key
    cpu = {}
    measured = serve.benchmark

    async def timed_benchmark(*args, **kwargs):
        before = time.process_time()
        try:
            return await measured(*args, **kwargs)
        finally:
            cpu["seconds"] = time.process_time() - before

    serve.benchmark = timed_benchmark
    with tempfile.TemporaryDirectory() as directory:
        for level in levels:
            concurrency, requests, seed = level.split(":")
            result_file = os.path.join(directory, f"c{concurrency}.json")
            sys.argv = ["vllm", "bench", "serve", *bench_args, "--max-concurrency", concurrency]
            sys.argv += ["--num-prompts", requests, "--seed", seed, "--save-result", "--result-dir", directory]
            sys.argv += ["--result-filename", os.path.basename(result_file)]
            stdout = sys.stdout
            sys.stdout = sys.stderr  # keep stdout for the JSON lines
            try:
                vllm_main()
            finally:
                sys.stdout = stdout
            with open(result_file, encoding="utf-8") as handle:
                saved = json.load(handle)
            line = {"max_concurrency": int(concurrency), **{name: saved[name] for name in FIELDS}}
            line["client_cpu_seconds"] = cpu["seconds"]
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
