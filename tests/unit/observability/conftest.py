"""promtool for the tests of the alert rules and the dashboard's queries.

It comes from Debian's prometheus package, the release that the vllm_prometheus role installs; `make unit` unpacks it
under .build and names it in PROMTOOL.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def promtool() -> str:
    path = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not path or not Path(path).exists():
        pytest.fail("promtool is missing: `make unit` unpacks it from Debian's prometheus package and sets PROMTOOL")
    return path
