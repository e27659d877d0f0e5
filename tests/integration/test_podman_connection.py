"""The collection's podman connection (llmops.vllm.podman) against the real local host, without vLLM: a module
piped in one `podman exec`, files in and out byte for byte, check mode, a user and become, an async job, and
the modules' temporary files left nowhere."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

from .conftest import ROOT, LocalHost

# One `podman exec` as the connection logs it at -vvv.
PODMAN_EXEC = re.compile(r"^<[^>]+> RUN \[.*'exec'.*$", re.MULTILINE)


def ansible(host: LocalHost, *args: str) -> subprocess.CompletedProcess:
    """An ad-hoc `ansible` command against the host, at -vvv so that each podman call is logged."""
    command = ["ansible", host.name, "-i", str(host.inventory), "-vvv", *args]
    env = {**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT, check=False)


def result(host: LocalHost, proc: subprocess.CompletedProcess) -> dict:
    """The task's result in the JSON report, which comes after the -vvv lines and alone opens a line with `{`."""
    output = "\n" + proc.stdout
    try:
        report = json.loads(output[output.rindex("\n{\n") :])
        return report["plays"][0]["tasks"][0]["hosts"][host.name]
    except (ValueError, KeyError, IndexError) as exc:
        raise AssertionError(f"no result:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}") from exc


def test_a_module_is_piped_in_one_podman_exec(local_host):
    proc = ansible(local_host, "-m", "ansible.builtin.ping")
    assert result(local_host, proc)["ping"] == "pong", proc.stdout
    [podman_exec] = PODMAN_EXEC.findall(proc.stdout)
    assert "'--interactive'" in podman_exec


def test_without_pipelining_the_module_goes_through_a_temporary_file(local_host):
    proc = ansible(local_host, "-m", "ansible.builtin.ping", "-e", "ansible_pipelining=false")
    assert result(local_host, proc)["ping"] == "pong", proc.stdout
    # The temporary directory, the module's file written into it, its mode, the run (which removes it).
    assert "PUT " in proc.stdout
    assert len(PODMAN_EXEC.findall(proc.stdout)) >= 3, proc.stdout


@pytest.fixture
def random_file(tmp_path):
    path = tmp_path / "random.bin"
    path.write_bytes(os.urandom(300_000) + b"\x00\xff\n")
    return path


def test_a_file_goes_in_and_comes_back_byte_for_byte(local_host, random_file, tmp_path):
    dest = "/srv/podman-connection/random.bin"
    local_host.sh(f"rm -rf {os.path.dirname(dest)} && mkdir {os.path.dirname(dest)}")
    copied = result(
        local_host, ansible(local_host, "-m", "ansible.builtin.copy", "-a", f"src={random_file} dest={dest} mode=0640")
    )
    assert copied["changed"] and not copied.get("failed"), copied
    assert local_host.sh(f"stat -c %a {dest}").stdout.strip() == "640"

    again = result(
        local_host, ansible(local_host, "-m", "ansible.builtin.copy", "-a", f"src={random_file} dest={dest} mode=0640")
    )
    assert not again["changed"], again

    fetched = result(
        local_host,
        ansible(local_host, "-m", "ansible.builtin.fetch", "-a", f"src={dest} dest={tmp_path}/back/ flat=true"),
    )
    assert not fetched.get("failed"), fetched
    assert (tmp_path / "back" / "random.bin").read_bytes() == random_file.read_bytes()


def test_check_mode_predicts_without_writing(local_host, random_file):
    dest = "/srv/podman-connection/checked.bin"
    local_host.sh(f"mkdir -p {os.path.dirname(dest)} && rm -f {dest}")
    checked = result(
        local_host, ansible(local_host, "--check", "-m", "ansible.builtin.copy", "-a", f"src={random_file} dest={dest}")
    )
    assert checked["changed"], checked
    assert local_host.sh(f"test -e {dest}", check=False).returncode == 1


def test_the_user_and_become_run_where_they_say(local_host):
    as_user = result(local_host, ansible(local_host, "-u", "nobody", "-m", "ansible.builtin.command", "-a", "id -un"))
    assert as_user["stdout"] == "nobody", as_user
    # su (sudo is not in the image) from root to a user without a login shell: Ansible turns pipelining off for su,
    # so the module goes through a temporary file that the user must be able to read. As extra vars, which outrank
    # the inventory's ansible_become: false.
    become_vars = {
        "ansible_become": True,
        "ansible_become_method": "su",
        "ansible_become_user": "nobody",
        "ansible_become_flags": "-s /bin/sh",
    }
    become = result(
        local_host, ansible(local_host, "-e", json.dumps(become_vars), "-m", "ansible.builtin.command", "-a", "id -un")
    )
    assert become["stdout"] == "nobody", become


def test_an_async_job_runs_and_reports(local_host):
    job = result(
        local_host, ansible(local_host, "-B", "60", "-P", "1", "-m", "ansible.builtin.command", "-a", "echo done")
    )
    assert job["stdout"] == "done" and job.get("finished") == 1, job


def test_no_temporary_files_are_left(local_host):
    ansible(local_host, "-m", "ansible.builtin.ping")
    ansible(local_host, "-m", "ansible.builtin.ping", "-e", "ansible_pipelining=false")
    # An async job's wrapper removes its directory after it has written the result that the poll reads, so the
    # directory of the async test before this one may outlive the poll by a moment: wait for it, bounded.
    deadline = time.monotonic() + 20
    while True:
        listed = local_host.sh("ls -A /root/.ansible/tmp 2>/dev/null || true").stdout.split()
        left = [name for name in listed if name.startswith("ansible-tmp-")]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left, left
