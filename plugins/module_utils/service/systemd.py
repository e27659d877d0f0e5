# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""systemd's own syntax: quoting for ExecStart= and EnvironmentFile= lines, and reading environments back."""

from __future__ import annotations

import re
import shlex

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


def unit_file_exec_start(text):
    """The argv of a unit file's ExecStart= line, as exec_line wrote it: quotes and `\\` escapes undone, `%%` and `$$`
    read as the literal `%` and `$`."""
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            return [arg.replace("$$", "$").replace("%%", "%") for arg in shlex.split(line[len("ExecStart=") :])]
    raise SystemdSyntaxError("the unit file has no ExecStart= line")


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


def parse_environment_assignments(text):
    """`systemctl show -P Environment UNIT` (`A=1 "B=two words"`) as a dict, later assignments winning."""
    variables = {}
    for assignment in shlex.split(text):
        name, sep, value = assignment.partition("=")
        if sep:
            variables[name] = value
    return variables


def parse_environment_directives(texts):
    """The `Environment=` lines of a unit file and its drop-ins, in the order systemd reads them, as a dict: each
    line's assignments over the earlier ones; an empty `Environment=` clears what came before."""
    variables = {}
    for text in texts:
        for line in text.splitlines():
            if line.startswith("Environment="):
                value = line[len("Environment=") :]
                variables = {**variables, **parse_environment_assignments(value)} if value.strip() else {}
    return variables


def parse_environment_file(text):
    """The variables of an EnvironmentFile as systemd reads it: `#`/`;` comments, quotes, `\\` escapes.

    Reads back what `environment_file` writes, and the plain `NAME=value` files people write by hand.
    """
    variables = {}
    logical = ""
    for line in text.splitlines():
        if line.endswith("\\") and not line.endswith("\\\\"):  # an unquoted line continues on the next
            logical += line[:-1]
            continue
        logical, line = "", logical + line
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        name, sep, value = stripped.partition("=")
        if sep and ENVIRONMENT_NAME.match(name.strip()):
            variables[name.strip()] = _unquote(value.strip())
    return variables


def _unquote(value):
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        quote, body = value[0], value[1:-1]
        return re.sub(r"\\(.)", r"\1", body) if quote == '"' else body
    return value


ENVIRONMENT_FILES_ENTRY = re.compile(r"(?P<path>.+) \(ignore_errors=(?P<optional>yes|no)\)\Z")


def parse_environment_files_property(text):
    """`systemctl show -P EnvironmentFiles UNIT`: `[(path, optional)]`; optional files were set with `-`."""
    found = []
    for line in text.splitlines():
        match = ENVIRONMENT_FILES_ENTRY.match(line.strip())
        if match:
            found.append((match.group("path"), match.group("optional") == "yes"))
    return found
