#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_bench_report
short_description: Write the reports of llmops.vllm.vllm_bench results (JSON, CSV, Markdown, PNG)
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Writes, into O(dest), per host C(HOST.json) (the saved result, which M(llmops.vllm.vllm_bench) reads back as
    a baseline) and C(HOST.md) (its table), and for all hosts together C(levels.csv) (every field of every level),
    C(fleet.md) (host x concurrency) and C(bench.png) (output throughput and median latency against concurrency).
  - Meant for the controller (C(delegate_to localhost), C(run_once)), whose Python has matplotlib for the plot
    (the collection's requirements.txt); the hosts need nothing.
  - A file is rewritten only when its content changes.
extends_documentation_fragment:
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  results:
    description: Host name to that host's M(llmops.vllm.vllm_bench) result (or its C(vllm_bench) fact).
    type: dict
    required: true
  dest:
    description: Directory of the reports; created when missing.
    type: path
    required: true
  formats:
    description: Which reports to write.
    type: list
    elements: str
    choices: [json, csv, markdown, png]
    default: [json, csv, markdown, png]
"""

EXAMPLES = r"""
- name: Reports of every host of the play, on the controller
  llmops.vllm.vllm_bench_report:
    results: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'vllm_bench_result'))) }}"
    dest: "{{ lookup('ansible.builtin.env', 'PWD') }}/bench-results/tiny"
  delegate_to: localhost
  run_once: true
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
  register: report

- name: Show the fleet table
  ansible.builtin.debug:
    msg: "{{ report.table.splitlines() }}"
  run_once: true
"""

RETURN = r"""
files:
  description: The report files, written or already up to date.
  returned: always
  type: list
  elements: str
  sample:
    - /srv/bench/tiny/gpu1.json
    - /srv/bench/tiny/gpu1.md
    - /srv/bench/tiny/levels.csv
    - /srv/bench/tiny/fleet.md
    - /srv/bench/tiny/bench.png
written:
  description: The files that were (or in check mode would be) written because their content changed.
  returned: always
  type: list
  elements: str
  sample: [/srv/bench/tiny/fleet.md]
table:
  description: The fleet table (host x concurrency) in Markdown.
  returned: always
  type: str
  sample: "| host | C=1 | C=8 |\n|---|---:|---:|\n| gpu1 | 61 tok/s, TTFT 80 ms | 410 tok/s, TTFT 95 ms |\n"
"""

import os
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.llmops.vllm.plugins.module_utils.bench.report import (
    fleet_markdown,
    host_markdown,
    levels_csv,
    plot_png,
    result_json,
)
from ansible_collections.llmops.vllm.plugins.module_utils.common.file_writer import (
    check_file_name,
    directory_problem,
    write_if_changed,
)

try:
    import matplotlib  # noqa: F401  pylint: disable=unused-import
except ImportError:
    MATPLOTLIB_IMPORT_ERROR = traceback.format_exc()
else:
    MATPLOTLIB_IMPORT_ERROR = None


def reports(results, formats):
    """(file name, content) of every report asked for."""
    files = []
    for host, result in sorted(results.items()):
        if "json" in formats:
            files.append((f"{host}.json", result_json(result)))
        if "markdown" in formats:
            files.append((f"{host}.md", host_markdown(host, result)))
    if "csv" in formats:
        files.append(("levels.csv", levels_csv(results)))
    if "markdown" in formats:
        files.append(("fleet.md", fleet_markdown(results)))
    if "png" in formats:
        files.append(("bench.png", plot_png(results)))
    return files


# What the reports read: of each result's summary, and of each of its levels (numbers).
SUMMARY_FIELDS = ("model", "endpoint", "input_len", "output_len", "prompt_source")
LEVEL_FIELDS = ("max_concurrency", "output_throughput", "median_ttft_ms", "median_tpot_ms", "failed")


def result_problem(host, result):
    """Why one host's result cannot be reported, or None."""
    if not isinstance(result, dict) or not isinstance(result.get("levels"), list) or not result["levels"]:
        return f"{host} has no list of levels"
    summary = result.get("summary")
    if not isinstance(summary, dict) or any(field not in summary for field in SUMMARY_FIELDS):
        return f"{host} has no summary with {', '.join(SUMMARY_FIELDS)}"
    for position, level in enumerate(result["levels"]):
        missing = [
            field
            for field in LEVEL_FIELDS
            if not isinstance(level, dict)
            or isinstance(level.get(field), bool)
            or not isinstance(level.get(field), (int, float))
        ]
        if missing:
            return f"{host}'s level {position + 1} lacks the numbers {', '.join(missing)}"
    return None


def main():
    module = AnsibleModule(
        argument_spec={
            "results": {"type": "dict", "required": True},
            "dest": {"type": "path", "required": True},
            "formats": {
                "type": "list",
                "elements": "str",
                "choices": ["json", "csv", "markdown", "png"],
                "default": ["json", "csv", "markdown", "png"],
            },
        },
        supports_check_mode=True,
    )
    results, dest, formats = module.params["results"], module.params["dest"], module.params["formats"]
    problems = [
        problem for host, result in sorted(results.items()) for problem in [result_problem(host, result)] if problem
    ]
    for host in sorted(results):
        try:
            check_file_name(host, "each host of results")
        except ValueError as error:
            problems.append(str(error))
    if not results or problems:
        module.fail_json(
            msg="results must map each host to its vllm_bench result (with summary and levels); "
            + ("; ".join(problems) if problems else "it is empty")
        )
    problem = directory_problem(dest, "dest")
    if problem:
        module.fail_json(msg=problem)
    if "png" in formats and MATPLOTLIB_IMPORT_ERROR:
        module.fail_json(
            msg=missing_required_lib("matplotlib")
            + " Run this module on the controller with the collection's requirements.txt installed,"
            " or leave png out of formats.",
            exception=MATPLOTLIB_IMPORT_ERROR,
        )
    table = fleet_markdown(results)
    if not module.check_mode:
        os.makedirs(dest, exist_ok=True)
    files, written = [], []
    for name, content in reports(results, formats):
        path = os.path.join(dest, name)
        files.append(path)
        if write_if_changed(module, path, content):
            written.append(path)
    module.exit_json(changed=bool(written), files=files, written=written, table=table)


if __name__ == "__main__":
    main()
