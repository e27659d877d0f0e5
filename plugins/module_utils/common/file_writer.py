# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one way the modules write a file they own: only when it differs from what is wanted, atomically, through
Ansible's atomic_move."""

from __future__ import annotations

import os
import tempfile


def check_file_name(name, option: str) -> str:
    """`name` when it names a file inside a directory (a host's report, HOST.json); ValueError naming `option`."""
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"{option} must be a file name, without '/', got {name!r}")
    return name


def directory_problem(path: str, option: str) -> str | None:
    """Why `path` cannot be (made) a directory, naming `option`: it, or the nearest of its parents that exists, is
    not one. None when it is one or can be made."""
    if not os.path.isabs(path):
        return f"{option} must be an absolute directory, got {path!r}"
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if os.path.isdir(existing):
        return None
    what = "it" if existing == path else existing
    return f"{option} {path!r} cannot be a directory: {what} is a file, not a directory"


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


def write_if_changed(module, path: str, content: str | bytes, mode: int | None = None) -> bool:
    """Make the file hold `content` (text is written as UTF-8); True when it changed, or in `module`'s check mode
    would.

    With `mode`, the file gets that mode and, when root writes, root's ownership: an instance's files. Without,
    a new file gets the mode that the umask gives and a rewritten one keeps its own: reports.
    Written through Ansible's atomic_move: a reader sees the old file or the new one, never a part, and the file
    keeps its SELinux context (a new one gets its path's default), as files that Ansible's own modules write do.
    """
    if not differs(path, content, mode):
        return False
    if module.check_mode:
        return True
    if mode is not None and os.path.exists(path):
        _own(path, mode)  # atomic_move gives the new content the old file's mode and owner
    descriptor, scratch = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".llmops-", suffix=".tmp")
    # atomic_move gives a file it creates the umask's mode: with `mode`, no wider than it, not for an instant.
    umask = os.umask(0o777 & ~mode) if mode is not None else None
    try:
        with os.fdopen(descriptor, "wb") as scratch_file:
            scratch_file.write(_as_bytes(content))
        module.atomic_move(scratch, path)
    except BaseException:
        if os.path.exists(scratch):
            os.unlink(scratch)
        raise
    finally:
        if umask is not None:
            os.umask(umask)
    if mode is not None:
        _own(path, mode)
    return True


def _own(path: str, mode: int):
    """The file's mode, and root's ownership when root writes it."""
    os.chmod(path, mode)
    if os.geteuid() == 0:
        os.chown(path, 0, 0)


def _current_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as current:
            return current.read()
    except FileNotFoundError:
        return None


def _as_bytes(content: str | bytes) -> bytes:
    return content.encode("utf-8") if isinstance(content, str) else content
