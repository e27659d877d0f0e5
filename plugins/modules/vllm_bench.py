#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_bench
short_description: Benchmark an OpenAI-compatible endpoint over concurrency levels, as vllm bench serve does
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Streams a fixed workload at each concurrency level in turn (at most that many requests in flight, like
    C(vllm bench serve --max-concurrency)) and measures each request from the streamed chunks.
  - Metrics and field names are those of C(vllm bench serve) (C(--save-result)), so results compare with it
    directly. TTFT is the time to the first streamed chunk with C(choices); ITL the gaps between later chunks;
    E2EL the time to the last chunk; TPOT is (E2EL - TTFT) / (output tokens - 1); token counts come from the
    stream's C(usage) (C(stream_options.include_usage)). Statistics follow numpy (population standard
    deviation, linearly interpolated percentiles).
  - Failed requests are counted per level, with their first error texts, never dropped.
  - Needs only the Python standard library, so it runs with any host's python3, on the server itself or on the
    controller (C(delegate_to)). With the Python package C(tokenizers) importable (the vLLM venv has it) and
    O(tokenizer) set, prompts are built from the model's vocabulary as C(vllm bench serve --dataset-name random)
    builds them; otherwise a fixed text of about O(input_len) words, distinct per request.
  - Sets the fact C(vllm_bench_result). Reports (JSON, CSV, Markdown, plot) are written by
    M(llmops.vllm.vllm_bench_report).
extends_documentation_fragment:
  - llmops.vllm.records
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
    details: In check mode no request is sent; the options are checked and nothing else happens.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: The module never changes the target; it reports C(changed=false).
