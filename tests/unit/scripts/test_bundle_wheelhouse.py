"""scripts/bundle-wheelhouse.py: vLLM's wheel made again from an unpacked tree, byte for byte, and the list."""

from __future__ import annotations

import csv
import importlib.util
import io
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "bundle-wheelhouse.py"
spec = importlib.util.spec_from_file_location("bundle_wheelhouse", SCRIPT)
bundle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bundle)

INFO = "vllm-0.26.0.dist-info"


def unpacked(tmp_path: Path) -> Path:
    """A tree as the bundle's site/ is: two of vLLM's files, its dist-info, RECORD cut to what is there."""
    site = tmp_path / "site"
    files = {
        "vllm/__init__.py": b"__version__ = '0.26.0'\n",
        "vllm/_C.abi3.so": bytes(range(256)) * 64,
        f"{INFO}/METADATA": b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n\nvLLM\n",
        f"{INFO}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp38-abi3-linux_x86_64\n",
        f"{INFO}/entry_points.txt": b"[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n",
    }
    rows = []
    for relative, data in files.items():
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_bytes(data)
        rows.append([relative, bundle.record_hash(data), len(data)])
    rows.append([f"{INFO}/RECORD", "", ""])
    with open(site / INFO / "RECORD", "w", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerows(rows)
    # What an import of the unpacked tree leaves: not part of the wheel.
    (site / "vllm" / "__pycache__").mkdir()
    (site / "vllm" / "__pycache__" / "__init__.cpython-312.pyc").write_bytes(b"byte code")
    return site


def deps(tmp_path: Path) -> Path:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("fastapi-0.136.3-py3-none-any.whl", "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.whl"):
        (wheels / name).write_bytes(b"a wheel")
    return wheels


def test_the_wheel_holds_the_tree_byte_for_byte_and_the_list_names_every_wheel(tmp_path):
    site = unpacked(tmp_path)
    uv_wheel = tmp_path / "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    uv_wheel.write_bytes(b"uv")
    fa2 = tmp_path / "opt_fa2" / "vllm" / "vllm_flash_attn"
    fa2.mkdir(parents=True)
    (fa2 / "_vllm_fa2_C.abi3.so").write_bytes(b"fa2 kernels")
    out = tmp_path / "out"
    assert bundle.main(["--site", str(site), "--deps", str(deps(tmp_path)), "--add", str(tmp_path / "opt_fa2"),
                        "--copy", str(uv_wheel), str(out)]) == 0  # fmt: skip

    assert sorted(path.name for path in out.iterdir()) == [
        "fastapi-0.136.3-py3-none-any.whl",
        "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.whl",
        uv_wheel.name,
        "vllm-0.26.0-cp38-abi3-linux_x86_64.whl",
        "vllm-0.26.0-requirements.txt",
    ]
    listed = (out / "vllm-0.26.0-requirements.txt").read_text().splitlines()
    assert listed[1:] == ["vllm==0.26.0", "fastapi==0.136.3", "pydantic-core==2.50.5"]
    with zipfile.ZipFile(out / "vllm-0.26.0-cp38-abi3-linux_x86_64.whl") as wheel:
        contents = {name: wheel.read(name) for name in wheel.namelist()}
    names = list(contents)
    assert names[-1] == f"{INFO}/RECORD" and all("__pycache__" not in name for name in names)
    for name in names[:-1]:
        source = fa2 / "_vllm_fa2_C.abi3.so" if name.endswith("_fa2_C.abi3.so") else site / name
        assert contents[name] == source.read_bytes(), name
    # RECORD lists every file with its hash and size, the added one too, and itself last.
    record = list(csv.reader(io.StringIO(contents[f"{INFO}/RECORD"].decode())))
    assert [row[0] for row in record] == names
    assert [(digest, int(size)) for _name, digest, size in record[:-1]] == [
        (bundle.record_hash(contents[name]), len(contents[name])) for name in names[:-1]
    ]


def test_a_file_that_differs_from_record_is_refused(tmp_path, capsys):
    site = unpacked(tmp_path)
    (site / "vllm" / "__init__.py").write_bytes(b"changed\n")
    assert bundle.main(["--site", str(site), "--deps", str(deps(tmp_path)), str(tmp_path / "out")]) == 1
    assert "vllm/__init__.py is not the file that RECORD lists" in capsys.readouterr().err


@pytest.mark.parametrize("what", ["missing", "clash"])
def test_a_tree_that_does_not_match_its_record_is_refused(tmp_path, capsys, what):
    site = unpacked(tmp_path)
    add = []
    if what == "missing":
        (site / "vllm" / "_C.abi3.so").unlink()
        message = "_C.abi3.so is missing, which RECORD lists"
    else:
        (tmp_path / "extra" / "vllm").mkdir(parents=True)
        (tmp_path / "extra" / "vllm" / "__init__.py").write_bytes(b"other")
        add = ["--add", str(tmp_path / "extra")]
        message = "--add files that RECORD lists already: ['vllm/__init__.py']"
    assert bundle.main(["--site", str(site), *add, str(tmp_path / "out")]) == 1
    assert message in capsys.readouterr().err
