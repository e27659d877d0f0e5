# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Side by side: `vllm bench serve` and llmops.vllm.vllm_bench, same server, same workload, same host.

The server is the instance MODEL (default `wide`, benchmarks/models/wide.yml: a random Llama whose steps take
about as long, next to a client's own costs, as a real model's on a GPU; no prefix caching). Every level
(C=1, 8, 32 by default) of every round runs both clients on the server's host, one after the other, in
alternating order (A B, then B A, ...), so that drift of a shared machine hits both alike. The first
--warmup-rounds rounds run the same way and are not counted. Printed per level:

- output throughput and median TTFT of each client (medians of the rounds), and vllm_bench's paired ratio to
  `vllm bench serve`: the geometric mean over rounds of each round's own ratio, as a difference in percent,
  with a 95% bootstrap interval, and whether that interval lies within +-5% ("agree"), wholly outside it
  ("differ"), or neither ("not shown": more rounds needed);
- each client's mean TTFT beside the server's own mean TTFT for the same requests (vLLM's
  `vllm:time_to_first_token_seconds`, read from /metrics before and after each run): the client's mean minus
  the server's is the HTTP path plus what the client spends inside its own clock;
- each client's CPU seconds per 1,000 output tokens (process CPU time while benchmarking / output tokens).
Each run's line also gives the share of prompt tokens that the server took from its prefix cache.

Both clients run with the vLLM venv's python on the host and vLLM's random-dataset prompts (128 tokens in, 128
out by default; vllm_bench builds its tokenizer prompts the same way), ignore_eos, and one warm-up request
(`vllm bench serve` sends its ready check; vllm_bench gets warmup_requests: 1). The server's mean counts that
request too, for both clients alike.

With --client-cpu N both clients run alone on CPU N (taskset), so that the server's speed does not depend on
what each client costs; pin the server off that CPU first (CPUAffinity= in a drop-in of its unit).

usage: python benchmarks/compare_vllm_bench.py -i INVENTORY HOST [--model wide] [--rounds 10] [--warmup-rounds 1]
                                               [--levels 1:8 8:32 32:64] [--client-cpu N]
