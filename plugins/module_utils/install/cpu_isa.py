# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The x86-64 instruction set level of a CPU, as vLLM's CPU build tells its kernel builds apart.

vLLM's CPU wheel ships its native ops three times and loads one when `vllm._custom_ops` is imported
(`current_platform.import_kernels()` in vllm/platforms/cpu.py, by torch's own CPU checks): AVX-512 with BF16
loads `vllm/_C.abi3.so`, AVX-512 without BF16 `_C_AVX512.abi3.so`, anything else `_C_AVX2.abi3.so`. AMX sits on
top of AVX-512 BF16 and needs the permission that the collection's plugin asks for. The levels here follow those
lines, read from the flags of /proc/cpuinfo; pure, so that every level is a unit-test input.
"""

from __future__ import annotations

AMX = "AMX"
AVX512_BF16 = "AVX-512 BF16"
AVX512 = "AVX-512"
AVX2 = "AVX2"
BELOW_AVX2 = "below AVX2"

# The native-ops library that vLLM's CPU build loads at each level (vllm 0.32.0).
CPU_KERNEL_LIBRARY = {
    AMX: "_C.abi3.so",
    AVX512_BF16: "_C.abi3.so",
    AVX512: "_C_AVX512.abi3.so",
    AVX2: "_C_AVX2.abi3.so",
}


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor in /proc/cpuinfo's text (every core of a host has the same)."""
    for line in cpuinfo.splitlines():
        key, separator, value = line.partition(":")
        if separator and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def isa_level(flags: frozenset[str] | set[str]) -> str:
    """The highest level of the lines above that `flags` reach."""
    if "avx512f" in flags and "avx512_bf16" in flags:
        return AMX if "amx_tile" in flags else AVX512_BF16
    if "avx512f" in flags:
        return AVX512
    return AVX2 if "avx2" in flags else BELOW_AVX2


def read_isa_level(cpuinfo_path: str = "/proc/cpuinfo") -> str:
    with open(cpuinfo_path, encoding="ascii", errors="replace") as cpuinfo:
        return isa_level(cpu_flags(cpuinfo.read()))
