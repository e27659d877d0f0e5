# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Make the wheelhouse that vllm_install installs from on a host with its own CUDA PyTorch, from an unpacked vLLM
bundle (../shared/gpu/: vLLM stripped into site/, and the wheels of what the GPU machine's image lacks).

    python3 scripts/bundle-wheelhouse.py --site WORK/core/site --deps WORK/core/wheels \\
        [--add WORK/opt_fa2] [--add WORK/opt_moe] [--copy UV_WHEEL] OUT

OUT gets, flat (docs/install.md, "On a host whose CUDA PyTorch is already installed"):
- vLLM's wheel again, re-zipped from --site with its dist-info: every file that the bundle's cut RECORD lists,
  checked against RECORD's SHA-256 (byte-identical to the wheel's), and the files of each --add tree (the
  bundle's optional archives), which RECORD then lists too. The entries are stored, not compressed: the wheel
  stays on the host's disk, and storing 300 MB takes a second where deflating it takes a minute.
- each wheel of the --deps directories, and each --copy file (uv's wheel);
- NAME-VERSION-requirements.txt: vLLM and each --deps wheel, NAME==VERSION, which the role installs without
  dependencies on the base interpreter's torch (vllm_install_base_python).

Standard library only: it runs with any Python 3.8+ (the GPU machine's, for one). A second run replaces what the
first one wrote.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import shutil
import sys
import time
import zipfile
from pathlib import Path

# Python's byte code and caches that an import of the unpacked tree leaves beside the sources.
SKIPPED_PARTS = ("__pycache__",)
SKIPPED_SUFFIXES = (".pyc",)


class BundleError(Exception):
    """The bundle is not what this script can turn into a wheelhouse; the message says what was found."""


def record_hash(data: bytes) -> str:
    """A file's hash as a wheel's RECORD writes it."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def dist_info(site: Path) -> Path:
    found = sorted(site.glob("*.dist-info"))
    if len(found) != 1:
        raise BundleError(f"{site} must hold one *.dist-info directory, vLLM's; found {[p.name for p in found]}")
    return found[0]


def metadata(info: Path) -> tuple[str, str, list[str]]:
    """The distribution's name, version and wheel tags, from METADATA and WHEEL."""
    fields = {}
    for line in (info / "METADATA").read_text(encoding="utf-8").splitlines():
        if not line:
            break
        key, _separator, value = line.partition(": ")
        fields.setdefault(key, value)
    tags = [
        line.split(": ", 1)[1]
        for line in (info / "WHEEL").read_text(encoding="utf-8").splitlines()
        if line.startswith("Tag: ")
    ]
    if "Name" not in fields or "Version" not in fields or not tags:
        raise BundleError(f"{info} lacks a Name or Version in METADATA, or a Tag in WHEEL")
    return fields["Name"], fields["Version"], tags


def wheel_name(name: str, version: str, tags: list[str]) -> str:
    """The wheel's file name; several tags of one interpreter and ABI share the platform part (PEP 425)."""
    interpreters, abis, platforms = (sorted({tag.split("-")[part] for tag in tags}) for part in range(3))
    tag = "-".join(".".join(part) for part in (interpreters, abis, platforms))
    return f"{name.replace('-', '_')}-{version}-{tag}.whl"


def added_files(trees: list[Path]) -> dict[str, Path]:
    """Each file of the --add trees by its path in the wheel, byte code left out."""
    files = {}
    for tree in trees:
        for path in sorted(tree.rglob("*")):
            relative = path.relative_to(tree).as_posix()
            if (
                path.is_file()
                and not set(SKIPPED_PARTS) & set(relative.split("/"))
                and path.suffix not in SKIPPED_SUFFIXES
            ):
                files[relative] = path
    return files


def zip_info(name: str, path: Path) -> zipfile.ZipInfo:
    """The entry of a file, with its own time (not before 1980, zip's epoch) and permissions."""
    stat = path.stat()
    info = zipfile.ZipInfo(name, time.gmtime(max(stat.st_mtime, 315532800))[:6])
    info.external_attr = (stat.st_mode & 0o777 | 0o100000) << 16
    info.compress_type = zipfile.ZIP_STORED
    return info


def rezip(site: Path, trees: list[Path], out: Path) -> tuple[str, str, Path]:
    """vLLM's wheel from the unpacked tree: (name, version, wheel path)."""
    info = dist_info(site)
    name, version, tags = metadata(info)
    record_name = f"{info.name}/RECORD"
    with open(info / "RECORD", newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.reader(handle) if row and row[0] != record_name]
    listed = {row[0] for row in rows}
    extra = added_files(trees)
    clashes = sorted(set(extra) & listed)
    if clashes:
        raise BundleError(f"--add files that RECORD lists already: {clashes[:5]}")
    wheel = out / wheel_name(name, version, tags)
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    partial = wheel.with_name(wheel.name + ".part")
    with zipfile.ZipFile(partial, "w") as archive:
        # The dist-info last, RECORD at its end, as wheels have it.
        ordered = sorted(rows, key=lambda row: row[0].startswith(info.name + "/"))
        for relative, expected, _size in ordered:
            data = (site / relative).read_bytes() if (site / relative).is_file() else None
            if data is None:
                raise BundleError(f"{site / relative} is missing, which RECORD lists")
            if expected and record_hash(data) != expected:
                raise BundleError(f"{site / relative} is not the file that RECORD lists ({expected})")
            archive.writestr(zip_info(relative, site / relative), data)
            writer.writerow([relative, record_hash(data), len(data)])
        for relative, path in extra.items():
            data = path.read_bytes()
            archive.writestr(zip_info(relative, path), data)
            writer.writerow([relative, record_hash(data), len(data)])
        writer.writerow([record_name, "", ""])
        archive.writestr(zip_info(record_name, info / "RECORD"), record.getvalue())
    partial.replace(wheel)
    return name, version, wheel


def wheel_requirement(path: Path) -> str:
    """NAME==VERSION of a wheel, from its file name (NAME-VERSION[-BUILD]-PY-ABI-PLATFORM.whl)."""
    parts = path.name[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        raise BundleError(f"{path.name} is not the file name of a wheel")
    return f"{parts[0].replace('_', '-')}=={parts[1]}"


def place(source: Path, out: Path) -> None:
    """The wheel in OUT: a hard link where the file system allows one, else a copy."""
    target = out / source.name
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def build(site: Path, deps: list[Path], trees: list[Path], copies: list[Path], out: Path) -> Path:
    """The wheelhouse in OUT; returns its requirements list."""
    out.mkdir(parents=True, exist_ok=True)
    name, version, _wheel = rezip(site, trees, out)
    requirements = [f"{name}=={version}"]
    for directory in deps:
        wheels = sorted(directory.glob("*.whl"))
        if not wheels:
            raise BundleError(f"{directory} holds no wheels")
        for wheel in wheels:
            requirements.append(wheel_requirement(wheel))
            place(wheel, out)
    for wheel in copies:
        place(wheel, out)
    listed = out / f"{name}-{version}-requirements.txt"
    header = f"# {name} {version} and what the base interpreter lacks: installed as they are, without dependencies.\n"
    listed.write_text(header + "".join(f"{line}\n" for line in requirements), encoding="utf-8")
    return listed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site", type=Path, required=True, help="the unpacked vLLM tree, with its dist-info")
    parser.add_argument("--deps", type=Path, action="append", default=[], help="a directory of dependency wheels")
    parser.add_argument("--add", type=Path, action="append", default=[], help="a tree of files to add to vLLM's wheel")
    parser.add_argument("--copy", type=Path, action="append", default=[], help="a wheel to copy, not to list (uv)")
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    try:
        listed = build(args.site, args.deps, args.add, args.copy, args.out)
    except (BundleError, OSError) as error:
        print(f"bundle-wheelhouse: {error}", file=sys.stderr)
        return 1
    print(f"bundle-wheelhouse: {args.out}: {len(listed.read_text().splitlines()) - 1} wheels listed in {listed.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
