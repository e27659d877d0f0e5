"""The vLLM plugin that the install role puts into the CPU build's venv (roles/vllm_install/files).

The cause it removes is shown at the instruction level: in a fresh process, an AMX instruction before the
plugin's request is an illegal instruction; after it, it runs. Skipped where the CPU has no AMX.
"""

import importlib.util
import logging
import signal
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[3] / "roles" / "vllm_install" / "files" / "llmops_vllm_cpu_amx.py"
SPEC = importlib.util.spec_from_file_location("llmops_vllm_cpu_amx", PLUGIN)
plugin = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(plugin)

# ldtilecfg (%rdi); tilezero %tmm0; tilerelease; ret: the smallest use of AMX tile data, run from Python.
AMX_PROGRAM = f"""
import ctypes, mmap, sys
sys.path.insert(0, {str(PLUGIN.parent)!r})
import llmops_vllm_cpu_amx
if sys.argv[1] == "request":
    assert llmops_vllm_cpu_amx.request_amx_permission()
code = bytes.fromhex("c4e2784907" "c4e27b49c0" "c4e27849c0" "c3")
page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
config = (ctypes.c_ubyte * 64)()
config[0], config[16], config[48] = 1, 64, 16  # palette 1; tile 0: 64 bytes a row, 16 rows
address = ctypes.addressof(ctypes.c_char.from_buffer(page))
ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)(ctypes.addressof(config))
print("AMX ran")
"""

needs_amx = pytest.mark.skipif(not plugin.has_amx(), reason="this CPU has no AMX (amx_tile)")


def run_amx(mode):
    command = [sys.executable, "-c", AMX_PROGRAM, mode]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


@needs_amx
def test_amx_without_the_request_is_an_illegal_instruction():
    assert run_amx("no-request").returncode == -signal.SIGILL


@needs_amx
def test_amx_runs_once_the_plugin_has_asked():
    proc = run_amx("request")
    assert (proc.returncode, proc.stdout) == (0, "AMX ran\n"), proc.stderr


@pytest.mark.parametrize(
    ("flags", "amx"),
    [
        ("fpu avx avx2 bmi2", False),  # AVX2 alone (an AMD EPYC seen here)
        ("fpu avx2 avx512f avx512bw avx512vl", False),  # AVX-512
        ("fpu avx2 avx512f avx512bw avx512vl avx512_bf16", False),  # AVX-512 with BF16
        ("fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", True),  # AMX
    ],
)
def test_has_amx_reads_the_flags_of_cpuinfo_at_each_isa_level(tmp_path, flags, amx):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    assert plugin.has_amx(str(cpuinfo)) is amx


def test_a_missing_cpuinfo_has_no_amx(tmp_path):
    assert not plugin.has_amx(str(tmp_path / "absent"))


def test_without_amx_the_plugin_asks_for_nothing_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(plugin, "has_amx", lambda: False)
    caplog.set_level(logging.INFO, logger="vllm")
    assert plugin.request_amx_permission() is False
    assert caplog.messages == ["llmops.vllm: this CPU has no AMX; no AMX permission to ask for (harmless)"]
