"""Fixtures of the roles' tests: a role's tasks run for real with ansible-playbook on this machine (connection local,
check mode), and the middlewares of roles/vllm_install/files/llmops_vllm_dev_guard.py, which every server runs, with a
driver that calls one as uvicorn calls an ASGI app: a scope with the client's address, and the messages it sends back.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
GUARD = ROOT / "roles" / "vllm_install" / "files" / "llmops_vllm_dev_guard.py"


@pytest.fixture
def run_role_tasks(tmp_path):
    """run(role, tasks_from, variables, extra_vars=None) -> (rc, [msg of each failed task]), in check mode.

    `variables` are play vars; `extra_vars` go on the command line, above the facts a module sets (to stand in
    for a GPU host's facts on this machine, say).
    """

    def run(role, tasks_from, variables, extra_vars=None):
        playbook = tmp_path / "play.yml"
        task = {"ansible.builtin.import_role": {"name": f"llmops.vllm.{role}", "tasks_from": tasks_from}}
        play = {"hosts": "localhost", "connection": "local", "gather_facts": False, "vars": variables, "tasks": [task]}
        playbook.write_text(yaml.safe_dump([play]))
        command = [Path(sys.executable).with_name("ansible-playbook"), "--check", str(playbook)]
        if extra_vars:
            command += ["-e", json.dumps(extra_vars)]
        environment = os.environ | {
            "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".build" / "collections"),
            "ANSIBLE_STDOUT_CALLBACK": "json",
            "ANSIBLE_LOCALHOST_WARNING": "false",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
            "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
        }
        result = subprocess.run(
            command, capture_output=True, text=True, env=environment, cwd=tmp_path, timeout=120, check=False
        )
        report = json.loads(result.stdout)
        failures = [
            host_result.get("msg", "")
            for play in report["plays"]
            for task in play["tasks"]
            for host_result in task["hosts"].values()
            if host_result.get("failed")
        ]
        return result.returncode, failures

    return run


@pytest.fixture(scope="session")
def guard():
    spec = importlib.util.spec_from_file_location("llmops_vllm_dev_guard", GUARD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def drive():
    def drive(wrap, scope: dict) -> tuple[list, list]:
        """(the paths the app behind saw, the messages sent to the client) for one request through `wrap(app)`."""
        reached, sent = [], []

        async def app(scope, receive, send):
            reached.append(scope["path"])
            await send({"type": "http.response.start", "status": 200, "headers": []})

        async def send(message):
            sent.append(message)

        async def receive():
            return {"type": "http.request"}

        asyncio.run(wrap(app)(scope, receive, send))
        return reached, sent

    return drive
