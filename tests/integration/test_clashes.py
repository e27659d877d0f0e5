"""Instances that cannot run together on a host are refused by deploy.yml before anything changes on it."""

import json


def tiny_main_pid(host) -> str:
    return host.sh("systemctl show -p MainPID --value vllm-tiny.service").stdout.strip()


def test_two_new_instances_on_one_port_are_refused_before_any_change(deployed):
    pid = tiny_main_pid(deployed)
    instances = [{"model": "tiny"}, {"name": "tiny-c", "model": "tiny", "port": 8000}]
    proc = deployed.playbook("playbooks/deploy.yml", "-e", json.dumps({"vllm_instances": instances}))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-4000:]
    assert "instances tiny and tiny-c both use port 8000" in output
    # Refused by the preflight: the install role never ran, no file of tiny-c was written, tiny served throughout.
    assert "TASK [llmops.vllm.vllm_install" not in proc.stdout
    leftovers = deployed.sh(
        "ls /etc/systemd/system/vllm-tiny-c.service /etc/vllm/tiny-c.json /etc/vllm/tiny-c.env 2>/dev/null || true"
    ).stdout.split()
    assert leftovers == []
    assert tiny_main_pid(deployed) == pid


def test_a_new_instance_on_the_port_of_a_running_one_is_refused_and_named(deployed):
    proc = deployed.playbook(
        "playbooks/deploy.yml", "-e", json.dumps({"vllm_instances": [{"name": "tiny-c", "model": "tiny"}]})
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-4000:]
    assert "instance tiny-c would use port 8000 of instance tiny, which is running" in output
    assert "TASK [llmops.vllm.vllm_install" not in proc.stdout


def test_open_files_that_systemd_cannot_grant_are_refused_before_the_unit_is_written(deployed):
    """systemd gives a unit what it can of LimitNOFILE= without a word; above the kernel's nr_open nothing can."""
    pid = tiny_main_pid(deployed)
    unit = deployed.sh("cat /etc/systemd/system/vllm-tiny.service").stdout
    too_many = int(deployed.sh("cat /proc/sys/fs/nr_open").stdout) + 1
    proc = deployed.playbook("playbooks/deploy.yml", "-e", "model=tiny", "-e", f"vllm_server_limit_nofile={too_many}")
    output = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, output[-4000:]
    assert f"Instance tiny: vllm_server_limit_nofile asks LimitNOFILE={too_many}, and systemd grants" in output
    assert "or lower vllm_server_limit_nofile" in output
    assert deployed.sh("cat /etc/systemd/system/vllm-tiny.service").stdout == unit
    assert tiny_main_pid(deployed) == pid
