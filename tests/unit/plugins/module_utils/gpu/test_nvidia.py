from pathlib import Path
from types import SimpleNamespace

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.gpu.nvidia import (
    QUERY_GPU_FIELDS,
    Gpu,
    GpuProcess,
    NoDriver,
    NvidiaError,
    NvidiaSmi,
    Nvml,
    cuda_version_text,
    open_backend,
    parse_compute_apps,
    parse_csv,
    parse_query_gpu,
    parse_topology_matrix,
    parse_versions_xml,
    topology,
)

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "nvidia-smi"
H200_UUID = "GPU-a5d0b967-65ff-5e9c-2283-46985c5c9291"  # GPU 0 of the two-GPU machine


def fixture(name):
    return (FIXTURES / name).read_text()


def test_one_h200_has_no_pairs():
    matrix = parse_topology_matrix(fixture("h200-1gpu/topo-m.txt"))
    assert matrix == [["X"]]
    assert topology(matrix) == {"matrix": [["X"]], "pairs": [], "all_nvlink": False}


def test_eight_sxm_gpus_are_all_nvlink_and_nics_are_left_out():
    facts = topology(parse_topology_matrix(fixture("hgx-8gpu-nvlink.txt")))
    assert len(facts["matrix"]) == 8 and all(len(row) == 8 for row in facts["matrix"])
    assert [facts["matrix"][i][i] for i in range(8)] == ["X"] * 8
    assert len(facts["pairs"]) == 28
    assert facts["pairs"][0] == {"gpus": [0, 1], "link": "NV18", "kind": "nvlink"}
    assert facts["all_nvlink"] is True


def test_eight_pcie_gpus_keep_their_paths():
    facts = topology(parse_topology_matrix(fixture("pcie-8gpu.txt")))
    links = {tuple(pair["gpus"]): pair["link"] for pair in facts["pairs"]}
    assert links[(0, 1)] == "PIX" and links[(0, 2)] == "NODE" and links[(3, 4)] == "SYS"
    assert {pair["kind"] for pair in facts["pairs"]} == {"pcie"}
    assert facts["all_nvlink"] is False


def test_the_two_bridged_h200s():
    facts = topology(parse_topology_matrix(fixture("h200-2gpu/topo-m.txt")))
    assert facts == {
        "matrix": [["X", "NV18"], ["NV18", "X"]],
        "pairs": [{"gpus": [0, 1], "link": "NV18", "kind": "nvlink"}],
        "all_nvlink": True,
    }


def test_a_mixed_box_is_not_all_nvlink():
    facts = topology([["X", "NV4", "SYS"], ["NV4", "X", "SYS"], ["SYS", "SYS", "X"]])
    assert [pair["kind"] for pair in facts["pairs"]] == ["nvlink", "pcie", "pcie"]
    assert facts["all_nvlink"] is False


@pytest.mark.parametrize(
    "text",
    ["", "No devices were found\n", "\tGPU0\tGPU1\nGPU0\t X \tNV18\n\nLegend:\n"],
)
def test_unreadable_topology_is_an_error(text):
    with pytest.raises(NvidiaError):
        parse_topology_matrix(text)


@pytest.mark.parametrize("machine", ["h200-1gpu", "h200-2gpu"])
def test_versions_from_the_real_xml(machine):
    assert parse_versions_xml(fixture(f"{machine}/query.xml")) == ("580.159.04", "13.0")


def test_versions_from_something_else_is_an_error():
    with pytest.raises(NvidiaError, match="did not print XML"):
        parse_versions_xml("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


@pytest.mark.parametrize(("number", "text"), [(13000, "13.0"), (12040, "12.4"), (11080, "11.8")])
def test_cuda_version_text(number, text):
    assert cuda_version_text(number) == text


def test_query_gpu():
    assert parse_query_gpu(fixture("h200-2gpu/query-gpu.csv")) == [
        Gpu(0, H200_UUID, "NVIDIA H200", 143771, 0, "Disabled", "00000000:00:06.0"),
        Gpu(1, "GPU-2e2a7309-362b-b544-b123-a009c322962a", "NVIDIA H200", 143771, 0, "Disabled", "00000000:00:07.0"),
    ]


def test_query_gpu_without_mig_says_na():
    text = "1, GPU-1, NVIDIA L40S, 46068, 12, [N/A], 00000000:41:00.0\n"
    assert parse_query_gpu(text)[0].mig_mode == "N/A"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0, GPU-1, NVIDIA H200, 143771\n", "has 4 values, expected 7"),
        ("0, GPU-1, NVIDIA H200, [N/A], 0, Disabled, 0000:01:00.0\n", "memory.total as None"),
    ],
)
def test_query_gpu_refuses_what_it_cannot_read(text, message):
    with pytest.raises(NvidiaError, match=message):
        parse_query_gpu(text)


def test_csv_keeps_commas_inside_quotes():
    assert parse_csv('0, "a, b"\n\n', ("index", "name")) == [{"index": "0", "name": "a, b"}]


def test_compute_apps_captured_while_torch_held_8_gib():
    assert parse_compute_apps(fixture("h200-2gpu/query-compute-apps.csv")) == [
        GpuProcess(H200_UUID, 1872, "/opt/torch/.venv/bin/python3", 8710)
    ]


def test_compute_apps():
    text = f"{H200_UUID}, 4312, /opt/vllm/venv/bin/python3, 130122\n{H200_UUID}, 4400, VLLM::Worker, [N/A]\n"
    assert parse_compute_apps(text) == [
        GpuProcess(H200_UUID, 4312, "/opt/vllm/venv/bin/python3", 130122),
        GpuProcess(H200_UUID, 4400, "VLLM::Worker", None),
    ]
    assert parse_compute_apps("") == []


