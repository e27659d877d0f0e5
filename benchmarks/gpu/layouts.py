# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parallel layouts on the GPU machine: the planner's verdict on each, beside what vLLM itself does with it.

The test models are small copies of the seed models' shapes, written here with random weights (config.json and
the GPU bundle's tokenizer; served with --load-format dummy), and their catalog entries are in benchmarks/models:

  gpu_moe_fp8        FP8 MoE with 128x128 blocks and experts 384 wide: TP 2 breaks the block (192), as TP 8
                     breaks MiniMax-M2.5's 1536, and TP 2 with expert parallelism keeps whole experts
  gpu_moe_fp8_shard  the same MoE with experts 192 wide, the TP 2 shard as a whole model: vLLM checks each rank's
                     shard, so on one GPU it meets the rule that TP 2 of gpu_moe_fp8 meets on two
  gpu_gqa            a Llama with one KV head, which TP 2 must replicate; TP 3 fails for its 16 heads

For each layout of each entry: the planner's verdict (the vllm_plan module, run as Ansible runs it, with this
host's GPU facts from gpu_facts, and with those of two such GPUs), then vLLM started from the command line and
environment that the collection renders for it (harness.Server: serve_spec, build_serve_args,
build_server_environment with the instance's CUDA_VISIBLE_DEVICES), with what it did: served, or failed with its
error line. For the layouts that serve: the load, vllm_bench at C = 1, 8, 32 and 128, and the bounded stop
(Lifecycle.stop) followed by gpu_memory_wait back to the GPUs' memory before the load. A layout that needs more
GPUs than the host has is started too: vLLM's refusal is part of the comparison.

Results go to OUT/gpu-layouts.json as they come, and OUT/gpu-layouts.md (the table) at the end.

usage: python3 benchmarks/gpu/layouts.py --out DIR [--only ENTRY:LAYOUT ...] [harness options]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import time
from pathlib import Path

from harness import HERE, Results, Server, bench_level, load_entry, run_module, timed

from ansible_collections.llmops.vllm.plugins.module_utils.gpu.nvidia import topology
from ansible_collections.llmops.vllm.plugins.module_utils.service.serve_command import layout_gpu_count
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import error_lines

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


# Each entry's config.json, less the tokenizer's token ids (the unit tests of the planner read them too).
CONFIGS = {
    name: json.loads((HERE.parent / "models" / "configs" / f"{name}.json").read_text())
    for name in ("gpu_moe_fp8", "gpu_moe_fp8_shard", "gpu_gqa")
}
# Every layout of every entry, in the table's order: (entry, layout name).
LAYOUTS = [(name, layout) for name in CONFIGS for layout in ("default", *load_entry(name)["alternatives"])]
# An exception as a traceback's last line gives it, or as pydantic words a config's refusal.
EXCEPTION = re.compile(r"\b(\w+(?:Error|Exception)(?:: .+)?|Value error, .+)$")


def write_models(tokenizer: Path):
    """Each entry's config.json, with the bundle's tokenizer and its token ids, into the entry's source path."""
    bundle = json.loads((tokenizer / "config.json").read_text())
    token_ids = {key: bundle[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    for name, config in CONFIGS.items():
        config = {**config, **token_ids}
        directory = Path(load_entry(name)["source"]["path"])
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(config, indent=2))
        for file in TOKENIZER_FILES:
            shutil.copy(tokenizer / file, directory / file)


def two_of(facts: dict) -> dict:
    """This host's GPU facts with its GPU twice, NVLinked as on an H200 board: a host of two such GPUs."""
    first = facts["gpus"][0]
    second = {**first, "index": 1, "uuid": first["uuid"][:-4] + "0001"}
    return {**facts, "count": 2, "gpus": [first, second], "topology": topology([["X", "NV18"], ["NV18", "X"]])}


def verdict(entry: dict, layout: str, gpus: dict) -> dict:
    """The vllm_plan module's answer: it fails, with the plan, for a layout that breaks a rule."""
    plan = run_module("vllm_plan", model=entry, config_path=entry["source"]["path"], gpus=gpus, layout=layout)
    if "ok" not in plan:
        raise RuntimeError(f"vllm_plan {entry['name']} {layout}: {plan.get('msg')}")
    return {
        "ok": plan["ok"],
        "layout": plan["layout"],
        "serve_args": plan["serve_args"],
        "failed_rules": plan["failed_rules"],
        "reason": plan.get("reason") or plan["summary"],
        "checks": {check["rule"]: check["detail"] for check in plan["checks"] if check["rule"] in SHOWN_RULES},
    }


# The rules whose findings the table's notes show, passed or not.
SHOWN_RULES = ("attention_heads", "kv_heads", "quantization_alignment", "router", "expert_parallel")


def vllm_error(server: Server) -> str | None:
    """The root cause of the server's failure: the first exception among its log's error lines (vLLM's processes
    re-raise it as "Engine core initialization failed. See root cause above"), or pydantic's words for it."""
    causes = [match.group(1) for line in error_lines(server.unit.log_lines(), 400) if (match := EXCEPTION.search(line))]
    specific = [cause for cause in causes if not cause.startswith(GENERIC_CAUSES)]
    return (specific or causes or [None])[0]


# What vLLM says around the root cause, never the cause itself.
GENERIC_CAUSES = ("RuntimeError: Engine core initialization failed", "ValidationError: 1 validation error for")


def bench(server: Server, levels) -> list:
    levels = [bench_level(server, concurrency, requests, seed=concurrency) for concurrency, requests in levels]
    return [{key: level.get(key) for key in BENCH_FIELDS} for level in levels]


BENCH_FIELDS = ("max_concurrency", "completed", "failed", "output_throughput", "median_ttft_ms", "median_itl_ms")


def run_layout(args, results: Results, entry_name: str, layout_name: str, port: int, facts: dict):
    entry = load_entry(entry_name)
    key = f"{entry_name}:{layout_name}"
    found = {
        "here": verdict(entry, layout_name, facts),
        "two_gpus": verdict(entry, layout_name, two_of(facts) if facts["gpus"] else facts),
    }
    layout = found["here"]["layout"]
    gpus = [str(index) for index in range(min(layout_gpu_count(layout), facts["count"]))]
    server = Server(args, key.replace(":", "-"), port, entry["gpu_memory_utilization"], 0, eager=True,
                    entry=entry_name, layout=layout, gpus=gpus)  # fmt: skip
    found["argv"] = server.argv[2:]
    found["cuda_visible_devices"] = server.env.get("CUDA_VISIBLE_DEVICES")
    if args.device == "cuda":
        baseline = run_module("gpu_memory_wait", gpus=["all"], timeout=60, interval=0.2, consecutive=2)["used_mib"]
    try:
        found["start_s"], started = timed(lambda: start_or_error(server))
        found.update(started)
        if found["vllm"] == "serves":
            found["bench"] = bench(server, args.levels)
            found["stop_s"], found["stop"] = timed(server.stop)
            if args.device == "cuda":
                found["memory_back_s"], memory = timed(
                    lambda: run_module("gpu_memory_wait", gpus=["all"], baseline=baseline, timeout=60, interval=0.05)
                )
                found["memory_back"] = {field: memory.get(field) for field in ("failed", "msg", "elapsed", "used_mib")}
    finally:
        server.unit.kill_session()
        results.add("layouts", key, found)


def start_or_error(server: Server) -> dict:
    try:
        return {"vllm": "serves", **server.start()}
    except Exception as error:  # pylint: disable=broad-except
        return {"vllm": "fails", "vllm_error": vllm_error(server), "collection_message": str(error)[:3000]}


def markdown(data: dict) -> str:
    lines = [
        "# Parallel layouts on the GPU machine: the planner's verdicts beside vLLM's",
        "",
        f"Host: {data.get('host', {}).get('gpus')}. Planner: the vllm_plan module with this host's GPU facts, and"
        " with two such GPUs. vLLM: 0.26.0, started from the collection's rendering (benchmarks/gpu/layouts.py).",
        "",
        "*agree*: the planner's verdict for this host beside what vLLM did here. vLLM refuses a layout of more GPUs"
        " than the host has on its GPU count alone, so for those the column of 2 GPUs is the planner's word until"
        " the layout runs on 2 GPUs.",
        "",
        "| entry | layout | planner, this host | planner, 2 GPUs | vLLM here | agree | vLLM's line / load s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, row in data.get("layouts", {}).items():
        if not isinstance(row, dict) or "here" not in row:
            continue
        entry, layout = key.split(":")
        here, two = (
            "passes" if plan["ok"] else "refuses: " + ", ".join(plan["failed_rules"])
            for plan in (row["here"], row["two_gpus"])
        )
        agree = "yes" if row["here"]["ok"] == (row.get("vllm") == "serves") else "**no**"
        said = f"ready in {row.get('ready_s')} s" if row.get("vllm") == "serves" else f"`{row.get('vllm_error')}`"
        lines.append(f"| {entry} | {layout} | {here} | {two} | {row.get('vllm')} | {agree} | {said} |")
    served = {key: row for key, row in data.get("layouts", {}).items() if isinstance(row, dict) and row.get("bench")}
    if served:
        lines += ["", "## The layouts that serve", ""]
        lines += ["| entry:layout | C | output tok/s | median TTFT ms | median ITL ms | failed |", "| --- " * 6 + "|"]
        for key, row in served.items():
            for level in row["bench"]:
                lines.append(
                    f"| {key} | {level['max_concurrency']} | {level['output_throughput']:.0f} | "
                    f"{level['median_ttft_ms']:.1f} | {level['median_itl_ms']:.2f} | {level['failed']} |"
                )
        lines += ["", "| entry:layout | ready s | weights s | KV cache GiB | stop s | GPU memory back s |"]
        lines.append("| --- " * 6 + "|")
        for key, row in served.items():
            lines.append(
                f"| {key} | {row.get('ready_s')} | {row.get('weights_s')} | {row.get('kv_cache_gib')} | "
                f"{row.get('stop_s')} | {row.get('memory_back_s')} |"
            )
    lines += ["", "## What the planner found", ""]
    for key, row in data.get("layouts", {}).items():
        if isinstance(row, dict) and "here" in row:
            found = "; ".join(f"{rule}: {detail}" for rule, detail in row["two_gpus"]["checks"].items())
            lines.append(f"- {key}, on 2 GPUs: {found}. On this host: {row['here']['reason']}")
        elif isinstance(row, dict):
            lines.append(f"- {key}: the run failed: {row.get('error')}")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="+", metavar="ENTRY:LAYOUT", help="these layouts alone")
    parser.add_argument("--tokenizer", type=Path, default=Path("/tmp/tinyllama"), help="the bundle's model")
    parser.add_argument("--summary", type=Path, help="write only the Markdown of an earlier run's JSON")
    parser.add_argument("--python", default="/opt/torch/.venv/bin/python3")
    parser.add_argument("--pythonpath", default="/tmp/site")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--home", default="/tmp/llmops-vllm-home")
    parser.add_argument("--port", type=int, default=8200)
    parser.add_argument(
        "--levels", nargs="+", default=["1:16", "8:64", "32:128", "128:512"], help="CONCURRENCY:REQUESTS"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.summary:
        (args.out / "gpu-layouts.md").write_text(markdown(json.loads(args.summary.read_text())))
        return
    args.entry, args.model_dir = "gpu_tinyllama", str(args.tokenizer)
    args.levels = [tuple(int(part) for part in level.split(":")) for level in args.levels]
    args.logs = args.out / "logs"
    args.logs.mkdir(exist_ok=True)
    Path(args.home).mkdir(parents=True, exist_ok=True)
    chosen = [tuple(item.split(":")) for item in args.only] if args.only else LAYOUTS
    unknown = [":".join(item) for item in chosen if item not in LAYOUTS]
    if unknown:
        parser.error(f"unknown layouts {unknown}; known: {[':'.join(item) for item in LAYOUTS]}")
    write_models(args.tokenizer)
    results = Results(args.out, args, "gpu-layouts")
    facts = run_module("gpu_facts")["ansible_facts"]["vllm_gpus"]
    results.add("host", "gpus", f"{facts['count']} x {facts['gpus'][0]['name']}" if facts["gpus"] else "none")
    began = time.monotonic()
    try:
        for number, (entry_name, layout_name) in enumerate(chosen):
            try:
                run_layout(args, results, entry_name, layout_name, args.port + number, facts)
            except Exception as error:  # pylint: disable=broad-except
                results.add("layouts", f"{entry_name}:{layout_name}", {"error": repr(error)[-3000:]})
    finally:
        results.add("host", "wall_s", round(time.monotonic() - began, 1))
        (args.out / "gpu-layouts.md").write_text(markdown(results.data))


if __name__ == "__main__":
    main()
