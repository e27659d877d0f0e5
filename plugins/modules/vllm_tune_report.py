#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_tune_report
short_description: Choose a tune's winner and write its report (Markdown, SVG plot, JSON)
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Chooses the winner of a tune of one host, the measured candidate with the highest output throughput under the
    objective (at one concurrency, or at the highest concurrency that meets an SLO).
  - Writes into O(dest) C(HOST.json) (everything, and what a resumed tune reads back to skip what it measured),
    C(HOST.md) (one table - candidate, verdict, load time, output tok/s and median TTFT per level, SLO met - the
    winner and where the time went) and C(HOST.svg) (output throughput against median TTFT, one line per candidate
    through its levels, the Pareto front ringed and joined).
  - Meant for the controller (C(delegate_to localhost)); it needs nothing but Python. A file is rewritten only when
    its content changes.
extends_documentation_fragment:
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
    details: In check mode nothing is written; the winner and the table are returned.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  dest:
    description: Directory of the reports, an absolute path; created when missing.
    type: path
    required: true
  host:
    description: The tuned host's name; the files are named after it, so it has no C(/).
    type: str
    required: true
  model:
    description: The catalog name of the tuned model.
    type: str
    required: true
  instance:
    description: The tuned instance.
    type: str
    required: true
  workload:
    description: The benchmark's workload (C(concurrency), C(num_requests), C(input_len), C(output_len), C(endpoint)).
    type: dict
    required: true
  concurrency:
    description: Score the candidates at this concurrency level; 0 takes the highest level. Not with O(slo).
    type: int
    default: 0
  slo:
    description:
      - Latency limits in ms, as the levels name them (C(median_ttft_ms), C(p99_itl_ms), ...). A candidate's score is
        its output throughput at the highest concurrency whose levels meet them all.
    type: dict
    default: {}
  candidates:
    description:
      - One per candidate, in the order they ran, with C(name), C(key), C(layout_name), C(layout), C(settings),
        C(verdict) (C(measured), C(failed), C(refused) or C(skipped)), C(reason), C(load_s), C(bench_s), C(levels)
        (the figures of M(llmops.vllm.vllm_bench)'s levels) and C(resumed) (measured by an earlier run).
    type: list
    elements: dict
    required: true
  runs:
    description: The timings of each run of this tune (C(started), C(total_s), C(loads_s), C(benchmarks_s), C(stops_s),
      C(measured), C(resumed)), the last one the current run.
    type: list
    elements: dict
    default: []
  state:
    description:
      - Where the tune stands, kept for a resumed run; C(in_progress) (the tuned instance may be stopped) and
        C(serving) (whether it served before the tune began).
    type: dict
    default: {}
  applied:
    description: What was kept on the host and written for the next deploy, when the winner was applied.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Write the tune's report on the controller
  llmops.vllm.vllm_tune_report:
    dest: "{{ lookup('ansible.builtin.env', 'PWD') }}/tune-results/tiny"
    host: "{{ inventory_hostname }}"
    model: tiny
    instance: tiny
    workload: {concurrency: [1, 4], num_requests: 8, input_len: 32, output_len: 32, endpoint: completions}
    slo: {median_ttft_ms: 500, p99_itl_ms: 50}
    candidates: "{{ tune_results }}"
  delegate_to: localhost
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
  register: report
"""

RETURN = r"""
winner:
  description: The winner's C(name) and C(key), the C(level) it was scored at, its C(output_throughput), and C(reason);
    C(name) is null when no candidate counts.
  returned: always
  type: dict
  sample: {"name": "default max_num_seqs=16", "key": "3f1c0a9e2b7d4c11", "level": 4, "output_throughput": 812.5,
           "reason": "default max_num_seqs=16: 812 output tok/s at C=4, the highest output throughput"}
table:
  description: The Markdown report, as written to C(HOST.md).
  returned: always
  type: str
time:
  description: The current run's time in seconds, split into C(loads_s), C(benchmarks_s), C(stops_s) and
    C(overhead_s) (the collection's own part), with C(total_s).
  returned: always
  type: dict
files:
  description: The files of the report.
  returned: always
  type: list
  elements: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.common.file_writer import (
    check_file_name,
    directory_problem,
    write_if_changed,
)
from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import check_instance_name
from ansible_collections.llmops.vllm.plugins.module_utils.tune.candidates import TuneError
from ansible_collections.llmops.vllm.plugins.module_utils.tune.ledger import time_split
from ansible_collections.llmops.vllm.plugins.module_utils.tune.report import markdown, svg
from ansible_collections.llmops.vllm.plugins.module_utils.tune.winner import check_objective, winner


def main():
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "host": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "instance": {"type": "str", "required": True},
            "workload": {"type": "dict", "required": True},
            "concurrency": {"type": "int", "default": 0},
            "slo": {"type": "dict", "default": {}},
            "candidates": {"type": "list", "elements": "dict", "required": True},
            "runs": {"type": "list", "elements": "dict", "default": []},
            "state": {"type": "dict", "default": {}},
            "applied": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        problem = directory_problem(params["dest"], "dest")
        if problem:
            raise ValueError(problem)
        check_file_name(params["host"], "host")
        check_instance_name(params["instance"])
    except ValueError as error:  # RecordError included
        module.fail_json(msg=str(error))
    try:
        check_objective(params["concurrency"], params["slo"], params["workload"].get("concurrency"))
        report = {
            "model": params["model"],
            "host": params["host"],
            "instance": params["instance"],
            "workload": params["workload"],
            "objective": {"concurrency": params["concurrency"], "slo": params["slo"]},
            "candidates": params["candidates"],
            "winner": winner(params["candidates"], params["concurrency"], params["slo"]),
            "runs": [{**run, **time_split(run)} for run in params["runs"]],
            "state": params["state"],
            "applied": params["applied"],
        }
        table = markdown(report)
        plot = svg(report)
    except (TuneError, KeyError, TypeError) as error:
        module.fail_json(msg=f"cannot write the tune's report: {error}")
    if not module.check_mode:
        os.makedirs(params["dest"], exist_ok=True)
    base = os.path.join(params["dest"], params["host"])
    contents = {f"{base}.json": json.dumps(report, indent=2, sort_keys=True) + "\n", f"{base}.md": table,
                f"{base}.svg": plot}  # fmt: skip
    changed = [write_if_changed(module, path, content) for path, content in contents.items()]
    module.exit_json(
        changed=any(changed),
        winner=report["winner"],
        table=table,
        time=report["runs"][-1] if report["runs"] else time_split({}),
        files=list(contents),
    )


if __name__ == "__main__":
    main()