class ScriptedCli:
    """Answers nvidia-smi command lines from fixtures, as run_command would, and records them."""

    def __init__(self, answers):
        self.answers = answers
        self.commands = []

    def __call__(self, command):
        self.commands.append(command)
        return self.answers[command[1]]


def test_nvidia_smi_backend_runs_the_queries():
    run = ScriptedCli(
        {
            "--query-gpu=" + ",".join(QUERY_GPU_FIELDS): (0, fixture("h200-2gpu/query-gpu.csv"), ""),
            "topo": (0, fixture("h200-2gpu/topo-m.txt"), ""),
            "-q": (0, fixture("h200-2gpu/query.xml"), ""),
        }
    )
    cli = NvidiaSmi("/usr/bin/nvidia-smi", run)
    assert cli.gpus()[0].uuid == H200_UUID
    assert cli.topology()["matrix"] == [["X", "NV18"], ["NV18", "X"]]
    assert cli.versions() == ("580.159.04", "13.0")
    assert run.commands[0] == [
        "/usr/bin/nvidia-smi",
        "--query-gpu=index,uuid,name,memory.total,memory.used,mig.mode.current,pci.bus_id",
        "--format=csv,noheader,nounits",
    ]


def test_nvidia_smi_failure_says_what_it_printed():
    run = ScriptedCli({"--query-compute-apps=gpu_uuid,pid,process_name,used_memory": (9, "", "driver gone\n")})
    with pytest.raises(NvidiaError, match="failed with rc 9: driver gone"):
        NvidiaSmi("/usr/bin/nvidia-smi", run).processes()


class NVMLError(Exception):
    pass


class FakeNvml:
    """The few pynvml calls the reader makes, for one H200 with a process on it."""

    NVMLError = NVMLError
    nvmlMemory_v2 = 0x02000028
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, init_error=None):
        self.init_error = init_error
        self.memory_versions = []
        self.uuid_reads = 0

    def nvmlInit(self):
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"handle{index}"

    def nvmlDeviceGetUUID(self, handle):
        self.uuid_reads += 1
        return H200_UUID.encode()  # older pynvml returns bytes

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        self.memory_versions.append(version)
        # Version 1 counts the driver's 616 MiB reservation as used; version 2 does not.
        used = 9216 if version else 9216 + 616
        return SimpleNamespace(total=143771 * 1024 * 1024, used=used * 1024 * 1024)

    def nvmlDeviceGetMigMode(self, handle):
        raise NVMLError("Not Supported")

    def nvmlDeviceGetPciInfo(self, handle):
        return SimpleNamespace(busId=b"00000000:00:06.0")

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=430, usedGpuMemory=9229565952), SimpleNamespace(pid=431, usedGpuMemory=None)]

    def nvmlSystemGetProcessName(self, pid):
        if pid == 431:
            raise NVMLError("Not Found")
        return "python3"

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000


def test_nvml_backend_reads_like_nvidia_smi():
    pynvml = FakeNvml()
    reader = Nvml(pynvml, cli=None)
    assert reader.gpus() == [Gpu(0, H200_UUID, "NVIDIA H200", 143771, 9216, "N/A", "00000000:00:06.0")]
    assert reader.gpus()[0].memory_used_mib == 9216
    # A poll reads only the memory, version 2; what cannot change was read once.
    assert pynvml.memory_versions == [pynvml.nvmlMemory_v2] * 2 and pynvml.uuid_reads == 1
    assert reader.processes() == [GpuProcess(H200_UUID, 430, "python3", 8802), GpuProcess(H200_UUID, 431, "", None)]
    assert reader.versions() == ("580.159.04", "13.0")
    assert reader.topology() == {"matrix": [], "pairs": [], "all_nvlink": False}


def no_library(name):
    raise OSError(f"{name}: cannot open shared object file: No such file or directory")


def test_no_driver_names_everything_looked_for():
    with pytest.raises(NoDriver) as raised:
        open_backend("auto", None, None, run=None, load_library=no_library)
    assert raised.value.reason == (
        "libnvidia-ml.so.1 cannot be loaded (libnvidia-ml.so.1: cannot open shared object file: "
        "No such file or directory); nvidia-smi is not on PATH"
    )


def test_a_library_without_pynvml_is_said_so():
    with pytest.raises(NoDriver, match=r"libnvidia-ml\.so\.1 loads, but the Python package nvidia-ml-py"):
        open_backend("nvml", None, None, run=None, load_library=lambda name: None)


def test_nvml_first_then_nvidia_smi():
    run = ScriptedCli({"--query-gpu=" + ",".join(QUERY_GPU_FIELDS): (0, "", "")})
    assert open_backend("auto", FakeNvml(), "/usr/bin/nvidia-smi", run).name == "nvml"
    assert open_backend("auto", FakeNvml("Driver Not Loaded"), "/usr/bin/nvidia-smi", run).name == "nvidia-smi"
    assert open_backend("nvidia-smi", FakeNvml(), "/usr/bin/nvidia-smi", run).name == "nvidia-smi"


def test_a_broken_driver_is_no_driver_with_both_reasons():
    run = ScriptedCli({"--query-gpu=" + ",".join(QUERY_GPU_FIELDS): (9, "NVIDIA-SMI has failed", "")})
    with pytest.raises(NoDriver) as raised:
        open_backend("auto", FakeNvml("Driver Not Loaded"), "/usr/bin/nvidia-smi", run)
    assert raised.value.reason.startswith("NVML does not start (Driver Not Loaded); ")
    assert raised.value.reason.endswith("failed with rc 9: NVIDIA-SMI has failed")
