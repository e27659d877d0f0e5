#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_gate
short_description: Tell whether a candidate vLLM server regressed against a reference, from interleaved rounds
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Measures a O(reference) and a O(candidate) server in rounds with the same workload as
    M(llmops.vllm.vllm_bench) (one concurrency level per side per round), the reference first in odd rounds and the
    candidate first in even ones, and weighs the rounds with a sequential test after each one from O(min_rounds) on.
    It stops at the first answer, at O(max_rounds), or when the next round would end past O(time_budget_s).
  - The answer is C(pass) (no regression of O(smallest_regression_percent) or more in any metric), C(regress) (one
    at least), or C(unknown) (the rounds spread too much to tell within the rounds or time allowed). False alarms
    happen at most O(false_alarm_rate) of the time over all the metrics, misses at most O(miss_rate) per metric.
    Rounds whose speed runs in spells of several rounds are worth fewer independent rounds, so the test estimates
    their lag-one correlation and weighs them as what they are worth; spells then widen the interval and ask for
    more rounds (or end in C(unknown)) rather than raise false alarms.
  - One round of each side gives one value per metric, so drift common to both sides within a round cancels in
    their ratio. Rounds of one server differ by up to a third, which is why a single benchmark against a saved
    result cannot gate a release.
  - With O(baseline) instead of O(reference), the candidate alone is measured and its round N is compared with the
    baseline's round N. Such a comparison is unpaired, and whatever changed since the baseline was measured (the
    machine, its load, its temperature) is not cancelled. The baseline names the GPU model, driver, vLLM release,
    catalog entry and workload it was measured with; a comparison across any of them is refused unless
    O(allow_baseline_mismatch), and then marked in RV(notes) and RV(sentence).
  - With neither, the candidate alone is measured for O(max_rounds) rounds, and RV(baseline) holds them to save.
    Baselines are recorded and compared on the candidate's own host, with O(candidate.instance).
  - With O(spread) from an earlier gate's RV(spread) (and O(seconds_per_round)), the module first plans the rounds
    and refuses settings that cannot be met, naming the setting to change, before any request.
  - A round in which any request fails fails the module, for a failure is no measure of speed.
extends_documentation_fragment:
  - llmops.vllm.records
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
    details: >-
      In check mode no request is sent; the options, records and plan are checked, and RV(msg) says what would
      run.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: The module never changes the servers; it reports C(changed=false).
options:
  candidate:
    description:
      - The server under test. Give O(candidate.instance) on the instance's host (its record gives the URL, the
        served name and the API key), or O(candidate.url) with O(candidate.model) and O(candidate.api_key).
    type: dict
    required: true
    suboptions:
      instance:
        description: An instance of this host by name; its record lies in O(config_dir).
        type: str
      url:
        description: The server's base URL, for example V(http://10.0.0.7:8000).
        type: str
      model:
        description: The served model name that the requests ask for; required with C(url).
        type: str
      api_key:
        description: Sent as C(Authorization Bearer) when set, with C(url); never logged.
        type: str
  reference:
    description:
      - The server to compare with, measured in the same rounds; the same model on the release or settings now in
        service, on a machine of the same kind. Given as O(candidate) is.
      - Mutually exclusive with O(baseline).
    type: dict
    suboptions:
      instance:
        description: An instance of this host by name; its record lies in O(config_dir).
        type: str
      url:
        description: The server's base URL, for example V(http://10.0.0.7:8000).
        type: str
      model:
        description: The served model name that the requests ask for; required with C(url).
        type: str
      api_key:
        description: Sent as C(Authorization Bearer) when set, with C(url); never logged.
        type: str
  baseline:
    description:
      - The RV(baseline) of an earlier run (its contents, or the path of its JSON file where the module runs) to
        compare the candidate with, unpaired.
    type: raw
  allow_baseline_mismatch:
    description:
      - Compare with a O(baseline) measured on another GPU model, driver, vLLM release, catalog entry or workload;
        the differences are listed in RV(notes) and open RV(sentence).
    type: bool
    default: false
  metrics:
    description:
      - The metrics to gate on, each a field of a M(llmops.vllm.vllm_bench) level. Throughputs regress when they fall,
        latencies (C(mean_), C(median_), C(pNN_) of C(ttft), C(tpot), C(itl), C(e2el), in ms) when they rise.
      - Each more metric shares the false-alarm rate, so the gate needs more rounds.
    type: list
    elements: str
    default: [output_throughput]
  smallest_regression_percent:
    description: The smallest worsening worth a rollback, in percent of the reference.
    type: float
    default: 10
  false_alarm_rate:
    description: The largest chance of answering C(regress) for a candidate no worse than the reference.
    type: float
    default: 0.05
  miss_rate:
    description:
      - The largest chance, per metric, of not answering C(regress) for a regression of O(smallest_regression_percent),
        half of it for a wrong C(pass), half for C(unknown) at O(max_rounds).
    type: float
    default: 0.05
  min_rounds:
    description: Rounds before the first answer (at least 3).
    type: int
    default: 5
  max_rounds:
    description: Rounds at most; the answer is C(unknown) when none came by then.
    type: int
    default: 40
  time_budget_s:
    description:
      - Seconds the rounds may take at most; no round starts that would end past them, as far as the rounds so far
        tell.
    type: float
    default: 1800
  spread:
    description:
      - The spread of the paired rounds that an earlier gate on such hosts measured (its RV(spread)). With it the
        rounds are planned first, and settings that cannot tell a regression of O(smallest_regression_percent) from
        none within O(max_rounds) (or, with O(seconds_per_round), within O(time_budget_s)) are refused.
    type: float
  seconds_per_round:
    description: The seconds of one round that an earlier gate measured (its RV(seconds_per_round)), for the plan.
    type: float
  serial_correlation:
    description:
      - The lag-one correlation of the rounds that an earlier gate on such hosts measured (its RV(serial_correlation)),
        from 0 to 0.9. The test never weighs the rounds as less correlated than this, and the plan counts with it.
        A correlation estimated from the first few rounds of a gate is often low by chance, and that is when spells
        raise false alarms.
      - Against a O(baseline), the saved rounds' own correlation counts too, where it is higher.
    type: float
    default: 0
  fail_on:
    description:
      - The answers that fail the task, with the whole result. V(unknown) is in by default, because an unknown
        answer could not rule out a regression of O(smallest_regression_percent).
    type: list
    elements: str
    choices: [regress, unknown]
    default: [regress, unknown]
  endpoint:
    description: The OpenAI API to call.
    type: str
    choices: [completions, chat]
    default: completions
  concurrency:
    description: Requests in flight per side and round.
    type: int
    default: 8
  num_requests:
    description: Requests per side and round. Mutually exclusive with O(duration).
    type: int
    default: 64
  duration:
    description: Seconds per side and round instead of a request count; requests in flight then finish and count.
    type: float
  input_len:
    description: Prompt length in tokens, as M(llmops.vllm.vllm_bench) takes it.
    type: int
    default: 128
  output_len:
    description: Tokens to generate per request.
    type: int
    default: 128
  ignore_eos:
    description: Ask the servers to ignore end-of-sequence, so that every request generates O(output_len) tokens.
    type: bool
    default: true
  tokenizer:
    description:
      - A model directory holding C(tokenizer.json), or the file, on the machine where the module runs; with the
        Python package C(tokenizers) there, prompts are random tokens of the model's vocabulary.
    type: path
  seed:
    description:
      - Seed of the prompts. Round N uses O(seed) + N, the same prompts for both sides, so no round finds the
        previous one's prompts in a server's prefix cache.
    type: int
    default: 0
  warmup_requests:
    description: Requests sent to each measured server before the first round, not measured.
    type: int
    default: 16
  request_timeout:
    description: Seconds one request may take; a slower one counts as failed.
    type: float
    default: 600
  validate_certs:
    description: Check the servers' TLS certificates (https URLs).
    type: bool
    default: true
