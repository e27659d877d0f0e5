"""The middlewares of roles/vllm_install/files/llmops_vllm_dev_guard.py, which every server runs, and a driver that
calls one as uvicorn calls an ASGI app: a scope with the client's address, and the messages it sends back."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

GUARD = Path(__file__).resolve().parents[3] / "roles" / "vllm_install" / "files" / "llmops_vllm_dev_guard.py"


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
