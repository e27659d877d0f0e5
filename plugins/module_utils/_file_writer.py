# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one way the modules write a file they own: only when it differs from what is wanted, and atomically."""

from __future__ import annotations

import os
import tempfile


def check_file_name(name, option: str) -> str:
    """`name` when it names a file inside a directory (a host's report, HOST.json); ValueError naming `option`."""
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"{option} must be a file name, without '/', got {name!r}")
    return name


def current_text(path: str) -> str | None:
    """A file's text, None when there is none."""
    content = _current_bytes(path)
    return None if content is None else content.decode("utf-8", "replace")


def differs(path: str, content: str | bytes, mode: int | None = None) -> bool:
    """Whether the file lacks `content` or, with `mode`, that mode and (when root asks) root's ownership."""
    if _current_bytes(path) != _as_bytes(content):
        return True
    if mode is None:
        return False
    status = os.stat(path)
    return status.st_mode & 0o7777 != mode or (os.geteuid() == 0 and (status.st_uid, status.st_gid) != (0, 0))


def write_if_changed(path: str, content: str | bytes, mode: int | None = None, check_mode: bool = False) -> bool:
    """Make the file hold `content` (text is written as UTF-8); True when it changed, or in check mode would.

    With `mode`, the file gets that mode and, when root writes, root's ownership: an instance's files. Without,
    a file that is new or rewritten gets the mode that the umask gives: reports.
    Atomic: a reader sees the old file or the new one, never a part.
    """
    if not differs(path, content, mode):
        return False
    if check_mode:
        return True
    descriptor, scratch = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".llmops-", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as scratch_file:
            scratch_file.write(_as_bytes(content))
        os.chmod(scratch, _umask_mode() if mode is None else mode)
        if mode is not None and os.geteuid() == 0:
            os.chown(scratch, 0, 0)
        os.replace(scratch, path)
    except BaseException:
        if os.path.exists(scratch):
            os.unlink(scratch)
        raise
    return True


def _current_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as current:
            return current.read()
    except FileNotFoundError:
        return None


def _as_bytes(content: str | bytes) -> bytes:
    return content.encode("utf-8") if isinstance(content, str) else content


def _umask_mode() -> int:
    """The mode open() gives a new file: mkstemp's 0600 would hide a report from its readers."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask
