"""Fixtures shared by the tests of module_utils and of modules."""

import subprocess
import sys

import pytest


@pytest.fixture
def idle_process():
    """A real process that sleeps, standing for one that holds a GPU: /proc describes it like any other."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "gpu-holder"])
    yield child
    child.kill()
    child.wait()
