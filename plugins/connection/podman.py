# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: podman
short_description: Run tasks in a running podman container, modules piped in
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Runs tasks in an existing podman container with C(podman exec), as C(containers.podman.podman) does, with
    the same options and variables, and with pipelining, which that plugin lacks.
  - With pipelining a module goes to the interpreter on the command's standard input (C(podman exec --interactive)),
    as it does over SSH with pipelining on. Each module call is then one C(podman exec), where
    C(containers.podman.podman) makes five (the home directory, a temporary directory, the file's mode, the run,
    the removal) and copies the module's file into the mounted container.
  - Files (the copy of a C(src), an async module, a fetch) go through C(podman exec --interactive) too, without
    mounting the container or running C(podman cp).
  - The container needs C(/bin/sh) and C(cat), besides the Python that runs the modules.
notes:
  - C(containers.podman.podman) passes a piped module to C(podman exec) without C(--interactive), so that podman
    never hands it to the interpreter, and it stopped declaring pipelining in containers.podman 1.6.2
    (containers.podman pull request 275). Here the module is passed with C(--interactive).
  - Podman before 1.8 lost or cut short what was piped into C(podman exec --interactive) (podman issues 4326,
    4971, 5046); set O(pipelining=false) with a podman that old.
  - Become works as with any connection (Ansible wraps the command); a become password prompt is not answered,
    as with C(containers.podman.podman).
options:
  remote_addr:
    description: The name or ID of the container.
    type: str
    default: inventory_hostname
    vars:
      - name: inventory_hostname
      - name: ansible_host
      - name: ansible_podman_host
  remote_user:
    description: The user, by name or UID, that runs commands in the container; by default the container's own.
    type: str
    ini:
      - section: defaults
        key: remote_user
    env:
      - name: ANSIBLE_REMOTE_USER
    vars:
      - name: ansible_user
  podman_executable:
    description: The podman command.
    type: str
    default: podman
    env:
      - name: ANSIBLE_PODMAN_EXECUTABLE
    vars:
      - name: ansible_podman_executable
  podman_extra_args:
    description: Arguments put between the podman command and its subcommand, such as C(--log-level debug).
    type: str
    default: ''
    ini:
      - section: defaults
        key: podman_extra_args
    env:
      - name: ANSIBLE_PODMAN_EXTRA_ARGS
    vars:
      - name: ansible_podman_extra_args
  pipelining:
    description:
      - Pipe each module into the interpreter instead of copying it into a temporary directory first.
      - On by default, which is what this plugin is for; the settings that turn Ansible's pipelining off turn it
        off here too.
    type: boolean
    default: true
    ini:
      - section: defaults
        key: pipelining
      - section: connection
        key: pipelining
    env:
      - name: ANSIBLE_PIPELINING
    vars:
      - name: ansible_pipelining
      - name: ansible_podman_pipelining
"""

EXAMPLES = r"""
# inventory: a local host booted with systemd in a podman container (scripts/local-host.sh up)
vllm_hosts:
  hosts:
    llmops-vllm-local:
      ansible_connection: llmops.vllm.podman
      ansible_python_interpreter: /usr/bin/python3
"""

import shlex
import subprocess

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.module_utils.common.process import get_bin_path
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection import ConnectionBase, ensure_connect
from ansible.utils.display import Display

display = Display()


def podman_exec_argv(podman: list[str], container: str, command: list[str], user: str = "", stdin: bool = False):
    """The argument list of a `podman exec` of command in container: podman (the executable and its extra
    arguments), --interactive when something goes to the command's standard input, --user when one is set."""
    argv = [*podman, "exec"]
    if stdin:
        argv.append("--interactive")
    if user:
        argv += ["--user", user]
    return [*argv, container, *command]


class Connection(ConnectionBase):
    """podman exec into a running container, stdin passed so that modules can be piped in."""

    transport = "llmops.vllm.podman"
    has_pipelining = True

    def _connect(self):
        """There is nothing to open: each command is a podman exec of its own."""
        super()._connect()
        self._connected = True
        return self

    def _exec(self, command: list[str], in_data: bytes | None = None, stdout=subprocess.PIPE):
        """Run command in the container with in_data on its standard input."""
        name = self.get_option("podman_executable")
        try:
            executable = get_bin_path(name)
        except ValueError as exc:
            raise AnsibleError(f"podman_executable {name!r} is not on PATH: {exc}") from exc
        argv = podman_exec_argv(
            [executable, *shlex.split(self.get_option("podman_extra_args"))],
            self.get_option("remote_addr"),
            command,
            user=self.get_option("remote_user") or "",
            stdin=in_data is not None,
        )
        display.vvv(f"RUN {argv}", host=self.get_option("remote_addr"))
        return subprocess.run(
            [to_bytes(arg, errors="surrogate_or_strict") for arg in argv],
            input=in_data,
            stdin=None if in_data is not None else subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.PIPE,
            check=False,
        )

    @ensure_connect
    def exec_command(self, cmd, in_data=None, sudoable=False):
        """Run cmd in the container, with in_data (a piped module) on its standard input."""
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        proc = self._exec(shlex.split(to_text(cmd, errors="surrogate_or_strict")), in_data)
        return proc.returncode, proc.stdout, proc.stderr

    @ensure_connect
    def put_file(self, in_path, out_path):
        """Write the local file in_path to out_path in the container, as the user that runs the commands."""
        super().put_file(in_path, out_path)
        display.vvv(f"PUT {in_path} TO {out_path}", host=self.get_option("remote_addr"))
        with open(to_bytes(in_path, errors="surrogate_or_strict"), "rb") as source:
            data = source.read()
        write = f"cat > {shlex.quote(to_text(out_path, errors='surrogate_or_strict'))}"
        proc = self._exec(["/bin/sh", "-c", write], data)
        if proc.returncode != 0:
            container = self.get_option("remote_addr")
            raise AnsibleConnectionFailure(f"failed to write {out_path} in {container}: {to_text(proc.stderr)}")

    @ensure_connect
    def fetch_file(self, in_path, out_path):
        """Copy in_path of the container to the local file out_path."""
        super().fetch_file(in_path, out_path)
        display.vvv(f"FETCH {in_path} TO {out_path}", host=self.get_option("remote_addr"))
        with open(to_bytes(out_path, errors="surrogate_or_strict"), "wb") as target:
            proc = self._exec(["cat", "--", to_text(in_path, errors="surrogate_or_strict")], stdout=target)
        if proc.returncode != 0:
            container = self.get_option("remote_addr")
            raise AnsibleConnectionFailure(f"failed to read {in_path} in {container}: {to_text(proc.stderr)}")

    def close(self):
        super().close()
        self._connected = False
