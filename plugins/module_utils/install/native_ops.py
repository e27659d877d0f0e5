# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether vLLM and its native ops load in a venv, the way vLLM itself loads them on this host.

`import vllm._C` is not that way: on the CPU build it loads the AVX-512 library whatever the CPU, and dies of
SIGILL on an AVX2-only one. vLLM loads its ops when `vllm._custom_ops` is imported
(`current_platform.import_kernels()`), choosing the library for the CPU it runs on, or the CUDA build's own; it
only logs a warning when that library fails to load. So `CHECK` imports vLLM that way, keeps vLLM's warnings,
and asks torch for an op that every build registers (`_C::rms_norm`); on the CPU build it also runs that op, so
that the library's instructions have run on this CPU. `verdict` turns its answer, or the way it died, into the
problems to report; pure, so that every build and CPU is a unit-test input.
"""

from __future__ import annotations

import json
import posixpath
import signal

# Runs as `VENV/bin/python -c CHECK REQUEST_JSON` (`request`); prints one JSON object on its last line.
CHECK = r"""
import importlib, json, logging, os, sys
request = json.loads(sys.argv[1])
# vLLM's own logging would print to stdout, where the answer goes; its warnings are kept here instead.
os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
warnings = []

class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())

logging.getLogger("vllm").addHandler(Keep(logging.WARNING))
import importlib.metadata as metadata
import torch
import vllm
import vllm._custom_ops
from vllm.platforms import current_platform

answer = {"version": vllm.__version__, "device": current_platform.device_type, "warnings": warnings}
try:
    op = torch.ops._C.rms_norm
except (AttributeError, RuntimeError):
    op = None
answer["op_registered"] = op is not None
answer["op_ran"] = False
if op is not None and current_platform.device_type == "cpu":
    out = torch.empty(1, 64)
    op(out, torch.ones(1, 64), torch.ones(64), 1e-6)
    answer["op_ran"] = bool(torch.allclose(out, torch.ones(1, 64)))
cpu = getattr(torch, "cpu", None)
answer["torch_isa"] = {
    name: bool(getattr(cpu, "_is_" + name + "_supported", lambda: False)())
    for name in ("avx2", "avx512", "avx512_bf16", "amx_tile")
}
with open("/proc/self/maps") as maps:
    answer["mapped"] = sorted({line.split()[-1] for line in maps if "/vllm/" in line and ".so" in line})
points = metadata.entry_points()
group = "vllm.general_plugins"
plugins = points.select(group=group) if hasattr(points, "select") else points.get(group, [])
answer["plugins"] = {point.name: point.load()() for point in plugins if point.name in request["plugins"]}
for name in request["modules"]:
    importlib.import_module(name)
print(json.dumps(answer))
"""

NATIVE_OPS_PREFIXES = ("_C", "_moe_C")


def request(plugins: list[str], modules: list[str]) -> str:
    """CHECK's argument: the plugins to call and the modules that must import too."""
    return json.dumps({"plugins": list(plugins), "modules": list(modules)})


class CheckError(ValueError):
    """An answer that is not what CHECK prints."""


def parse(stdout: str) -> dict:
    try:
        answer = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise CheckError(f"the check printed no answer: {stdout[-300:]!r}") from None
    if not isinstance(answer, dict) or "op_registered" not in answer:
        raise CheckError(f"the check printed {answer!r}, not its answer")
    return answer


def native_libraries(mapped: list[str]) -> list[str]:
    """The files of vLLM's native ops among the libraries the process mapped, relative to the vllm package."""
    libraries = []
    for path in mapped:
        head, name = posixpath.split(path)
        if posixpath.basename(head) == "vllm" and name.startswith(NATIVE_OPS_PREFIXES):
            libraries.append(f"vllm/{name}")
    return libraries


def describe_exit(rc: int, stderr: str) -> str:
    """Why the check's interpreter ended without an answer."""
    lines = stderr.strip().splitlines()
    tail = lines[-1] if lines else ""  # a traceback's last line names the exception
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        why = f"was killed by {name}"
        if -rc == signal.SIGILL:
            why += " (an illegal instruction: a native library built for another CPU than this host's)"
    else:
        why = f"exited with rc {rc}"
    return f"importing vLLM's native ops {why}" + (f": {tail}" if tail else "")


def verdict(answer: dict, version: str, device: str, plugins: list[str]) -> list[str]:
    """What is wrong with the venv, from CHECK's answer: an empty list when vLLM and its ops load as pinned."""
    problems = []
    release = answer["version"].split("+", 1)[0]
    if release != version:
        problems.append(f"vLLM is {answer['version']}, not the pinned {version}")
    if answer["device"] != device:
        problems.append(f"vLLM chose the device {answer['device']!r} on this host, not {device!r}")
    if not answer["op_registered"]:
        said = "; ".join(answer["warnings"]) or "vLLM logged no warning"
        problems.append(f"vLLM's native ops did not load ({said})")
    elif device == "cpu" and not answer["op_ran"]:
        problems.append("vLLM's native op rms_norm loaded but gave a wrong result on this CPU")
    missing = [name for name in plugins if name not in answer["plugins"]]
    if missing:
        problems.append(f"the vllm.general_plugins entry points {missing} are missing")
    return problems