(run from the repository root with the venv's ansible on PATH and ANSIBLE_COLLECTIONS_PATH set, as make does)
"""

import argparse
import base64
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from vllm_bench_serve_cpu import api_key_from

ROOT = Path(__file__).resolve().parents[1]
HELPER = ROOT / "benchmarks" / "vllm_bench_serve_cpu.py"

# The collection's own reading of /metrics (standard library only), the one vllm_instance_info uses.
sys.path.insert(0, str(ROOT / "plugins" / "module_utils" / "service"))
from vllm_api import metric_total  # noqa: E402  pylint: disable=wrong-import-position,import-error


def ansible(args, host, module, module_args, extra_vars=None):
    """Run one module on `host`; return its result."""
    command = ["ansible", host, "-i", args.inventory, "-m", module, "-a", module_args]
    for name, value in (extra_vars or {}).items():
        command += ["-e", f"{name}={value}"]
    env = {**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    result = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"][host]
    if result.get("failed") or result.get("rc", 0) != 0:
        raise SystemExit(f"{module} failed on {host}: {result.get('msg')}\n{result.get('stderr', '')[-3000:]}")
    return result


def api_key(args, host):
    content = ansible(args, host, "ansible.builtin.slurp", f"src={args.env_file}")["content"]
    return api_key_from(base64.b64decode(content).decode())


PINNED_PYTHON = "/tmp/llmops-compare-pinned-python"


def pin_clients(args, host):
    """Write the interpreter wrapper that runs both clients on --client-cpu alone."""
    wrapper = f'#!/bin/sh\nexec taskset -c {args.client_cpu} {args.python} "$@"\n'
    ansible(args, host, "ansible.builtin.copy", json.dumps({"dest": PINNED_PYTHON, "content": wrapper, "mode": "0755"}))


def client_python(args):
    return PINNED_PYTHON if args.client_cpu is not None else args.python


def run_vllm_bench_serve(args, host, concurrency, requests, seed):
    bench_args = (
        f"--backend openai --base-url {args.url} --endpoint /v1/completions --model {args.model_path}"
        f" --served-model-name {args.model} --dataset-name random --random-input-len {args.input_len}"
        f" --random-output-len {args.output_len} --ignore-eos --num-warmups 0 --disable-tqdm"
    )
    script = (
        f"{HELPER} {args.env_file} {concurrency}:{requests}:{seed} -- {bench_args} executable={client_python(args)}"
    )
    stdout = ansible(args, host, "ansible.builtin.script", script)["stdout"]
    return next(json.loads(line) for line in stdout.splitlines() if line.startswith('{"max_concurrency"'))


def run_vllm_bench(args, host, concurrency, requests, seed, key):
    module_args = {
        "url": args.url,
        "model": args.model,
        "api_key": key,
        "concurrency": [concurrency],
        "num_requests": requests,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "tokenizer": args.model_path,
        "warmup_requests": 1,
        "seed": seed,
    }
    result = ansible(
        args,
        host,
        "llmops.vllm.vllm_bench",
        json.dumps(module_args),
        {"ansible_python_interpreter": client_python(args)},
    )
    assert result["prompt_source"] == "tokenizer", result["prompt_source"]
    return result["levels"][0]


SERVER_COUNTERS = (
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
)


def server_counters(args, host):
    """vLLM's own counters so far (SERVER_COUNTERS, each summed over its label sets), from its /metrics."""
    metrics = ansible(args, host, "ansible.builtin.uri", f"url={args.url}/metrics return_content=true")["content"]
    return {name: metric_total(metrics, name) or 0.0 for name in SERVER_COUNTERS}


def server_view(before, after):
    """The server's mean TTFT (ms) and prefix-cache hit rate (%) over the requests between two readings."""
    ttft_sum, ttft_count, hits, queries = (after[name] - before[name] for name in SERVER_COUNTERS)
    return {
        "server_mean_ttft_ms": ttft_sum / ttft_count * 1000,
        # A server without prefix caching makes no queries.
        "prefix_cache_hit_percent": hits / queries * 100 if queries else 0.0,
    }


def paired_ratio(ours, theirs, resamples=10000):
    """vllm_bench / `vllm bench serve` over paired runs: geometric mean and 95% bootstrap interval, in percent."""
    logs = [math.log(o / t) for o, t in zip(ours, theirs, strict=True)]
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _resample in range(resamples))
    low, high = means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]
    return tuple((math.exp(value) - 1) * 100 for value in (statistics.fmean(logs), low, high))


