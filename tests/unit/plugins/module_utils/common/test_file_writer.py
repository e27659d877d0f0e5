"""The one writer of the modules' files: only a difference is written, atomically through Ansible's atomic_move,
with the mode asked for, never wider for an instant."""

import os
import stat

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.common.file_writer import (
    current_text,
    differs,
    directory_problem,
    write_if_changed,
)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture
def module(ansible_module):
    return ansible_module()


@pytest.mark.parametrize("content", ["tiny: ä\n", b"\x89PNG\r\n\x1a\n\x00"], ids=["text", "bytes"])
def test_a_second_write_of_the_same_content_changes_nothing(tmp_path, module, content):
    path = str(tmp_path / "report")
    assert write_if_changed(module, path, content) is True
    written = os.stat(path)
    assert write_if_changed(module, path, content) is False
    assert os.stat(path).st_mtime_ns == written.st_mtime_ns
    assert (tmp_path / "report").read_bytes() == (content.encode() if isinstance(content, str) else content)
    assert os.listdir(tmp_path) == ["report"]  # no scratch file left


def test_new_content_replaces_the_old(tmp_path, module):
    path = str(tmp_path / "tiny.json")
    write_if_changed(module, path, "old\n")
    assert write_if_changed(module, path, "new\n") is True
    assert current_text(path) == "new\n"


def test_without_a_mode_a_new_report_is_readable_as_open_makes_it_and_a_rewritten_one_keeps_its_mode(
    tmp_path, module, umask_022
):
    path = str(tmp_path / "tiny.md")
    write_if_changed(module, path, "| host |\n")
    assert mode(path) == 0o644
    os.chmod(path, 0o600)
    assert differs(path, "| host |\n") is False  # only the content counts
    write_if_changed(module, path, "| host | C=1 |\n")
    assert mode(path) == 0o600


def test_with_a_mode_a_loosened_file_is_put_back(tmp_path, module):
    path = str(tmp_path / "tiny.env")
    assert write_if_changed(module, path, "VLLM_API_KEY=k\n", 0o600) is True
    assert mode(path) == 0o600
    os.chmod(path, 0o644)
    assert differs(path, "VLLM_API_KEY=k\n", 0o600) is True
    assert write_if_changed(module, path, "VLLM_API_KEY=k\n", 0o600) is True
    assert mode(path) == 0o600


@pytest.mark.parametrize("exists", [False, True], ids=["new", "loosened"])
def test_new_content_is_never_wider_than_its_mode(tmp_path, module, monkeypatch, umask_022, exists):
    """The mode of the path at the instant atomic_move puts the new content there, and after."""
    path = str(tmp_path / "tiny.env")
    if exists:
        write_if_changed(module, path, "VLLM_API_KEY=old\n", 0o600)
        os.chmod(path, 0o644)
    seen = []
    move = module.atomic_move

    def watched_move(source, destination, *args, **kwargs):
        move(source, destination, *args, **kwargs)
        seen.append(mode(destination))

    monkeypatch.setattr(module, "atomic_move", watched_move)
    write_if_changed(module, path, "VLLM_API_KEY=new\n", 0o600)
    assert seen == [0o600] and mode(path) == 0o600 and os.umask(0o022) == 0o022


def test_check_mode_says_what_would_change_and_writes_nothing(tmp_path, module, ansible_module):
    path = str(tmp_path / "tiny.json")
    checking = ansible_module(check_mode=True)
    assert write_if_changed(checking, path, "{}\n") is True
    assert current_text(path) is None and os.listdir(tmp_path) == []
    write_if_changed(module, path, "{}\n")
    assert write_if_changed(checking, path, "{}\n") is False


def test_a_failed_write_keeps_the_old_file_and_leaves_no_scratch(tmp_path, module, monkeypatch):
    path = str(tmp_path / "tiny.json")
    write_if_changed(module, path, "old\n")

    def refuse(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "rename", refuse)
    with pytest.raises(Exception, match="Could not replace"):
        write_if_changed(module, path, "new\n")
    assert current_text(path) == "old\n" and os.listdir(tmp_path) == ["tiny.json"]


def test_a_directory_that_exists_or_can_be_made_has_no_problem(tmp_path):
    assert directory_problem(str(tmp_path), "dest") is None
    assert directory_problem(str(tmp_path / "new" / "deeper"), "dest") is None


@pytest.mark.parametrize(
    ("below", "found"),
    [("", "it is a file"), ("reports", "{file} is a file"), ("reports/tiny", "{file} is a file")],
)
def test_a_directory_under_a_regular_file_is_refused_naming_the_option_and_the_file(tmp_path, below, found):
    file = tmp_path / "results.txt"
    file.write_text("not a directory")
    path = str(file / below) if below else str(file)
    problem = directory_problem(path, "dest")
    assert problem == f"dest {path!r} cannot be a directory: {found.format(file=file)}, not a directory"


def test_a_relative_directory_is_refused(tmp_path):
    assert directory_problem("bench-results", "dest") == "dest must be an absolute directory, got 'bench-results'"
