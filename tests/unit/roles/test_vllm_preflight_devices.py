"""The vllm_preflight role on a GPU host without /dev/nvidia-uvm: refused before any change, with the commands
that make the device. This machine has no GPU: its GPU facts are given on the command line (extra vars stand
above the facts that gpu_facts sets), so the role's own tasks run as they would on such a host."""

GPU_HOST = {"vllm_gpus": {"present": True, "count": 1, "gpus": []}}


def test_a_gpu_host_without_the_uvm_device_is_refused_with_the_commands_that_make_it(run_role_tasks):
    rc, failures = run_role_tasks(
        "vllm_preflight",
        "main",
        {"vllm_preflight_instances": [{"model": "tiny"}]},
        GPU_HOST | {"vllm_preflight_nvidia_devices": ["/dev/null", "/dev/llmops-test-nvidia-uvm"]},
    )
    assert rc == 2
    (message,) = failures
    assert message.startswith("/dev/llmops-test-nvidia-uvm missing on localhost, which has NVIDIA GPUs")
    assert "`nvidia-modprobe -u -c=0` (nvidia-uvm and /dev/nvidia-uvm)" in message
    assert "/etc/modules-load.d/nvidia-uvm.conf" in message


def test_a_host_without_gpus_is_not_asked_for_nvidia_devices(run_role_tasks):
    rc, failures = run_role_tasks(
        "vllm_preflight",
        "main",
        {"vllm_preflight_instances": [{"model": "tiny"}], "vllm_preflight_nvidia_devices": ["/dev/llmops-test-none"]},
    )
    assert (rc, failures) == (0, [])
