"""vllm_import_check: the module around the import check, against a stand-in of vLLM in a venv."""

import signal

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.install.cpu_isa import read_isa_level
from ansible_collections.llmops.vllm.plugins.modules import vllm_import_check

PINNED = {"version": "0.32.0", "device": "cpu", "plugins": ["llmops_amx_permission"]}


@pytest.fixture
def run(run_module):
    return lambda args, fails=False: run_module(vllm_import_check.main, args, fails)


def test_a_venv_whose_ops_load_passes_and_says_what_loaded(run, fake_vllm_venv):
    result = run({"venv": fake_vllm_venv(), **PINNED})
    assert result["changed"] is False
    assert result["libraries"] == ["vllm/_C_AVX2.abi3.so"] and result["device"] == "cpu"
    assert result["plugins"] == {"llmops_amx_permission": False}
    assert result["isa"] == read_isa_level()


def test_ops_that_do_not_load_fail_with_vllms_own_words(run, fake_vllm_venv):
    said = "Failed to import from vllm._C_AVX2: ImportError('libnuma.so.1: cannot open shared object file')"
    venv = fake_vllm_venv(registers=False, warning=said)
    result = run({"venv": venv, **PINNED}, fails=True)
    assert result["msg"] == f"vLLM in {venv} (this CPU: {read_isa_level()}): vLLM's native ops did not load ({said})"
    assert result["warnings_logged"] == [said]


def test_an_import_that_dies_names_the_signal(run, fake_vllm_venv):
    venv = fake_vllm_venv(signal=int(signal.SIGILL))
    result = run({"venv": venv, **PINNED}, fails=True)
    assert result["rc"] == -signal.SIGILL
    where = f"vLLM in {venv} (this CPU: {read_isa_level()})"
    assert result["msg"].startswith(f"{where}: importing vLLM's native ops was killed by SIGILL")


def test_another_release_or_device_fails(run, fake_vllm_venv):
    result = run({"venv": fake_vllm_venv(version="0.31.0+cpu"), **PINNED, "device": "cuda"}, fails=True)
    assert result["msg"].endswith(
        "vLLM is 0.31.0+cpu, not the pinned 0.32.0; vLLM chose the device 'cpu' on this host, not 'cuda'"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"venv": "venv", **PINNED}, "venv must be an absolute directory, got 'venv'"),
        ({"venv": "/opt/vllm/venv", **PINNED, "version": "latest"}, "version must be a release X.Y.Z, got 'latest'"),
        (
            {"venv": "/opt/vllm/venv", **PINNED, "modules": ["llmops_vllm_dev_guard", "os; rm"]},
            "modules must be Python module names such as pkg.mod, got ['os; rm']",
        ),
        (
            {"venv": "/opt/vllm/venv", **PINNED, "plugins": [""]},
            "plugins must be entry point names, without spaces, got ['']",
        ),
    ],
)
def test_bad_input_is_refused_before_anything_runs(run, args, message):
    assert run(args, fails=True)["msg"] == message


def test_a_venv_without_an_interpreter_is_named(run, tmp_path):
    result = run({"venv": str(tmp_path), **PINNED}, fails=True)
    assert result["msg"] == f"{tmp_path} has no interpreter ({tmp_path}/bin/python): vLLM is not installed there"
