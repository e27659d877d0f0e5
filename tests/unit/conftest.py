"""promtool, for the tests of the alert rules, the dashboard's queries and the group guard's metrics.

It comes from Debian's prometheus package, the release that the vllm_prometheus role installs; `make venv` unpacks it
under .build (and the Makefile names it in PROMTOOL), where the tests find it however pytest is started.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def promtool() -> str:
    unpacked = Path(__file__).resolve().parents[2] / ".build" / "prometheus" / "usr" / "bin" / "promtool"
    path = os.environ.get("PROMTOOL") or (str(unpacked) if unpacked.exists() else shutil.which("promtool"))
    if not path or not Path(path).exists():
        pytest.fail("promtool is missing: `make venv` unpacks it from Debian's prometheus package under .build")
    return path
