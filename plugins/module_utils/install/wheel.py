# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A pure-Python wheel from files given as text, byte for byte the same for the same input.

The vllm_install role puts the collection's helpers into a venv as a wheel that uv installs, so that the venv's
installer records every file (RECORD), lists the helpers, and removes them as it removes any distribution. The
wheel is made here rather than by a build backend: the helpers are a few modules and a .pth, a host may have no
index to fetch a backend from, and the same input must give the same bytes, so that an unchanged wheel is not
written again.
"""

from __future__ import annotations

import base64
import hashlib
import io
import posixpath
import re
import zipfile

# PEP 508's distribution names, and the versions of PEP 440 that the helpers use (a release and a local label).
NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
VERSION = re.compile(r"^[0-9]+(?:\.[0-9]+)*(?:\+[A-Za-z0-9]+(?:[._][A-Za-z0-9]+)*)?$")
ENTRY_POINT_GROUP = re.compile(r"^[A-Za-z0-9_.-]+$")
# module.path:callable, as entry_points.txt names an object.
OBJECT_REFERENCE = re.compile(r"^[A-Za-z_][\w.]*(?::[A-Za-z_][\w.]*)?$")
# 1980-01-01, the earliest time a zip file can hold: the same input gives the same bytes.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
GENERATOR = "llmops.vllm"


def wheel_problems(name, version, files, entry_points) -> list[str]:
    """What keeps the input from being a wheel, each naming the option."""
    problems = []
    if not isinstance(name, str) or not NAME.match(name):
        problems.append(f"name must be a distribution name (letters, digits, '.', '-', '_'), got {name!r}")
    if not isinstance(version, str) or not VERSION.match(version):
        problems.append(f"version must be a release with an optional local label (1.0, 1.0+abc), got {version!r}")
    if not isinstance(files, dict):
        problems.append("files must map paths inside the wheel to their text")
    else:
        for path, text in files.items():
            parts = path.split("/") if isinstance(path, str) else [""]
            if not isinstance(path, str) or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
                problems.append(f"files: {path!r} is not a relative path inside the wheel")
            elif parts[0].endswith(".dist-info"):
                problems.append(f"files: {path!r} is under a .dist-info directory, which the wheel writes itself")
            if not isinstance(text, str):
                problems.append(f"files: {path!r} must be given as text, got {type(text).__name__}")
    if not isinstance(entry_points, dict):
        problems.append("entry_points must map groups to {name: object reference}")
    else:
        for group, points in entry_points.items():
            if not ENTRY_POINT_GROUP.match(str(group)) or not isinstance(points, dict):
                problems.append(f"entry_points: group {group!r} must be a name mapping to {{name: object reference}}")
                continue
            for point, target in points.items():
                if not ENTRY_POINT_GROUP.match(str(point)) or not OBJECT_REFERENCE.match(str(target)):
                    problems.append(f"entry_points: {group}: {point!r} = {target!r} is not NAME = module:callable")
    return problems


def wheel_file_name(name: str, version: str) -> str:
    """NAME-VERSION-py3-none-any.whl, the name written as wheels write it (lower case, '_' for runs of -_.)."""
    return f"{escaped(name)}-{version}-py3-none-any.whl"


def escaped(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def build(name: str, version: str, files: dict, entry_points: dict, summary: str = "") -> bytes:
    """The wheel's bytes: `files` (path inside the wheel -> text) and a dist-info with METADATA, WHEEL, the entry
    points and RECORD. Call wheel_problems first: the input is taken as valid."""
    dist_info = f"{escaped(name)}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    if summary:
        metadata += f"Summary: {summary}\n"
    members = {path: text.encode("utf-8") for path, text in sorted(files.items())}
    members[f"{dist_info}/METADATA"] = metadata.encode()
    members[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    ).encode()
    if entry_points:
        members[f"{dist_info}/entry_points.txt"] = entry_points_text(entry_points).encode()
    record = posixpath.join(dist_info, "RECORD")
    lines = [f"{path},sha256={digest(content)},{len(content)}\n" for path, content in members.items()]
    members[record] = ("".join(lines) + f"{record},,\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, content in members.items():
            info = zipfile.ZipInfo(path, date_time=ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, content)
    return buffer.getvalue()


def entry_points_text(entry_points: dict) -> str:
    sections = []
    for group, points in sorted(entry_points.items()):
        sections.append(f"[{group}]\n" + "".join(f"{point} = {target}\n" for point, target in sorted(points.items())))
    return "\n".join(sections)


def digest(content: bytes) -> str:
    """RECORD's hash: urlsafe base64 of the SHA-256, without padding."""
    return base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
