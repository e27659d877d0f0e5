"""The one writer of the modules' files: only a difference is written, atomically, with the mode asked for."""

import os
import stat

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils import _file_writer
from ansible_collections.llmops.vllm.plugins.module_utils._file_writer import current_text, differs, write_if_changed


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("content", ["tiny: ä\n", b"\x89PNG\r\n\x1a\n\x00"], ids=["text", "bytes"])
def test_a_second_write_of_the_same_content_changes_nothing(tmp_path, content):
    path = str(tmp_path / "report")
    assert write_if_changed(path, content) is True
    written = os.stat(path)
    assert write_if_changed(path, content) is False
    assert os.stat(path).st_mtime_ns == written.st_mtime_ns
    assert (tmp_path / "report").read_bytes() == (content.encode() if isinstance(content, str) else content)
    assert os.listdir(tmp_path) == ["report"]  # no scratch file left


def test_new_content_replaces_the_old(tmp_path):
    path = str(tmp_path / "tiny.json")
    write_if_changed(path, "old\n")
    assert write_if_changed(path, "new\n") is True
    assert current_text(path) == "new\n"


def test_without_a_mode_a_report_is_readable_as_open_makes_it(tmp_path, umask_022):
    path = str(tmp_path / "tiny.md")
    write_if_changed(path, "| host |\n")
    assert mode(path) == 0o644
    os.chmod(path, 0o600)
    assert differs(path, "| host |\n") is False  # only the content counts


def test_with_a_mode_a_loosened_file_is_put_back(tmp_path):
    path = str(tmp_path / "tiny.env")
    assert write_if_changed(path, "VLLM_API_KEY=k\n", 0o600) is True
    assert mode(path) == 0o600
    os.chmod(path, 0o644)
    assert differs(path, "VLLM_API_KEY=k\n", 0o600) is True
    assert write_if_changed(path, "VLLM_API_KEY=k\n", 0o600) is True
    assert mode(path) == 0o600


def test_check_mode_says_what_would_change_and_writes_nothing(tmp_path):
    path = str(tmp_path / "tiny.json")
    assert write_if_changed(path, "{}\n", check_mode=True) is True
    assert current_text(path) is None and os.listdir(tmp_path) == []
    write_if_changed(path, "{}\n")
    assert write_if_changed(path, "{}\n", check_mode=True) is False


def test_a_failed_write_keeps_the_old_file_and_leaves_no_scratch(tmp_path, monkeypatch):
    path = str(tmp_path / "tiny.json")
    write_if_changed(path, "old\n")

    def refuse(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_file_writer.os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        write_if_changed(path, "new\n")
    assert current_text(path) == "old\n" and os.listdir(tmp_path) == ["tiny.json"]
