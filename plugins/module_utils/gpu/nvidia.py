# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVIDIA GPUs as the driver reports them: one reader, two backends, and pure parsers of nvidia-smi.

`open_backend` returns an `Nvml` reader when the Python package nvidia-ml-py (`pynvml`) is importable and
NVML starts (a memory poll then costs microseconds), else an `NvidiaSmi` reader that runs the CLI (tens of
milliseconds a poll). Both answer `gpus()`, `processes()`, `versions()` and `topology()` with the same
plain data, so callers never know which one they hold. A host without a driver raises `NoDriver`, whose
reason says what was looked for and not found.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import re
from dataclasses import asdict, dataclass
from xml.etree import ElementTree

BACKENDS = ("auto", "nvml", "nvidia-smi")
# The `backend` option of every module that reads GPUs (documented in doc_fragments/nvidia.py).
BACKEND_OPTION = {"type": "str", "default": "auto", "choices": list(BACKENDS)}
QUERY_GPU_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "mig.mode.current", "pci.bus_id")
QUERY_APPS_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
NVML_LIBRARY = "libnvidia-ml.so.1"
MIB = 1024 * 1024
# `nvidia-smi topo -m` underlines its header with terminal escapes, also when writing to a pipe.
TERMINAL_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
GPU_LABEL = re.compile(r"GPU(\d+)\Z")
NOT_AVAILABLE = ("[N/A]", "N/A", "[Not Supported]")


class NvidiaError(Exception):
    """The driver is there but a query failed or answered something unreadable."""


class NoDriver(Exception):
    """No usable NVIDIA driver; `reason` says what was missing."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total_mib: int
    memory_used_mib: int
    mig_mode: str  # Enabled, Disabled, or N/A where the GPU has no MIG
    pci_bus_id: str

    def as_dict(self):
        return asdict(self)


@dataclass(frozen=True)
class GpuProcess:
    gpu_uuid: str
    pid: int
    name: str  # as the driver reports it; /proc tells more where the PID is visible
    used_mib: int | None  # None where the driver cannot attribute memory to the process


def _value(text: str) -> str | None:
    text = text.strip()
    return None if text in NOT_AVAILABLE else text


def parse_csv(text: str, fields: tuple[str, ...]) -> list[dict]:
    """Rows of `nvidia-smi --query-*=FIELDS --format=csv,noheader,nounits` as dicts; N/A values are None."""
    rows = []
    for line_number, row in enumerate(csv.reader(text.splitlines(), skipinitialspace=True), start=1):
        if not row:
            continue
        if len(row) != len(fields):
            raise NvidiaError(f"nvidia-smi line {line_number} has {len(row)} values, expected {len(fields)}: {row}")
        rows.append({field: _value(cell) for field, cell in zip(fields, row, strict=True)})
    return rows


def _mib(value: str | None, what: str) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        raise NvidiaError(f"nvidia-smi reported {what} as {value!r}, not a number of MiB") from None


def parse_query_gpu(text: str) -> list[Gpu]:
    """The GPUs from `nvidia-smi --query-gpu=` QUERY_GPU_FIELDS, in nvidia-smi's (PCI bus) order."""
    return [
        Gpu(
            index=int(row["index"]),
            uuid=row["uuid"],
            name=row["name"],
            memory_total_mib=_mib(row["memory.total"], "memory.total"),
            memory_used_mib=_mib(row["memory.used"], "memory.used"),
            mig_mode=row["mig.mode.current"] or "N/A",
            pci_bus_id=row["pci.bus_id"],
        )
        for row in parse_csv(text, QUERY_GPU_FIELDS)
    ]


def parse_compute_apps(text: str) -> list[GpuProcess]:
    """Processes from `nvidia-smi --query-compute-apps=` QUERY_APPS_FIELDS."""
    return [
        GpuProcess(
            gpu_uuid=row["gpu_uuid"],
            pid=int(row["pid"]),
            name=row["process_name"] or "",
            used_mib=None if row["used_memory"] is None else _mib(row["used_memory"], "used_memory"),
        )
        for row in parse_csv(text, QUERY_APPS_FIELDS)
    ]


