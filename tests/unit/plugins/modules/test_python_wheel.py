"""python_wheel on this machine: a wheel written, installed by uv into a real venv, imported, and removed again."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.llmops.vllm.plugins.modules import python_wheel

UV = Path(sys.executable).with_name("uv")
PLUGIN = "def register():\n    return 'registered'\n"


@pytest.fixture
def run(run_module):
    return lambda args, fails=False: run_module(python_wheel.main, args, fails)


def wheel_args(dest, **changes):
    return {
        "dest": str(dest),
        "name": "demo-helpers",
        "version": "1+abc123",
        "files": {"demo_helpers.py": PLUGIN, "demo_helpers_path.pth": "import demo_helpers\n"},
        "entry_points": {"vllm.general_plugins": {"demo": "demo_helpers:register"}},
        "summary": "A wheel of the tests",
        **changes,
    }


def in_venv(venv, code):
    found = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(found.stdout)


def test_the_wheel_installs_with_uv_and_the_venv_knows_its_files(run, tmp_path):
    result = run(wheel_args(tmp_path / "wheels"))
    assert result["changed"] is True
    assert result["path"] == str(tmp_path / "wheels" / "demo_helpers-1+abc123-py3-none-any.whl")
    venv = tmp_path / "venv"
    subprocess.run([str(UV), "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    install = [str(UV), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), "--no-index"]
    subprocess.run([*install, f"--find-links={tmp_path / 'wheels'}", "demo-helpers==1+abc123"], check=True)
    found = in_venv(
        venv,
        "import json, sys, importlib.metadata as m\n"
        "dist = m.distribution('demo-helpers')\n"
        "point, = m.entry_points(group='vllm.general_plugins')\n"
        "print(json.dumps({'version': dist.version, 'files': sorted(str(f) for f in dist.files),\n"
        "    'plugin': point.load()(), 'imported_by_pth': 'demo_helpers' in sys.modules}))",
    )
    assert found["version"] == "1+abc123" and found["plugin"] == "registered" and found["imported_by_pth"]
    # The installer recorded every file, so that it removes them all.
    assert {"demo_helpers.py", "demo_helpers_path.pth", "demo_helpers-1+abc123.dist-info/entry_points.txt"} <= set(
        found["files"]
    )
    subprocess.run(
        [str(UV), "pip", "uninstall", "--quiet", "--python", str(venv / "bin" / "python"), "demo-helpers"], check=True
    )
    assert not list(venv.glob("lib/python*/site-packages/demo_helpers*"))


def test_an_unchanged_wheel_is_not_written_again_and_a_change_is(run, tmp_path):
    first = run(wheel_args(tmp_path))
    written = Path(first["path"]).read_bytes()
    assert run(wheel_args(tmp_path))["changed"] is False
    changed = run(wheel_args(tmp_path, files={"demo_helpers.py": PLUGIN + "# newer\n"}))
    assert changed["changed"] is True and Path(changed["path"]).read_bytes() != written


def test_a_wheel_of_metadata_alone_registers_a_name(run, tmp_path):
    result = run({"dest": str(tmp_path), "name": "vllm", "version": "0.32.0+cpu"})
    assert Path(result["path"]).name == "vllm-0.32.0+cpu-py3-none-any.whl"


def test_check_mode_writes_nothing(run, tmp_path):
    dest = tmp_path / "new" / "wheels"
    assert run({**wheel_args(dest), "_ansible_check_mode": True})["changed"] is True
    assert not dest.exists()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "demo helpers"}, "name must be a distribution name"),
        ({"version": "latest"}, "version must be a release with an optional local label"),
        ({"files": {"../escape.py": ""}}, "files: '../escape.py' is not a relative path inside the wheel"),
        ({"files": {"x-1.dist-info/RECORD": ""}}, "is under a .dist-info directory, which the wheel writes itself"),
        ({"entry_points": {"vllm.general_plugins": {"demo": "not a reference"}}}, "is not NAME = module:callable"),
    ],
)
def test_bad_input_fails_and_writes_nothing(run, tmp_path, changes, message):
    result = run(wheel_args(tmp_path / "wheels", **changes), fails=True)
    assert message in result["msg"]
    assert not (tmp_path / "wheels").exists()


def test_a_dest_under_a_file_is_named(run, tmp_path):
    (tmp_path / "plain").write_text("")
    result = run(wheel_args(tmp_path / "plain" / "wheels"), fails=True)
    assert "dest" in result["msg"] and "is a file, not a directory" in result["msg"]
