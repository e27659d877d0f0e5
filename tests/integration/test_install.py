"""vllm_install's check of vLLM's native ops, on the real CPU build in the local host's venv: on this machine's CPU,
and on an AVX2 CPU that qemu-user emulates, so that the AVX2 library is covered wherever the suite runs.

qemu-user's TCG has AVX2 but no AVX-512: `-cpu Haswell` runs the venv's interpreter as a CPU with AVX2 alone would.
`import vllm._C` (the AVX-512 library) dies there of SIGILL, as it did on a real AMD EPYC with AVX2 alone.
"""

from __future__ import annotations

import shutil
import signal

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.install.cpu_isa import (
    AVX2,
    CPU_KERNEL_LIBRARY,
    read_isa_level,
)

from .conftest import LocalHost

VENV = "/opt/vllm/venv"
VERSION = "0.32.0"
EMULATED_VENV = "/opt/avx2-emulated"
EMULATOR = "qemu-x86_64-static"


def check(host: LocalHost, venv: str) -> dict:
    return host.module(
        "llmops.vllm.vllm_import_check", venv=venv, version=VERSION, device="cpu", plugins=["llmops_amx_permission"]
    )


def test_the_check_finds_the_library_this_cpu_loads(deployed):
    result = check(deployed, VENV)
    assert not result.get("failed"), result
    level = read_isa_level()  # the container shares this machine's CPU
    assert result["isa"] == level
    assert result["libraries"] == [f"vllm/{CPU_KERNEL_LIBRARY[level]}"]
    # The AMX plugin asks only where the CPU has AMX, and says what it did.
    assert result["plugins"] == {"llmops_amx_permission": level == "AMX"}


@pytest.fixture(scope="module")
def emulated_avx2(deployed):
    """A venv directory on the host whose interpreter is the real venv's, run by qemu-user as a Haswell CPU."""
    emulator = shutil.which(EMULATOR)
    assert emulator, f"{EMULATOR} is missing: apt-get install qemu-user-static (make integration installs it)"
    deployed.copy_in(emulator, f"/usr/local/bin/{EMULATOR}")
    deployed.sh(
        f"mkdir -p {EMULATED_VENV}/bin && printf '%s\\n' '#!/bin/sh' "
        f"'exec {EMULATOR} -cpu Haswell {VENV}/bin/python \"$@\"' "
        f"> {EMULATED_VENV}/bin/python && chmod 755 {EMULATED_VENV}/bin/python"
    )
    yield deployed
    deployed.sh(f"rm -rf {EMULATED_VENV} /usr/local/bin/{EMULATOR}")


def test_on_an_avx2_cpu_the_check_loads_the_avx2_library(emulated_avx2):
    result = check(emulated_avx2, EMULATED_VENV)
    assert not result.get("failed"), result
    assert result["libraries"] == [f"vllm/{CPU_KERNEL_LIBRARY[AVX2]}"]
    assert result["torch_isa"] == {"avx2": True, "avx512": False, "avx512_bf16": False, "amx_tile": False}
    assert "llmops_amx_permission" in result["plugins"]


def test_on_an_avx2_cpu_importing_vllm_c_is_an_illegal_instruction(emulated_avx2):
    """What the install check did before: it would have failed here, where vLLM serves."""
    proc = emulated_avx2.sh(f"{EMULATED_VENV}/bin/python -c 'import vllm._C'", check=False, timeout=300)
    assert proc.returncode in (128 + signal.SIGILL, -signal.SIGILL), (proc.returncode, proc.stderr[-2000:])