seealso:
  - module: llmops.vllm.vllm_bench
"""

EXAMPLES = r"""
- name: Gate tiny on this host's new release against the old release's instance on a host of the same kind
  llmops.vllm.vllm_gate:
    reference:
      url: http://10.0.0.8:8000
      model: tiny
      api_key: "{{ reference_key }}"
    candidate:
      url: http://10.0.0.7:8000
      model: tiny
      api_key: "{{ candidate_key }}"
    metrics: [output_throughput, median_ttft_ms]
  delegate_to: localhost
  register: gate

- name: Record a baseline of the instance on its host, and keep it on the controller
  llmops.vllm.vllm_gate:
    candidate:
      instance: tiny
    max_rounds: 20
  register: recorded

- name: Save it
  ansible.builtin.copy:
    content: "{{ recorded.baseline | to_json }}"
    dest: "baselines/{{ inventory_hostname }}-tiny.json"
    mode: "0644"
  delegate_to: localhost

- name: Later, gate the new instance against that baseline, planned with the spread the last gate measured
  llmops.vllm.vllm_gate:
    candidate:
      instance: tiny-0.33.0
    baseline: "{{ lookup('ansible.builtin.file', 'baselines/' ~ inventory_hostname ~ '-tiny.json') | from_json }}"
    allow_baseline_mismatch: true  # the release differs, on purpose
    spread: "{{ gate.spread }}"
    seconds_per_round: "{{ gate.seconds_per_round }}"
"""

RETURN = r"""
decision:
  description: V(pass), V(regress) or V(unknown); null when only a baseline was recorded.
  returned: unless in check mode
  type: str
  sample: regress
finished:
  description: False when more rounds could still have decided (the time budget stopped them).
  returned: unless in check mode
  type: bool
  sample: true
mode:
  description: V(paired) (a reference measured in the same rounds), V(baseline) (against saved rounds) or V(record).
  returned: always
  type: str
  sample: paired
metrics:
  description:
    - Per metric, its answer, its change in percent of the reference with a two-sided interval at C(confidence)
      (C(interval_percent), null before two rounds), the rounds it used, the spread of its paired log ratios, their
      lag-one correlation (C(serial_correlation), 0 for independent rounds) and the independent rounds they are
      worth (C(effective_rounds)), and the values of each round (C(reference), C(candidate)).
  returned: unless in check mode
  type: list
  elements: dict
  sample:
    - name: output_throughput
      direction: higher
      decision: regress
      rounds: 5
      confidence: 0.95
      change_percent: -41.8
      interval_percent: [-47.0, -36.1]
      spread: 0.06
      serial_correlation: 0.0
      effective_rounds: 5.0
      reference: [2210.0, 2350.1, 2190.4, 2301.9, 2260.0]
      candidate: [1302.2, 1350.0, 1290.8, 1330.1, 1301.7]
      sentence: "output_throughput: regress after 5 of at most 40 rounds (...)"
rounds:
  description: Rounds measured.
  returned: unless in check mode
  type: int
  sample: 5
seconds:
  description: Seconds of the rounds in all, the warm-up left out.
  returned: unless in check mode
  type: float
  sample: 38.2
seconds_per_round:
  description: Seconds of one round on average (both sides in paired mode), for O(seconds_per_round) next time.
  returned: unless in check mode
  type: float
  sample: 7.6
spread:
  description:
    - The largest metric's spread of the paired log ratios (about the coefficient of variation of the ratio), for
      O(spread) next time; null before two rounds.
  returned: unless in check mode
  type: float
  sample: 0.061
serial_correlation:
  description:
    - The largest metric's lag-one correlation of the paired log ratios as the test weighed them (bias-corrected, at
      least O(serial_correlation)), for O(serial_correlation) next time; null before two rounds.
  returned: unless in check mode
  type: float
  sample: 0.0
stopped_by:
  description: V(decision), V(max_rounds) or V(time_budget).
  returned: unless in check mode
  type: str
  sample: decision
sentence:
  description: The answer in one sentence, with the error rates, each deciding metric's change and interval.
  returned: unless in check mode
  type: str
