"""The CPU's instruction set level as vLLM's CPU build tells its native-ops libraries apart."""

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.install.cpu_isa import (
    AMX,
    AVX2,
    AVX512,
    AVX512_BF16,
    BELOW_AVX2,
    CPU_KERNEL_LIBRARY,
    cpu_flags,
    isa_level,
    read_isa_level,
)

# The flags of the CPUs this project has run on, trimmed: an AMD EPYC with AVX2 alone, an Intel Xeon with AMX.
EPYC_AVX2 = "fpu sse4_2 avx f16c avx2 bmi2 sha_ni"
XEON_AMX = "fpu avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8"


@pytest.mark.parametrize(
    ("flags", "level", "library"),
    [
        (EPYC_AVX2, AVX2, "_C_AVX2.abi3.so"),
        ("fpu avx2 avx512f avx512dq avx512bw avx512vl", AVX512, "_C_AVX512.abi3.so"),
        ("fpu avx2 avx512f avx512bw avx512vl avx512_bf16", AVX512_BF16, "_C.abi3.so"),
        (XEON_AMX, AMX, "_C.abi3.so"),
    ],
)
def test_each_level_and_the_library_vllm_loads_there(flags, level, library):
    assert isa_level(set(flags.split())) == level
    assert CPU_KERNEL_LIBRARY[level] == library


def test_amx_flags_without_avx512_bf16_are_not_the_amx_level():
    # AMX tiles alone do not make vLLM pick its BF16 library: it asks for AVX-512 BF16.
    assert isa_level({"avx2", "avx512f", "amx_tile"}) == AVX512


def test_a_cpu_without_avx2_is_below_every_library():
    assert isa_level({"sse4_2", "avx"}) == BELOW_AVX2
    assert BELOW_AVX2 not in CPU_KERNEL_LIBRARY


def test_the_flags_come_from_the_first_processor_of_cpuinfo():
    text = f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {EPYC_AVX2}\n\nprocessor\t: 1\nflags\t\t: {XEON_AMX}\n"
    assert cpu_flags(text) == frozenset(EPYC_AVX2.split())
    assert cpu_flags("processor\t: 0\n") == frozenset()


def test_the_level_of_a_cpuinfo_file(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {XEON_AMX}\n")
    assert read_isa_level(str(cpuinfo)) == AMX
