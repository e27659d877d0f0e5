# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A vLLM general plugin that the llmops.vllm collection installs into the venv of vLLM's CPU build.

Linux (5.16 and later) lets a process use Intel AMX tiles only after it has asked for them with
arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); an AMX instruction before that is an illegal
instruction (SIGILL). vLLM's CPU build runs its own AMX kernels (bf16 attention and GEMMs) without asking:
oneDNN asks for itself, but only once it picks AMX, which it does for larger batches. A worker whose first
batch is small (a prompt of one or two tokens) therefore dies of SIGILL. vLLM calls every
`vllm.general_plugins` entry point in each of its processes, workers included, before any model runs:
asking here makes every first batch safe. Elsewhere (no AMX, another architecture) it asks for nothing, and
says so in the process's log, as it says what the kernel answered where it asks.
"""

import ctypes
import logging
import os
import platform

SYS_ARCH_PRCTL = 158  # x86-64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

# A child of vLLM's logger, so that its lines reach the unit's journal in vLLM's format.
logger = logging.getLogger("vllm.llmops_vllm_cpu_amx")


def has_amx(cpuinfo_path="/proc/cpuinfo"):
    try:
        with open(cpuinfo_path, encoding="ascii", errors="replace") as cpuinfo:
            return any(line.startswith("flags") and "amx_tile" in line.split() for line in cpuinfo)
    except OSError:
        return False


def request_amx_permission():
    """Ask the kernel for AMX tile data; True when granted, False where there is none to ask for or it refused."""
    if platform.machine() != "x86_64" or not has_amx():
        logger.info("llmops.vllm: this CPU has no AMX; no AMX permission to ask for (harmless)")
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0:
        logger.warning("llmops.vllm: the kernel refused AMX tile data: %s", os.strerror(ctypes.get_errno()))
        return False
    return True
