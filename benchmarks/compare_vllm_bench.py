# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Side by side: `vllm bench serve` and llmops.vllm.vllm_bench, same server, same workload, same host.

Every level (C=1, 8, 32 by default) of every round runs both clients on the server's host, one after the
other, in alternating order (A B, then B A, ...), so that drift of a shared machine hits both alike; the
figures are the medians of the rounds. Printed per level: output throughput and median TTFT of each, the
difference of vllm_bench from
`vllm bench serve` in percent, and each client's CPU seconds per 1,000 output tokens (process CPU time while
benchmarking / output tokens).

Both clients run with the vLLM venv's python on the host and random 128-token prompts from the model's
tokenizer (vLLM's random dataset; vllm_bench's tokenizer prompts), ignore_eos, and one warm-up request
(`vllm bench serve` sends its ready check; vllm_bench gets warmup_requests: 1).

With --client-cpu N both clients run alone on CPU N (taskset), so that the server's speed does not depend on
what each client costs; pin the server off that CPU first (CPUAffinity= in a drop-in of its unit).

usage: python benchmarks/compare_vllm_bench.py -i INVENTORY HOST [--rounds 3] [--levels 1:32 8:128 32:256]
                                               [--client-cpu N]
(run from the repository root with the venv's ansible on PATH and ANSIBLE_COLLECTIONS_PATH set, as make does)
"""

import argparse
import base64
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from vllm_bench_serve_cpu import api_key_from

ROOT = Path(__file__).resolve().parents[1]
HELPER = ROOT / "benchmarks" / "vllm_bench_serve_cpu.py"


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


def diff_percent(ours, theirs):
    return (ours - theirs) / theirs * 100


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("host")
    parser.add_argument("-i", "--inventory", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--levels", nargs="+", default=["1:32", "8:128", "32:256"], help="CONCURRENCY:REQUESTS")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--model-path", default="/var/lib/vllm/models/tiny")
    parser.add_argument("--env-file", default="/etc/vllm/tiny.env")
    parser.add_argument("--python", default="/opt/vllm/venv/bin/python")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument(
        "--client-cpu",
        type=int,
        help="run both clients on this CPU alone (taskset); pin the server off it, e.g. CPUAffinity= in a drop-in",
    )
    args = parser.parse_args()

    key = api_key(args, args.host)
    if args.client_cpu is not None:
        pin_clients(args, args.host)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, host {args.host}: {args.rounds} rounds, levels"
        f" (concurrency:requests) {' '.join(args.levels)}; "
        + (f"clients on CPU {args.client_cpu}" if args.client_cpu is not None else "client and server share the cores")
    )
    runs = {"vllm bench serve": {}, "vllm_bench": {}}
    for round_number in range(args.rounds):
        for index, level in enumerate(args.levels):
            concurrency, requests = (int(part) for part in level.split(":"))
            # Fresh prompts for every run, the same seed for both clients: neither finds the other's, or its own
            # earlier, prompts in vLLM's prefix cache.
            seed = 1000 * (round_number + 1) + concurrency
            clients = ["vllm bench serve", "vllm_bench"]
            for client in clients if (round_number + index) % 2 == 0 else reversed(clients):
                if client == "vllm bench serve":
                    measured = run_vllm_bench_serve(args, args.host, concurrency, requests, seed)
                else:
                    measured = run_vllm_bench(args, args.host, concurrency, requests, seed, key)
                assert measured["failed"] == 0, f"{client} C={concurrency}: {measured['failed']} failed requests"
                runs[client].setdefault(concurrency, []).append(measured)
                print(
                    f"round {round_number + 1} C={concurrency:<3} {client:<17}"
                    f" output {measured['output_throughput']:7.1f} tok/s"
                    f"  median TTFT {measured['median_ttft_ms']:7.2f} ms"
                    f"  median ITL {measured['median_itl_ms']:5.2f} ms"
                    f"  client CPU {measured['client_cpu_seconds']:.3f} s for {measured['total_output_tokens']} tokens",
                    flush=True,
                )

    print(f"\nmedians of {args.rounds} rounds, random {args.input_len} in / {args.output_len} out, ignore_eos")
    print("paired: the median over rounds of each round's own difference (the two runs of a round are back to back)")
    header = (
        f"{'C':>3} | {'out tok/s vllm':>14} | {'vllm_bench':>10} | {'diff':>6} | {'paired':>6}"
        f" | {'med TTFT ms vllm':>16} | {'vllm_bench':>10} | {'diff':>6} | {'paired':>6}"
        f" | {'CPU s/1k tok vllm':>17} | {'vllm_bench':>10}"
    )
    print(header)
    print("-" * len(header))
    for level in args.levels:
        concurrency = int(level.split(":")[0])
        theirs, ours = runs["vllm bench serve"][concurrency], runs["vllm_bench"][concurrency]
        cells = []
        for field in ("output_throughput", "median_ttft_ms"):
            theirs_median = statistics.median(run[field] for run in theirs)
            ours_median = statistics.median(run[field] for run in ours)
            paired = statistics.median(diff_percent(o[field], t[field]) for o, t in zip(ours, theirs, strict=True))
            cells.append(
                f"{theirs_median:>{14 if field == 'output_throughput' else 16}.2f} | {ours_median:>10.2f}"
                f" | {diff_percent(ours_median, theirs_median):>+5.1f}% | {paired:>+5.1f}%"
            )
        cpu = [
            statistics.median(run["client_cpu_seconds"] / run["total_output_tokens"] * 1000 for run in client_runs)
            for client_runs in (theirs, ours)
        ]
        print(f"{concurrency:>3} | " + " | ".join(cells) + f" | {cpu[0]:>17.4f} | {cpu[1]:>10.4f}")


if __name__ == "__main__":
    main()
