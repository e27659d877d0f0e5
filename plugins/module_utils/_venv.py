# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a Python venv holds, read by its own interpreter in one run: releases, files, entry points.

The install role reads every venv it may use once, before anything changes, and acts only on what differs.
`INSPECT` runs inside the venv (its interpreter knows its own site-packages and metadata); `request` and
`parse` are pure.
"""

from __future__ import annotations

import json
import posixpath

# Runs as `VENV/bin/python -c INSPECT REQUEST_JSON`; prints one JSON object. Standard library only.
INSPECT = r"""
import hashlib, json, os, sys, sysconfig
import importlib.metadata as metadata
request = json.loads(sys.argv[1])
site_packages = sysconfig.get_paths()["purelib"]

def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None

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


class VenvError(ValueError):
    """A venv's interpreter that answered something else than INSPECT prints."""


def python_of(venv: str) -> str:
    return posixpath.join(venv, "bin", "python")


def request(distributions, files, entry_point_group) -> str:
    return json.dumps(
        {"distributions": list(distributions), "files": list(files), "entry_point_group": entry_point_group or ""}
    )


def parse(venv: str, stdout: str) -> dict:
    """INSPECT's answer, checked; VenvError names the venv."""
    try:
        state = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise VenvError(f"the interpreter of {venv} printed no state: {stdout[-300:]!r}") from None
    if not isinstance(state, dict) or set(state) != {"site_packages", "versions", "files", "entry_points"}:
        raise VenvError(f"the interpreter of {venv} printed {state!r}, not the state of a venv")
    return state


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
