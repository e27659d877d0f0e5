# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Print this machine's CPU and its instruction set level as vLLM's CPU build sees it.

`make test` starts with it, so that a log says which of vLLM's native-ops libraries a green run covered
(the suite also runs the AVX2 library under qemu-user wherever it runs: tests/integration/test_install.py).
"""

import importlib.util
import sys
from pathlib import Path

ISA = Path(__file__).resolve().parents[1] / "plugins" / "module_utils" / "install" / "cpu_isa.py"
spec = importlib.util.spec_from_file_location("cpu_isa", ISA)
cpu_isa = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpu_isa)

SHOWN = ("avx2", "avx512f", "avx512_bf16", "amx_tile")


def main() -> int:
    text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = cpu_isa.cpu_flags(text)
    level = cpu_isa.isa_level(flags)
    library = cpu_isa.CPU_KERNEL_LIBRARY.get(level)
    loads = f"vLLM's CPU build loads vllm/{library}" if library else "vLLM's CPU build needs AVX2 at least"
    present = " ".join(flag for flag in SHOWN if flag in flags) or "none of " + " ".join(SHOWN)
    print(f"CPU: {model}; ISA level {level} ({loads}); flags: {present}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
