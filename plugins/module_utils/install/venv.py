# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a Python venv holds, read by its own interpreter in one run: releases, files, entry points; and what a base
interpreter lends a venv built on it: its site-packages and its torch.

The install role reads every venv it may use once, before anything changes, and acts only on what differs.
`INSPECT` and `INSPECT_BASE` run inside the interpreter (it knows its own site-packages and metadata); `request`,
`parse` and `parse_base` are pure.
"""

from __future__ import annotations

import json
import posixpath

# Runs as `VENV/bin/python -c INSPECT REQUEST_JSON`; prints one JSON object. Standard library only. The versions
# are those of the venv's own site-packages: what a base interpreter lends it (a .pth) is not the venv's.
INSPECT = r"""
import hashlib, json, os, re, sys, sysconfig
import importlib.metadata as metadata
request = json.loads(sys.argv[1])
paths = sysconfig.get_paths()
site_packages = paths["purelib"]

def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()

installed = {}
for dist in metadata.distributions(path=list(dict.fromkeys([site_packages, paths["platlib"]]))):
    if dist.metadata["Name"]:
        installed.setdefault(canonical(dist.metadata["Name"]), dist.version)

def version(name):
    return installed.get(canonical(name))

def digest(relative):
    try:
        with open(os.path.join(site_packages, relative), "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None

points = metadata.entry_points()
group = request["entry_point_group"]
selected = (points.select(group=group) if hasattr(points, "select") else points.get(group, [])) if group else []
print(json.dumps({
    "site_packages": site_packages,
    "versions": {name: version(name) for name in request["distributions"]},
    "files": {relative: digest(relative) for relative in request["files"]},
    "entry_points": sorted({point.name for point in selected}),
}))
"""


# Runs as `PYTHON -c INSPECT_BASE`: the interpreter's version, its site-packages and its torch, read from
# torch/version.py without importing torch (an import takes seconds). Standard library only.
INSPECT_BASE = r"""
import importlib.util, json, os, site, sys
directories = [path for path in dict.fromkeys(site.getsitepackages()) if os.path.isdir(path)]
torch = None
for directory in directories:
    path = os.path.join(directory, "torch", "version.py")
    if os.path.isfile(path):
        spec = importlib.util.spec_from_file_location("_llmops_torch_version", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        torch = {"version": str(module.__version__), "cuda": getattr(module, "cuda", None), "path": path}
        break
print(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3], "site_packages": directories, "torch": torch}))
"""


class VenvError(ValueError):
    """A venv's interpreter that answered something else than INSPECT prints."""


def python_of(venv: str) -> str:
    return posixpath.join(venv, "bin", "python")


def request(distributions, files, entry_point_group) -> str:
    return json.dumps(
        {"distributions": list(distributions), "files": list(files), "entry_point_group": entry_point_group or ""}
    )


def _answer(who: str, stdout: str, keys: set[str]) -> dict:
    """The JSON object that an inspection printed last, with exactly `keys`; VenvError names `who` printed it."""
    try:
        state = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise VenvError(f"{who} printed no state: {stdout[-300:]!r}") from None
    if not isinstance(state, dict) or set(state) != keys:
        raise VenvError(f"{who} printed {state!r}, not the state asked for")
    return state


def parse(venv: str, stdout: str) -> dict:
    """INSPECT's answer, checked."""
    return _answer(f"the interpreter of {venv}", stdout, {"site_packages", "versions", "files", "entry_points"})


def parse_base(python: str, stdout: str) -> dict:
    """INSPECT_BASE's answer, checked."""
    return _answer(python, stdout, {"python", "site_packages", "torch"})


def release(version: str | None) -> str | None:
    """A release without its local version: 0.32.0+cpu is 0.32.0."""
    return version.split("+", 1)[0] if version else None


def absent(distributions, files) -> dict:
    """The state of a venv that does not exist (yet)."""
    return {
        "exists": False,
        "site_packages": None,
        "versions": dict.fromkeys(distributions),
        "releases": dict.fromkeys(distributions),
        "files": dict.fromkeys(files),
        "entry_points": [],
    }


def present(state: dict) -> dict:
    return {"exists": True, **state, "releases": {name: release(value) for name, value in state["versions"].items()}}
