"""The wheel builder of the install: the same bytes for the same input, and a RECORD that matches the members."""

import base64
import hashlib
import io
import zipfile

from ansible_collections.llmops.vllm.plugins.module_utils.install.wheel import build, entry_points_text, wheel_file_name

FILES = {"b.py": "B = 1\n", "a.pth": "import b\n"}
POINTS = {"vllm.general_plugins": {"z": "b:z", "a": "b:a"}}


def test_the_same_input_gives_the_same_bytes():
    assert build("x-y", "1+abc", FILES, POINTS) == build("x-y", "1+abc", dict(reversed(FILES.items())), POINTS)


def test_record_lists_every_member_with_its_hash_and_size():
    archive = zipfile.ZipFile(io.BytesIO(build("x-y", "1+abc", FILES, POINTS, summary="S")))
    record = archive.read("x_y-1+abc.dist-info/RECORD").decode().splitlines()
    names = [line.split(",")[0] for line in record]
    assert names == archive.namelist() and names[:2] == ["a.pth", "b.py"]
    for line in record[:-1]:
        name, hashed, size = line.split(",")
        content = archive.read(name)
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
        assert (hashed, int(size)) == (f"sha256={digest}", len(content))
    assert record[-1] == "x_y-1+abc.dist-info/RECORD,,"
    assert "Summary: S\n" in archive.read("x_y-1+abc.dist-info/METADATA").decode()
    assert "Tag: py3-none-any\n" in archive.read("x_y-1+abc.dist-info/WHEEL").decode()


def test_entry_points_are_written_sorted_by_group_and_name():
    assert entry_points_text({"g2": {"b": "m:b"}, "g1": {"z": "m:z", "a": "m:a"}}) == (
        "[g1]\na = m:a\nz = m:z\n\n[g2]\nb = m:b\n"
    )


def test_the_file_name_is_written_as_wheels_write_names():
    assert wheel_file_name("LLMops.vllm-Helpers", "1+abc") == "llmops_vllm_helpers-1+abc-py3-none-any.whl"
