# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every task's result and duration of a playbook run, as JSON in the file $LLMOPS_RUN_RECORD, for run.py.

ansible-core alone has no JSON callback (ansible.posix has it, and the GPU host carries ansible-core alone): this
one writes the same shape as ansible.posix.json ({plays: [{play, tasks: [{task: {name, id, duration}, hosts}]}],
stats}) beside the default output, which stays on stdout for the log.
"""

from __future__ import annotations

import datetime
import json
import os

from ansible.parsing.ajson import AnsibleJSONEncoder
from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: run_record
    type: aggregate
    short_description: each task's result and duration, as JSON in the file $LLMOPS_RUN_RECORD
    description: For benchmarks/gpu_host/run.py, which splits a run's time by task.
    requirements: [enable in configuration]
"""


def _now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "run_record"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None):
        super().__init__(display)
        self.plays = []
        self.running = {}

    def v2_playbook_on_play_start(self, play):
        self.plays.append({"play": {"name": play.get_name()}, "tasks": []})

    def v2_runner_on_start(self, host, task):
        entry = {"task": {"name": task.get_name(), "id": str(task._uuid), "duration": {"start": _now()}}, "hosts": {}}
        self.running[(host.get_name(), task._uuid)] = entry
        self.plays[-1]["tasks"].append(entry)

    def _record(self, result, **status):
        host, task = result._host, result._task
        entry = self.running.pop((host.get_name(), task._uuid), None)
        if entry is None:  # a result without a start (an include's): a task of its own
            entry = {
                "task": {"name": task.get_name(), "id": str(task._uuid), "duration": {"start": _now()}},
                "hosts": {},
            }
            self.plays[-1]["tasks"].append(entry)
        entry["hosts"][host.get_name()] = dict(result._result, action=task.action, **status)
        entry["task"]["duration"]["end"] = _now()

    def v2_runner_on_ok(self, result):
        self._record(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, failed=True, ignored=ignore_errors)

    def v2_runner_on_skipped(self, result):
        self._record(result, skipped=True)

    def v2_runner_on_unreachable(self, result):
        self._record(result, unreachable=True)

    def v2_playbook_on_stats(self, stats):
        summary = {host: stats.summarize(host) for host in sorted(stats.processed)}
        with open(os.environ["LLMOPS_RUN_RECORD"], "w", encoding="utf-8") as stream:
            json.dump({"plays": self.plays, "stats": summary}, stream, cls=AnsibleJSONEncoder, sort_keys=True)