options:
  url:
    description:
      - Base URL of the server, for example V(http://127.0.0.1:8000) (a trailing C(/v1) is accepted).
      - One of O(url) and O(instance) is required.
    type: str
  model:
    description: The served model name that the requests ask for; required with O(url).
    type: str
  api_key:
    description: Sent as C(Authorization Bearer) when set (vLLM's C(--api-key)), with O(url).
    type: str
  instance:
    description:
      - Benchmark an instance of this host by name. Its record (O(config_dir)/INSTANCE.json, see
        M(llmops.vllm.vllm_instance)) gives the URL, the served name and the API key (read from the
        EnvironmentFile the record names; never logged).
      - Only where the module runs on the instance's host; from elsewhere give O(url), O(model) and O(api_key).
    type: str
  endpoint:
    description: The OpenAI API to call.
    type: str
    choices: [completions, chat]
    default: completions
  concurrency:
    description: Concurrency levels, run in this order, each with the same workload.
    type: list
    elements: int
    default: [1]
  num_requests:
    description:
      - Requests per level. The default is four times the level's concurrency, and at least 16.
      - Mutually exclusive with O(duration).
    type: int
  duration:
    description:
      - Seconds per level instead of a request count. No request starts after that time; those in flight finish
        and count.
    type: float
  input_len:
    description:
      - Prompt length in tokens as the server counts them, the special tokens that the tokenizer adds (a BOS)
        included, as in C(vllm bench serve); about that many words for the fixed prompt.
    type: int
    default: 128
  output_len:
    description: Tokens to generate per request (C(max_tokens)).
    type: int
    default: 128
  ignore_eos:
    description:
      - Ask the server to ignore end-of-sequence, so every request generates O(output_len) tokens.
      - This is vLLM's C(ignore_eos), as in C(vllm bench serve --ignore-eos).
    type: bool
    default: true
  tokenizer:
    description:
      - A model directory holding C(tokenizer.json), or the file itself, on the machine where the module runs.
      - Used when the Python package C(tokenizers) is importable there; RV(prompt_source) says what was used.
    type: path
  seed:
    description:
      - Seed of the random prompts, so two runs send the same workload. Level N (from 0) uses O(seed) + N, so that
        no level finds the previous level's prompts in the server's prefix cache.
      - Two runs with the same seed against a server that has not restarted may find the first run's prompts
        cached; change the seed between runs where that matters.
    type: int
    default: 0
  warmup_requests:
    description: Requests sent before the first level, not measured (C(vllm bench serve --num-warmups)).
    type: int
    default: 0
  request_timeout:
    description: Seconds one request may take, from sending to the end of its stream; a slower one counts as failed.
    type: float
    default: 600
  percentiles:
    description: Percentiles reported for TTFT, TPOT, ITL and E2EL (C(--metric-percentiles)).
    type: list
    elements: float
    default: [50, 90, 99]
  goodput:
    description:
      - Service level objectives in milliseconds (keys C(ttft), C(tpot), C(e2el)); C(request_goodput) is the rate
        of completed requests that meet all of them (C(vllm bench serve --goodput)).
    type: dict
  max_failed_percent:
    description:
      - Fail when more than this share of a level's requests failed. The results are returned either way.
    type: float
    default: 0
  baseline:
    description:
      - A saved result to compare with, matched by concurrency level; either its contents (a dict with
        C(levels), as this module returns and M(llmops.vllm.vllm_bench_report) saves), or the path of such a JSON
        file on the machine where the module runs.
    type: raw
  regression_metrics:
    description:
      - Metrics compared with the O(baseline). Throughputs and goodput regress when they fall, latencies when they rise.
    type: list
    elements: str
    default: [output_throughput]
  max_regression_percent:
    description: Fail when a O(regression_metrics) metric is worse than the baseline by more than this percent.
    type: float
    default: 10
  validate_certs:
    description: Check the server's TLS certificate (https URLs).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Sweep the server on its own host, random token prompts from the model's tokenizer
  llmops.vllm.vllm_bench:
    url: http://127.0.0.1:8000
    model: tiny
    api_key: "{{ vllm_server_api_key }}"
    concurrency: [1, 8, 32]
    num_requests: 64
    input_len: 128
    output_len: 128
    tokenizer: /var/lib/vllm/models/tiny
  vars:
    ansible_python_interpreter: /opt/vllm/venv/bin/python
  register: bench

- name: From the controller, fail when output throughput fell more than 5% from a saved run
  llmops.vllm.vllm_bench:
    url: "http://{{ ansible_host }}:8000"
    model: MiniMax-M2.5
    concurrency: [1, 16, 64, 128]
    duration: 60
    goodput: {ttft: 2000, tpot: 50}
    baseline: "{{ lookup('ansible.builtin.file', 'bench-results/gpu1.json') | from_json }}"
    regression_metrics: [output_throughput, median_ttft_ms]
    max_regression_percent: 5
  delegate_to: localhost
"""

RETURN = r"""
levels:
  description:
    - One entry per concurrency level, with C(vllm bench serve)'s fields (times in ms, throughputs per second)
      and the client's own CPU time.
    - The percentile fields follow O(percentiles), for example C(p99_ttft_ms).
  returned: unless in check mode
  type: list
  elements: dict
  sample:
    - max_concurrency: 8
      num_requests: 32
      duration: 1.9
      completed: 32
      failed: 0
      errors: []
      total_input_tokens: 4096
      total_output_tokens: 4096
      request_throughput: 16.8
      request_goodput: null
      output_throughput: 2150.4
      total_token_throughput: 4300.8
      mean_ttft_ms: 41.2
      median_ttft_ms: 38.0
      std_ttft_ms: 9.1
      p50_ttft_ms: 38.0
      p90_ttft_ms: 55.3
      p99_ttft_ms: 61.0
      mean_tpot_ms: 3.4
      median_itl_ms: 3.2
      mean_e2el_ms: 470.3
      client_cpu_seconds: 0.21
      client_cpu_seconds_per_1k_output_tokens: 0.051
summary:
  description: The workload, where it ran, the best level, and the totals.
  returned: unless in check mode
  type: dict
  sample:
    model: tiny
    endpoint: completions
    input_len: 128
    output_len: 128
    prompt_source: tokenizer
    concurrency: [1, 8, 32]
    best_output_throughput: 3400.2
    best_concurrency: 32
    completed: 192
    failed: 0
prompt_source:
  description:
    - C(tokenizer) (random token prompts) or C(fixed) (the fixed text, for want of tokenizers or of the file).
  returned: unless in check mode
  type: str
  sample: tokenizer
comparisons:
  description: Each (level, metric) compared with the O(baseline), with C(change_percent) and C(regressed).
  returned: when O(baseline) is set
  type: list
  elements: dict
  sample:
    - max_concurrency: 8
      metric: output_throughput
      baseline: 2200.0
      current: 2150.4
      change_percent: -2.25
      regressed: false
ansible_facts:
  description: The result as the fact C(vllm_bench_result) (C(levels), C(summary), C(comparisons)).
  returned: unless in check mode
  type: dict
  contains:
    vllm_bench_result:
      description: C(levels), C(summary) and C(comparisons), as above.
      type: dict
      returned: unless in check mode
"""

import math
import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.bench.error import BenchError
from ansible_collections.llmops.vllm.plugins.module_utils.bench.load_generator import Target, run_level
from ansible_collections.llmops.vllm.plugins.module_utils.bench.options import check_options
from ansible_collections.llmops.vllm.plugins.module_utils.bench.statistics import describe_regression, regressions
from ansible_collections.llmops.vllm.plugins.module_utils.bench.workload import (
    load_tokenizer,
    measure_level,
    prompts_for,
    read_saved,
)
from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import (
    DEFAULT_CONFIG_DIR,
    RecordError,
    api_key,
    find,
)


def read_baseline(baseline, metrics):
    """The baseline's levels, each with a concurrency and every metric to compare; BenchError otherwise."""
    baseline = read_saved(baseline, "baseline")
    if not isinstance(baseline.get("levels"), list) or not baseline["levels"]:
        raise BenchError("the baseline must be a saved result: a dict (or JSON file) with a list `levels`")
    for position, level in enumerate(baseline["levels"]):
        if not isinstance(level, dict) or not _is_number(level.get("max_concurrency")):
            raise BenchError(f"the baseline's level {position + 1} is {level!r}, not a level with max_concurrency")
        missing = [metric for metric in metrics if not _is_number(level.get(metric))]
        if missing:
            raise BenchError(
                f"regression_metrics {missing} are not numbers in the baseline's level C={level['max_concurrency']}; "
                "name metrics of a vllm_bench result such as output_throughput or median_ttft_ms"
            )
    return baseline["levels"]


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_sweep(params, target, tokenizer):
    """Warm up, then run every level; returns the levels' metrics."""
    if params["warmup_requests"]:
        seed = params["seed"] + len(params["concurrency"])
        warmups = prompts_for(tokenizer, params["warmup_requests"], params["input_len"], seed)
        run_level(target, warmups, max(params["concurrency"]), params["request_timeout"])
    slos = {key: float(value) for key, value in (params["goodput"] or {}).items()}
    levels = []
    for index, concurrency in enumerate(params["concurrency"]):
        count = params["num_requests"] or max(16, 4 * concurrency)
        # Each level its own prompts: a level must not find the previous one's in vLLM's prefix cache.
        prompts = prompts_for(tokenizer, count, params["input_len"], params["seed"] + index)
        levels.append(
            measure_level(
                target,
                prompts,
                concurrency,
                params["request_timeout"],
                params["duration"],
                params["percentiles"],
                slos,
            )
        )
    return levels


def summarize(params, levels, prompt_source):
    best = max(levels, key=lambda level: level["output_throughput"])
    return {
        "model": params["model"],
        "endpoint": params["endpoint"],
        "input_len": params["input_len"],
        "output_len": params["output_len"],
        "prompt_source": prompt_source,
        "concurrency": params["concurrency"],
        "best_output_throughput": best["output_throughput"],
        "best_concurrency": best["max_concurrency"],
        "completed": sum(level["completed"] for level in levels),
        "failed": sum(level["failed"] for level in levels),
    }


def failed_levels(levels, max_failed_percent):
    messages = []
    for level in levels:
        if level["failed"] and level["failed"] / level["num_requests"] * 100 > max_failed_percent:
            messages.append(
                f"C={level['max_concurrency']}: {level['failed']} of {level['num_requests']} requests failed"
                f" (first error: {level['errors'][0]})"
            )
    return messages


def main():
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str"},
            "model": {"type": "str"},
            "api_key": {"type": "str", "no_log": True},
            "instance": {"type": "str"},
            "config_dir": {"type": "path", "default": DEFAULT_CONFIG_DIR},
            "endpoint": {"type": "str", "choices": ["completions", "chat"], "default": "completions"},
            "concurrency": {"type": "list", "elements": "int", "default": [1]},
            "num_requests": {"type": "int"},
            "duration": {"type": "float"},
            "input_len": {"type": "int", "default": 128},
            "output_len": {"type": "int", "default": 128},
            "ignore_eos": {"type": "bool", "default": True},
            "tokenizer": {"type": "path"},
            "seed": {"type": "int", "default": 0},
            "warmup_requests": {"type": "int", "default": 0},
            "request_timeout": {"type": "float", "default": 600},
            "percentiles": {"type": "list", "elements": "float", "default": [50, 90, 99]},
            "goodput": {"type": "dict"},
            "max_failed_percent": {"type": "float", "default": 0},
            "baseline": {"type": "raw"},
            "regression_metrics": {"type": "list", "elements": "str", "default": ["output_throughput"]},
            "max_regression_percent": {"type": "float", "default": 10},
            "validate_certs": {"type": "bool", "default": True},
        },
        mutually_exclusive=[
            ("num_requests", "duration"),
            *(("instance", name) for name in ("url", "model", "api_key")),
        ],
        required_one_of=[("url", "instance")],
        required_by={"url": "model"},
        supports_check_mode=True,
    )
    params = module.params
    try:
        check_options(params)
    except BenchError as error:
        module.fail_json(msg=str(error))
    if params["instance"] is not None:
        try:
            record = find(params["config_dir"], params["instance"])
            params.update(url=record["url"], model=record["served_name"], api_key=api_key(record))
        except RecordError as error:
            module.fail_json(msg=str(error))
        if params["api_key"]:
            module.no_log_values.add(params["api_key"])
    try:
        baseline_levels = (
            read_baseline(params["baseline"], params["regression_metrics"]) if params["baseline"] is not None else None
        )
        target = Target.build(
            params["url"],
            params["endpoint"],
            params["model"],
            params["output_len"],
            api_key=params["api_key"],
            ignore_eos=params["ignore_eos"],
            validate_certs=params["validate_certs"],
        )
        tokenizer = load_tokenizer(params["tokenizer"])
    except BenchError as error:
        module.fail_json(msg=str(error))
    except Exception as error:  # a tokenizer file that tokenizers cannot read
        module.fail_json(
            msg=f"cannot load the tokenizer {params['tokenizer']}: {error}", exception=traceback.format_exc()
        )
    if module.check_mode:
        module.exit_json(changed=False, msg="check mode: no request sent")

    prompt_source = "fixed" if tokenizer is None else "tokenizer"
    levels = run_sweep(params, target, tokenizer)
    result = {"levels": levels, "summary": summarize(params, levels, prompt_source)}
    messages = failed_levels(levels, params["max_failed_percent"])
    if baseline_levels is not None:
        try:
            result["comparisons"], regressed = regressions(
                levels, baseline_levels, params["regression_metrics"], params["max_regression_percent"]
            )
        except BenchError as error:
            module.fail_json(msg=str(error), prompt_source=prompt_source, **result)
        messages += ["regression: " + describe_regression(item, params["max_regression_percent"]) for item in regressed]
    if messages:
        module.fail_json(msg="; ".join(messages), prompt_source=prompt_source, **result)
    module.exit_json(changed=False, prompt_source=prompt_source, ansible_facts={"vllm_bench_result": result}, **result)


if __name__ == "__main__":
    main()