def parse_versions_xml(text: str) -> tuple[str, str]:
    """(driver version, CUDA version) from `nvidia-smi -q -x`."""
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as error:
        raise NvidiaError(f"nvidia-smi -q -x did not print XML: {error}") from None
    return (root.findtext("driver_version") or "").strip(), (root.findtext("cuda_version") or "").strip()


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version number (13000) as nvidia-smi prints it (13.0)."""
    return f"{version // 1000}.{version % 1000 // 10}"


def link_kind(label: str) -> str:
    """`nvlink` for NV# labels (a bonded set of # NVLinks), `pcie` for every PCIe path (PIX ... SYS)."""
    return "nvlink" if label.startswith("NV") else "pcie"


def topology(matrix: list[list[str]]) -> dict:
    """The facts' topology: the GPU-to-GPU matrix, each pair's link, and whether every pair is NVLink.

    `all_nvlink` is false with fewer than two GPUs: no pair, so no NVLink either.
    """
    pairs = [
        {"gpus": [first, second], "link": matrix[first][second], "kind": link_kind(matrix[first][second])}
        for first in range(len(matrix))
        for second in range(first + 1, len(matrix))
    ]
    return {"matrix": matrix, "pairs": pairs, "all_nvlink": bool(pairs) and all(p["kind"] == "nvlink" for p in pairs)}


def parse_topology_matrix(text: str) -> list[list[str]]:
    """The GPU-by-GPU part of `nvidia-smi topo -m`: labels such as X, NV18, PIX, PXB, PHB, NODE, SYS.

    NIC columns and rows, CPU and NUMA affinity columns and the legend are left out.
    """
    rows = [[cell.strip() for cell in TERMINAL_ESCAPE.sub("", line).split("\t")] for line in text.splitlines()]
    # The header row starts with an empty cell, then GPU0 GPU1 ... (NIC0 ...) CPU Affinity ...
    header_at = next((n for n, cells in enumerate(rows) if len(cells) > 1 and not cells[0] and "GPU0" in cells), None)
    if header_at is None:
        raise NvidiaError("nvidia-smi topo -m printed no header row naming GPU0")
    gpu_columns = [column for column, cell in enumerate(rows[header_at]) if GPU_LABEL.match(cell)]
    matrix = []
    for cells in rows[header_at + 1 :]:
        match = GPU_LABEL.match(cells[0])
        if not match:  # NIC rows, then a blank line and the legend
            break
        if int(match.group(1)) != len(matrix) or len(cells) <= gpu_columns[-1]:
            raise NvidiaError(f"nvidia-smi topo -m: unexpected row {cells}")
        matrix.append([cells[column] for column in gpu_columns])
    if len(matrix) != len(gpu_columns):
        raise NvidiaError(f"nvidia-smi topo -m: {len(gpu_columns)} GPU columns but {len(matrix)} GPU rows")
    return matrix


class NvidiaSmi:
    """Reads through the nvidia-smi CLI. `run(args)` returns `(rc, stdout, stderr)`, like run_command."""

    name = "nvidia-smi"

    def __init__(self, path: str, run):
        self.path = path
        self._run = run

    def _query(self, *args: str) -> str:
        command = [self.path, *args]
        rc, out, err = self._run(command)
        if rc != 0:
            raise NvidiaError(f"{' '.join(command)} failed with rc {rc}: {(err or out).strip()}")
        return out

    def gpus(self) -> list[Gpu]:
        return parse_query_gpu(
            self._query(f"--query-gpu={','.join(QUERY_GPU_FIELDS)}", "--format=csv,noheader,nounits")
        )

    def processes(self) -> list[GpuProcess]:
        fields = ",".join(QUERY_APPS_FIELDS)
        return parse_compute_apps(self._query(f"--query-compute-apps={fields}", "--format=csv,noheader,nounits"))

    def versions(self) -> tuple[str, str]:
        return parse_versions_xml(self._query("-q", "-x"))

    def topology(self) -> dict:
        return topology(parse_topology_matrix(self._query("topo", "-m")))

    def close(self):
        """Nothing to release: each query is its own process."""