notes:
  description: What the answer rests on beyond paired rounds, such as a baseline measured with another vLLM release.
  returned: always
  type: list
  elements: str
plan:
  description:
    - With O(spread), the rounds expected with no change and with a regression, and the most rounds needed; their
      seconds with O(seconds_per_round).
  returned: with O(spread)
  type: dict
baseline:
  description:
    - The candidate's rounds with what they were measured on (C(environment) - C(gpu), C(driver), C(vllm_version),
      C(entry) - and C(workload)), to save and give as O(baseline) later.
  returned: when O(candidate.instance) is given, unless in check mode
  type: dict
msg:
  description: In check mode, what would run.
  returned: in check mode
  type: str
"""

import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.bench.error import BenchError
from ansible_collections.llmops.vllm.plugins.module_utils.bench.gate import GateSettings, plan_rounds
from ansible_collections.llmops.vllm.plugins.module_utils.bench.load_generator import Target, run_level
from ansible_collections.llmops.vllm.plugins.module_utils.bench.options import check_target, check_workload
from ansible_collections.llmops.vllm.plugins.module_utils.bench.rounds import (
    BASELINE,
    CANDIDATE,
    PAIRED,
    RECORD,
    REFERENCE,
    baseline_mismatches,
    baseline_of,
    baseline_rounds,
    environment_of,
    metric_directions,
    percentiles_of,
    round_order,
    run_rounds,
    summary_of,
)
from ansible_collections.llmops.vllm.plugins.module_utils.bench.workload import (
    load_tokenizer,
    measure_level,
    prompts_for,
    read_saved,
)
from ansible_collections.llmops.vllm.plugins.module_utils.gpu.nvidia import NoDriver, NvidiaError, open_backend
from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import (
    DEFAULT_CONFIG_DIR,
    RecordError,
    api_key,
    find,
)

try:
    import pynvml
except ImportError:
    pynvml = None

SIDE_OPTIONS = {
    "instance": {"type": "str"},
    "url": {"type": "str"},
    "model": {"type": "str"},
    "api_key": {"type": "str", "no_log": True},
}
SIDE_RULES = {
    "mutually_exclusive": [("instance", name) for name in ("url", "model", "api_key")],
    "required_one_of": [("instance", "url")],
    "required_by": {"url": "model"},
}
GATE_SETTINGS = ("smallest_regression_percent", "false_alarm_rate", "miss_rate", "min_rounds", "max_rounds")


def argument_spec():
    side = {"type": "dict", "options": SIDE_OPTIONS, **SIDE_RULES}
    return {
        "candidate": {**side, "required": True},
        "reference": side,
        "baseline": {"type": "raw"},
        "allow_baseline_mismatch": {"type": "bool", "default": False},
        "config_dir": {"type": "path", "default": DEFAULT_CONFIG_DIR},
        "metrics": {"type": "list", "elements": "str", "default": ["output_throughput"]},
        "smallest_regression_percent": {"type": "float", "default": 10},
        "false_alarm_rate": {"type": "float", "default": 0.05},
        "miss_rate": {"type": "float", "default": 0.05},
        "min_rounds": {"type": "int", "default": 5},
        "max_rounds": {"type": "int", "default": 40},
        "time_budget_s": {"type": "float", "default": 1800},
        "spread": {"type": "float"},
        "seconds_per_round": {"type": "float"},
        "serial_correlation": {"type": "float", "default": 0},
        "fail_on": {
            "type": "list",
            "elements": "str",
            "choices": ["regress", "unknown"],
            "default": ["regress", "unknown"],
        },
        "endpoint": {"type": "str", "choices": ["completions", "chat"], "default": "completions"},
        "concurrency": {"type": "int", "default": 8},
        "num_requests": {"type": "int", "default": 64},
        "duration": {"type": "float"},
        "input_len": {"type": "int", "default": 128},
        "output_len": {"type": "int", "default": 128},
        "ignore_eos": {"type": "bool", "default": True},
        "tokenizer": {"type": "path"},
        "seed": {"type": "int", "default": 0},
        "warmup_requests": {"type": "int", "default": 16},
        "request_timeout": {"type": "float", "default": 600},
        "validate_certs": {"type": "bool", "default": True},
    }


def check_params(params) -> tuple[GateSettings, dict]:
    """The gate's settings and the metrics' directions, every option checked before a record is read; BenchError."""
    try:
        settings = GateSettings(
            **{name: params[name] for name in GATE_SETTINGS}, least_correlation=params["serial_correlation"]
        )
    except ValueError as error:
        raise BenchError(str(error)) from None
    directions = metric_directions(params["metrics"])
    for side in (CANDIDATE, REFERENCE):
        if params[side] is not None:
            check_target(params[side], f"{side}.")
    check_workload({**params, "concurrency": [params["concurrency"]], "num_requests": params["num_requests"]})
    if params["time_budget_s"] <= 0:
        raise BenchError(f"time_budget_s must be more than 0 seconds, got {params['time_budget_s']:g}")
    if params["seconds_per_round"] is not None and params["spread"] is None:
        raise BenchError("seconds_per_round plans the rounds together with spread, the spread an earlier gate measured")
    return settings, directions


def resolve(side: dict, config_dir: str, module) -> tuple[dict, dict | None]:
    """(url, model, api_key) of a side, and its instance record when it was named by instance."""
    if side["instance"] is None:
        return {"url": side["url"], "model": side["model"], "api_key": side["api_key"]}, None
    record = find(config_dir, side["instance"])
    key = api_key(record)
    if key:
        module.no_log_values.add(key)
    return {"url": record["url"], "model": record["served_name"], "api_key": key}, record


def host_gpus(module, record) -> tuple[list, str]:
    """The names of the GPUs that the instance uses (all of the host's when its record names none) and the driver."""
    try:
        backend = open_backend("auto", pynvml, module.get_bin_path("nvidia-smi"), module.run_command)
    except NoDriver:
        return [], ""
    try:
        gpus = backend.gpus()
        driver = backend.versions()[0]
    finally:
        backend.close()
    used = set(record["gpus"])
    return [gpu.name for gpu in gpus if not used or gpu.index in used], driver


def workload_of(params, prompt_source: str) -> dict:
    return {
        "endpoint": params["endpoint"],
        "concurrency": params["concurrency"],
        "num_requests": None if params["duration"] else params["num_requests"],
        "duration": params["duration"],
        "input_len": params["input_len"],
        "output_len": params["output_len"],
        "ignore_eos": params["ignore_eos"],
        "prompt_source": prompt_source,
    }


def what_would_run(mode, params, settings, targets) -> str:
    size = f"{params['duration']:g} s" if params["duration"] else f"{params['num_requests']} requests"
    against = "nothing (recording a baseline)" if mode == RECORD else "the saved baseline"
    if mode == PAIRED:
        against = f"the reference {targets[REFERENCE]['model']} at {targets[REFERENCE]['url']}"
    rounds = f"{settings.min_rounds} to {settings.max_rounds} rounds"
    if mode == RECORD:
        rounds = f"{settings.max_rounds} rounds"
    return (
        f"check mode: would measure the candidate {targets[CANDIDATE]['model']} at {targets[CANDIDATE]['url']} against"
        f" {against}, {rounds} of {size} at concurrency {params['concurrency']} per side, within"
        f" {params['time_budget_s']:g} s; no request sent"
    )


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(),
        mutually_exclusive=[("reference", "baseline"), ("num_requests", "duration")],
        supports_check_mode=True,
    )
    params = module.params
    try:
        settings, directions = check_params(params)
    except BenchError as error:
        module.fail_json(msg=str(error))
    mode = PAIRED if params["reference"] else BASELINE if params["baseline"] is not None else RECORD
    if mode != PAIRED and params["candidate"]["instance"] is None:
        module.fail_json(
            msg=f"a baseline is {'compared' if mode == BASELINE else 'recorded'} on the candidate's own host, where"
            " its GPUs and record are read: give candidate.instance, or give a reference measured in the same rounds"
        )
    result = {"changed": False, "mode": mode, "notes": []}
    try:
        targets, records = {}, {}
        for side in (CANDIDATE, REFERENCE) if mode == PAIRED else (CANDIDATE,):
            targets[side], records[side] = resolve(params[side], params["config_dir"], module)
        environment = None
        if records[CANDIDATE] is not None:
            environment = environment_of(records[CANDIDATE], *host_gpus(module, records[CANDIDATE]))
        tokenizer = load_tokenizer(params["tokenizer"])
        workload = workload_of(params, "fixed" if tokenizer is None else "tokenizer")
        reference_rounds = None
        if mode == BASELINE:
            saved = read_saved(params["baseline"], "baseline")
            reference_rounds, settings = baseline_rounds(saved, directions, settings)
            if settings.least_correlation > params["serial_correlation"]:
                result["notes"].append(
                    f"the baseline's own rounds ran in spells (lag-one correlation {settings.least_correlation:.2f}):"
                    " the rounds are weighed as the fewer independent rounds they are worth"
                )
            mismatches = baseline_mismatches(saved, environment, workload)
            if mismatches and not params["allow_baseline_mismatch"]:
                raise BenchError(
                    f"the baseline was measured otherwise: {'; '.join(mismatches)}. Record a baseline on this"
                    " machine and release, or set allow_baseline_mismatch to compare across them, marked as such"
                )
            result["notes"].append("against a saved baseline, unpaired: drift since it was measured is not cancelled")
            if mismatches:
                result["notes"].append(f"compared across a different machine or workload ({'; '.join(mismatches)})")
        if params["spread"] is not None:
            result["plan"] = plan_rounds(
                params["spread"],
                settings,
                len(directions),
                params["seconds_per_round"],
                params["time_budget_s"] if params["seconds_per_round"] is not None else None,
            )
        clients = {
            side: Target.build(
                target["url"],
                params["endpoint"],
                target["model"],
                params["output_len"],
                api_key=target["api_key"],
                ignore_eos=params["ignore_eos"],
                validate_certs=params["validate_certs"],
            )
            for side, target in targets.items()
        }
    except (BenchError, RecordError, NvidiaError, ValueError) as error:
        module.fail_json(msg=str(error), **result)
    except Exception as error:  # a tokenizer file that tokenizers cannot read
        module.fail_json(
            msg=f"cannot load the tokenizer {params['tokenizer']}: {error}", exception=traceback.format_exc(), **result
        )
    if module.check_mode:
        module.exit_json(msg=what_would_run(mode, params, settings, targets), **result)

    percentiles = percentiles_of(list(directions))
    count = params["num_requests"]
    round_prompts = {}

    def prompts_of_round(round_number):
        # Both sides of a round get the same prompts; each round its own, past the previous one's prefix cache.
        if round_number not in round_prompts:
            round_prompts.clear()
            round_prompts[round_number] = prompts_for(
                tokenizer, count, params["input_len"], params["seed"] + round_number
            )
        return round_prompts[round_number]

    def measure(side, round_number):
        return measure_level(
            clients[side],
            prompts_of_round(round_number),
            params["concurrency"],
            params["request_timeout"],
            params["duration"],
            percentiles,
        )

    try:
        if params["warmup_requests"]:
            warmups = prompts_for(tokenizer, params["warmup_requests"], params["input_len"], params["seed"])
            for side in round_order(1, mode):
                run_level(clients[side], warmups, params["concurrency"], params["request_timeout"])
        run = run_rounds(measure, directions, settings, mode, reference_rounds, params["time_budget_s"])
    except BenchError as error:
        module.fail_json(msg=str(error), **result)
    result.update(summary_of(run, directions, settings, result["notes"]))
    if environment is not None:
        result["baseline"] = baseline_of(run, environment, workload)
    if result["decision"] in params["fail_on"]:
        module.fail_json(msg=result["sentence"], **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
