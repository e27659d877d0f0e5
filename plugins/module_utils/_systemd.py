# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""systemd's own syntax: quoting for ExecStart= lines and EnvironmentFile= lines. Pure functions."""

from __future__ import annotations

import re

ENVIRONMENT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Outside quotes systemd splits on whitespace and treats quotes and backslashes specially.
EXEC_PLAIN_ARG = re.compile(r"[A-Za-z0-9_@%+=:,./$-]+\Z")


class SystemdSyntaxError(ValueError):
    """A value that systemd cannot carry on one line (a newline, a NUL, an invalid name)."""


def _refuse_control_characters(value, what):
    if any(ord(char) < 0x20 and char != "\t" for char in value):
        raise SystemdSyntaxError(f"{what} contains a control character (newline, NUL, ...): {value!r}")


def exec_arg(arg):
    """One argument of an Exec*= line, literal: `%` specifiers and `$` variables are escaped."""
    arg = str(arg)
    _refuse_control_characters(arg, "an ExecStart argument")
    if arg == ";":
        return "\\;"  # a lone ";" separates commands; "\;" is systemd's literal semicolon
    literal = arg.replace("%", "%%").replace("$", "$$")
    if literal and EXEC_PLAIN_ARG.match(literal):
        return literal
    return '"' + literal.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_line(args):
    """A whole Exec*= value from an argument list, each argument kept literal and whole."""
    if not args:
        raise SystemdSyntaxError("an Exec line needs at least the program to run")
    return " ".join(exec_arg(arg) for arg in args)


def environment_line(name, value):
    """`NAME="value"` for an EnvironmentFile, read back by systemd exactly as `value`."""
    if not isinstance(name, str) or not ENVIRONMENT_NAME.match(name):
        raise SystemdSyntaxError(f"{name!r} is not a valid environment variable name")
    value = "" if value is None else str(value)
    _refuse_control_characters(value, f"the value of {name}")
    escaped = re.sub(r'(["\\`$])', r"\\\1", value)
    return f'{name}="{escaped}"'


def environment_file(variables):
    """The lines of an EnvironmentFile, sorted by name so that a re-render is byte-identical."""
    return "".join(environment_line(name, variables[name]) + "\n" for name in sorted(variables))