def verdict(low, high, tolerance=5.0):
    if -tolerance <= low and high <= tolerance:
        return "agree"
    if high < -tolerance or low > tolerance:
        return "differ"
    return "not shown"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("host")
    parser.add_argument("-i", "--inventory", required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup-rounds", type=int, default=1, help="rounds run first and not counted")
    parser.add_argument("--levels", nargs="+", default=["1:8", "8:32", "32:64"], help="CONCURRENCY:REQUESTS")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="wide", help="served name of the instance (default wide)")
    parser.add_argument("--model-path", help="its weights on the host (default /var/lib/vllm/models/MODEL)")
    parser.add_argument("--env-file", help="its EnvironmentFile (default /etc/vllm/MODEL.env)")
    parser.add_argument("--python", default="/opt/vllm/venv/bin/python")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument(
        "--client-cpu",
        type=int,
        help="run both clients on this CPU alone (taskset); pin the server off it, e.g. CPUAffinity= in a drop-in",
    )
    args = parser.parse_args()
    args.model_path = args.model_path or f"/var/lib/vllm/models/{args.model}"
    args.env_file = args.env_file or f"/etc/vllm/{args.model}.env"

    key = api_key(args, args.host)
    if args.client_cpu is not None:
        pin_clients(args, args.host)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, host {args.host}: {args.warmup_rounds} warm-up and"
        f" {args.rounds} counted rounds, levels (concurrency:requests) {' '.join(args.levels)}; "
        + (f"clients on CPU {args.client_cpu}" if args.client_cpu is not None else "client and server share the cores")
    )
    runs = {"vllm bench serve": {}, "vllm_bench": {}}
    for round_number in range(args.warmup_rounds + args.rounds):
        counted = round_number >= args.warmup_rounds
        label = f"round {round_number + 1 - args.warmup_rounds}" if counted else f"warm-up {round_number + 1}"
        for index, level in enumerate(args.levels):
            concurrency, requests = (int(part) for part in level.split(":"))
            # Another seed for every level of every round, the same for both clients (each draws its own prompts
            # from it). A generated model's tokenizer has only a few hundred tokens, so prompts that start at the
            # same offset recur anyway: run the server without prefix caching (wide.yml does), and the printed
            # hit rate shows it.
            seed = 1000 * (round_number + 1) + concurrency
            clients = ["vllm bench serve", "vllm_bench"]
            for client in clients if (round_number + index) % 2 == 0 else reversed(clients):
                before = server_counters(args, args.host)
                if client == "vllm bench serve":
                    measured = run_vllm_bench_serve(args, args.host, concurrency, requests, seed)
                else:
                    measured = run_vllm_bench(args, args.host, concurrency, requests, seed, key)
                measured.update(server_view(before, server_counters(args, args.host)))
                assert measured["failed"] == 0, f"{client} C={concurrency}: {measured['failed']} failed requests"
                if counted:
                    runs[client].setdefault(concurrency, []).append(measured)
                print(
                    f"{label:<9} C={concurrency:<3} {client:<17}"
                    f" output {measured['output_throughput']:7.1f} tok/s"
                    f"  median TTFT {measured['median_ttft_ms']:7.2f} ms"
                    f"  mean TTFT {measured['mean_ttft_ms']:7.2f} ms (server {measured['server_mean_ttft_ms']:7.2f})"
                    f"  median ITL {measured['median_itl_ms']:5.2f} ms"
                    f"  prefix cache hits {measured['prefix_cache_hit_percent']:4.1f}%"
                    f"  client CPU {measured['client_cpu_seconds']:.3f} s for {measured['total_output_tokens']} tokens",
                    flush=True,
                )
    report(args, runs)


def report(args, runs):
    print(f"\n{args.rounds} rounds, random {args.input_len} in / {args.output_len} out, ignore_eos")
    print(
        "vllm_bench vs vllm bench serve: geometric mean of the rounds' paired ratios [95% bootstrap interval];"
        " agree = the interval lies within +-5%"
    )
    for level in args.levels:
        concurrency = int(level.split(":")[0])
        theirs, ours = runs["vllm bench serve"][concurrency], runs["vllm_bench"][concurrency]
        print(f"\nC={concurrency}")
        for field, name in (("output_throughput", "output tok/s"), ("median_ttft_ms", "median TTFT ms")):
            mean, low, high = paired_ratio([run[field] for run in ours], [run[field] for run in theirs])
            print(
                f"  {name:<15} vllm bench serve {statistics.median(run[field] for run in theirs):8.2f}"
                f"  vllm_bench {statistics.median(run[field] for run in ours):8.2f}"
                f"  paired {mean:+5.1f}% [{low:+5.1f}%, {high:+5.1f}%]  {verdict(low, high)}"
            )
        for client, client_runs in (("vllm bench serve", theirs), ("vllm_bench", ours)):
            client_ms = statistics.median(run["mean_ttft_ms"] for run in client_runs)
            server_ms = statistics.median(run["server_mean_ttft_ms"] for run in client_runs)
            above = statistics.median(run["mean_ttft_ms"] - run["server_mean_ttft_ms"] for run in client_runs)
            cpu = statistics.median(
                run["client_cpu_seconds"] / run["total_output_tokens"] * 1000 for run in client_runs
            )
            print(
                f"  {client:<17} mean TTFT {client_ms:7.2f} ms, server's {server_ms:7.2f} ms, client above server"
                f" {above:5.2f} ms; client CPU {cpu:.4f} s per 1,000 output tokens"
            )


if __name__ == "__main__":
    main()