class Nvml:
    """Reads through NVML (`pynvml`, already initialised). Topology still comes from nvidia-smi, when present."""

    name = "nvml"

    def __init__(self, pynvml, cli: NvidiaSmi | None):
        self._nvml = pynvml
        self._cli = cli
        handles = [self._call("nvmlDeviceGetHandleByIndex", index) for index in range(self._call("nvmlDeviceGetCount"))]
        # What cannot change while a module runs is read once, so that a poll is one NVML call per GPU.
        self._devices = [
            (
                handle,
                _text(self._call("nvmlDeviceGetUUID", handle)),
                _text(self._call("nvmlDeviceGetName", handle)),
                self._mig_mode(handle),
                _text(self._call("nvmlDeviceGetPciInfo", handle).busId),
            )
            for handle in handles
        ]

    def _call(self, function, *args):
        try:
            return getattr(self._nvml, function)(*args)
        except self._nvml.NVMLError as error:
            raise NvidiaError(f"NVML {function} failed: {error}") from None

    def _mig_mode(self, handle) -> str:
        try:
            current, _pending = self._nvml.nvmlDeviceGetMigMode(handle)
        except self._nvml.NVMLError:  # NotSupported on GPUs without MIG
            return "N/A"
        return "Enabled" if current == self._nvml.NVML_DEVICE_MIG_ENABLE else "Disabled"

    def gpus(self) -> list[Gpu]:
        gpus = []
        for index, (handle, uuid, name, mig_mode, pci_bus_id) in enumerate(self._devices):
            # Version 2 leaves the driver's reservation out of `used`, as nvidia-smi does; version 1 counts it.
            memory = self._call("nvmlDeviceGetMemoryInfo", handle, self._nvml.nvmlMemory_v2)
            gpus.append(Gpu(index, uuid, name, memory.total // MIB, memory.used // MIB, mig_mode, pci_bus_id))
        return gpus

    def processes(self) -> list[GpuProcess]:
        found = []
        for handle, uuid, *_identity in self._devices:
            for process in self._call("nvmlDeviceGetComputeRunningProcesses", handle):
                try:
                    name = _text(self._nvml.nvmlSystemGetProcessName(process.pid))
                except self._nvml.NVMLError:  # the process ended meanwhile
                    name = ""
                used = process.usedGpuMemory
                found.append(GpuProcess(uuid, process.pid, name, None if used is None else used // MIB))
        return found

    def versions(self) -> tuple[str, str]:
        driver = _text(self._call("nvmlSystemGetDriverVersion"))
        return driver, cuda_version_text(self._call("nvmlSystemGetCudaDriverVersion"))

    def topology(self) -> dict:
        return self._cli.topology() if self._cli else topology([])

    def close(self):
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _text(value) -> str:
    """pynvml returns str or bytes depending on its version."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_library_problem(load=ctypes.CDLL) -> str:
    try:
        load(NVML_LIBRARY)
    except OSError as error:
        return f"{NVML_LIBRARY} cannot be loaded ({error})"
    return f"{NVML_LIBRARY} loads, but the Python package nvidia-ml-py (pynvml) is not importable by this interpreter"


def open_backend(wanted: str, pynvml, nvidia_smi_path: str | None, run, load_library=ctypes.CDLL):
    """The reader to use: `wanted` is auto, nvml or nvidia-smi; `pynvml` the imported module or None.

    Raises NoDriver naming every place looked at when no backend works.
    """
    cli = NvidiaSmi(nvidia_smi_path, run) if nvidia_smi_path else None
    problems = []
    if wanted in ("auto", "nvml"):
        if pynvml is None:
            problems.append(_nvml_library_problem(load_library))
        else:
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as error:
                problems.append(f"NVML does not start ({error})")
            else:
                return Nvml(pynvml, cli)
    if wanted in ("auto", "nvidia-smi"):
        if cli is None:
            problems.append("nvidia-smi is not on PATH")
        else:
            try:
                cli.gpus()
            except NvidiaError as error:
                problems.append(str(error))
            else:
                return cli
    raise NoDriver("; ".join(problems))
