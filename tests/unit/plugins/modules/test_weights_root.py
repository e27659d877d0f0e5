"""weights_root on this machine: a real directory made, read and given its owner and mode."""

import os
import stat
import sys

import pytest

from ansible_collections.llmops.vllm.plugins.modules import weights_root


@pytest.fixture
def run(run_module):
    return lambda args, fails=False: run_module(weights_root.main, args, fails)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.skipif(os.getuid() != 0, reason="giving the root to root needs root")
def test_makes_the_root_with_its_parents_then_changes_nothing(run, tmp_path):
    root = tmp_path / "var" / "models"
    first = run({"root": str(root), "python": sys.executable})
    assert first["changed"] is True and first["changes"] == ["created", "owner", "mode"]
    assert first["python_exists"] is True
    assert mode(root) == 0o755 and (os.stat(root).st_uid, os.stat(root).st_gid) == (0, 0)
    second = run({"root": str(root), "python": sys.executable})
    assert second["changed"] is False and second["changes"] == []
    root.chmod(0o700)
    assert run({"root": str(root)})["changes"] == ["mode"]
    assert mode(root) == 0o755


def test_check_mode_predicts_the_root_and_makes_nothing(run, tmp_path):
    root = tmp_path / "models"
    result = run({"root": str(root), "python": str(tmp_path / "no-venv" / "python"), "_ansible_check_mode": True})
    assert result["changed"] is True and result["changes"] == ["created", "owner", "mode"]
    assert result["python_exists"] is False
    assert not root.exists()


def test_a_missing_interpreter_that_is_required_fails_before_the_root_is_made(run, tmp_path):
    root, python = tmp_path / "models", tmp_path / "no-venv" / "python"
    result = run({"root": str(root), "python": str(python), "require_python": True}, fails=True)
    assert result["msg"] == (
        f"{python} does not exist; it writes generated models (install vLLM first with llmops.vllm.vllm_install, "
        "or set vllm_weights_python)"
    )
    assert not root.exists()


def test_a_root_that_is_a_file_fails(run, tmp_path):
    root = tmp_path / "models"
    root.write_text("")
    result = run({"root": str(root)}, fails=True)
    assert result["msg"] == f"the weights root {root} exists and is not a directory: move it away, or choose another"
