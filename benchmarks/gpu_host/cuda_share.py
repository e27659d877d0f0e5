# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Two processes sharing a CUDA tensor as torch shares one (torch.multiprocessing), both ways: a child sends a tensor
to its parent, and the parent sends one to a child. run.py runs this in a unit with the vLLM unit's own sandbox, with
PYTORCH_CUDA_ALLOC_CONF set by the unit, and reads the two lines it prints:

  SHARE child-to-parent ok|failed: ...
  SHARE parent-to-child ok|failed: ...

With expandable_segments:True torch shares the tensor's memory through a file descriptor that the receiver takes
from the sender with pidfd_getfd: the system-call filter decides that, and so does kernel.yama.ptrace_scope (1
lets a process take one only from its own descendants).
"""

from __future__ import annotations

import os
import traceback

import torch
import torch.multiprocessing as mp

VALUE = 7.0


def send(queue, done):
    tensor = torch.full((1 << 20,), VALUE, device="cuda")
    queue.put(tensor)
    done.wait(60)


def receive(queue, answers):
    try:
        tensor = queue.get(timeout=60)
        answers.put(f"ok: {float(tensor.sum()) == VALUE * (1 << 20)}")
    except Exception as error:  # the verdict is the error, whatever it is
        answers.put(f"failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}")


def child_to_parent(context):
    queue, done = context.Queue(), context.Event()
    child = context.Process(target=send, args=(queue, done))
    child.start()
    try:
        tensor = queue.get(timeout=60)
        verdict = f"ok: {float(tensor.sum()) == VALUE * (1 << 20)}"
    except Exception as error:
        verdict = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
    done.set()
    child.join(30)
    return verdict


def parent_to_child(context):
    queue, answers = context.Queue(), context.Queue()
    child = context.Process(target=receive, args=(queue, answers))
    child.start()
    tensor = torch.full((1 << 20,), VALUE, device="cuda")
    queue.put(tensor)
    try:
        verdict = answers.get(timeout=90)
    except Exception:
        verdict = f"failed: no answer from the child (exit code {child.exitcode})"
    child.join(30)
    return verdict


def main():
    print(f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')}", flush=True)
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as stream:
            print(f"kernel.yama.ptrace_scope={stream.read().strip()}", flush=True)
    except OSError:
        print("kernel.yama.ptrace_scope: no Yama", flush=True)
    context = mp.get_context("spawn")
    for name, case in (("child-to-parent", child_to_parent), ("parent-to-child", parent_to_child)):
        try:
            verdict = case(context)
        except Exception:
            verdict = "failed: " + traceback.format_exc().strip().splitlines()[-1][:200]
        print(f"SHARE {name} {verdict}", flush=True)


if __name__ == "__main__":
    main()
