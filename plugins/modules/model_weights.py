#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: model_weights
short_description: Check that a model's weights fit on the host, then fetch, resume and verify them
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Lists the files of a model at a pinned revision on the Hugging Face hub (sizes, and SHA-256 of the
    files stored in LFS), or in a mirror that a fleet shares (an HTTP directory or a path the host mounts).
  - Compares that list with the weights directory and its manifest C(.llmops-weights.json), and counts
    the bytes still needed. Before anything is written, it fails when those bytes, with a margin and a
    reserve, exceed the free space of the filesystem that will hold the directory, naming both numbers.
  - Fetches several files at once, and splits the last large files into byte ranges over several
    connections (O(workers) in all). Files land in C(.llmops-partial/) under the directory and move to
    their names only once their size and SHA-256 are checked; the SHA-256 is computed while the bytes
    land, by the workers, on several cores.
  - An interrupted or failed fetch leaves the manifest saying which files are missing and which byte
    ranges of them are there; the next run resumes those ranges (HTTP Range, or a seek on a mounted path).
    A file whose SHA-256 differs is fetched once more; if it differs again the run fails and the copy is
    removed. A directory whose manifest lists missing files is refused as a mirror.
  - From the hub, where the Python that runs the module can import huggingface_hub (the vLLM venv can),
    the library fetches the files (with hf_xet for Xet-backed repositories where it is installed),
    several at once; each is hashed as soon as it is there and checked against the hub's SHA-256. The
    library fetches whole files, so partial copies are started over. Elsewhere the module's own fetch runs.
    O(hub_client) chooses; the result's RV(fetch_client) says which ran and why.
  - Without huggingface_hub the module uses only the Python standard library, so the check runs on a
    bare host before vLLM is installed.
  - A directory that serves this manifest (for example a host's weights directory behind nginx) is a
    mirror that passes the sizes and hashes on to the hosts that fetch from it.
extends_documentation_fragment:
  - llmops.vllm.hub
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  path:
    description: Absolute directory of the weights; created (with its parents) only when something is fetched.
    type: path
    required: true
  source:
    description: Where the weights come from, as the catalog's C(source) says.
    type: dict
    required: true
    suboptions:
      kind:
        description:
          - V(hub) fetches C(repo) at C(revision) from the hub, or from O(mirror) when set.
          - V(local) checks that weights already on the host at C(path) are there; nothing is fetched.
        type: str
        required: true
        choices: [hub, local]
      repo:
        description:
          - Repository on the hub, C(owner/name) (letters, digits, C(-), C(_) and C(.); no C(..) or C(--)).
            Required with O(source.kind=hub).
        type: str
      revision:
        description:
          - Branch, tag or commit on the hub (a name that git and the hub accept). A commit hash pins the
            weights; the module returns the commit that a branch or tag resolved to.
        type: str
        default: main
      allow_patterns:
        description:
          - Fetch only files matching one of these shell patterns (C(*.safetensors), C(tokenizer*)); each must
            be a non-empty string.
        type: list
        elements: raw
        default: []
      path:
        description: Absolute directory of the weights on the host. Required with O(source.kind=local).
        type: path
  hub_client:
    description:
      - What fetches from the hub (a mirror is always fetched by the module's own code).
      - V(auto) uses huggingface_hub where the module's Python can import it, else the module's own fetch.
      - V(huggingface_hub) fails when the library cannot be imported; V(builtin) never uses it.
    type: str
    choices: [auto, huggingface_hub, builtin]
    default: auto
  workers:
    description:
      - Files and byte ranges fetched at once (connections), which also hash what they fetched.
      - Defaults to 2 per CPU the module may use, from 4 to 32. From 1 to 256.
    type: int
  state:
    description:
      - V(present) fetches what is missing.
      - V(check) only reports the files, the needed bytes and the free space, and fails when they do not
        fit; it never writes, so a playbook can run it before it installs or changes anything.
    type: str
    choices: [present, check]
    default: present
  margin:
    description: Free space required beyond the needed bytes, as a fraction of them (0 or more).
    type: float
    default: 0.05
  reserve:
    description: Free space to leave on the filesystem after the download, in bytes or with a unit (C(10G)).
    type: str
    default: 1G
  progress_file:
    description:
      - Absolute path of a JSON file that receives the download's progress (bytes done and needed, rate, ETA,
        the oldest file in flight and how many are) about once a second, for a role that polls an
        asynchronous run. Removed when the fetch ends.
    type: path
  timeout:
    description: Seconds to wait for the source to answer one request (more than 0).
    type: int
    default: 60
notes:
  - Files without a hash (the hub's small non-LFS files, a mirror without a manifest) are checked by size;
    the module hashes them once it has them and so still notices a later change on the host.
  - A source that ignores Range requests (C(python3 -m http.server)) gets one connection per file, and an
    interrupted file starts over.
"""

EXAMPLES = r"""
- name: Fail early when MiniMax-M2.5 does not fit under /var/lib/vllm/models
  llmops.vllm.model_weights:
    path: /var/lib/vllm/models/minimax_m25
    source:
      kind: hub
      repo: MiniMaxAI/MiniMax-M2.5
      revision: main
    state: check

- name: Fetch Kimi-K2.5 at a pinned commit from the fleet's mirror, weights and configs only
  llmops.vllm.model_weights:
    path: /data/models/kimi_k25
    source:
      kind: hub
      repo: moonshotai/Kimi-K2.5
      revision: 3c6f1b9e2a7d4c8f0e5b1a2d3c4e5f6a7b8c9d0e
      allow_patterns: ["*.safetensors", "*.json", "*.py", "tiktoken.model"]
    mirror: http://weights.lab.internal/models
    reserve: 20G
    workers: 16
    progress_file: /data/models/.kimi_k25.progress.json

- name: Fetch from the hub with huggingface_hub from vLLM's venv (hf_xet where the repository uses Xet)
  llmops.vllm.model_weights:
    path: /var/lib/vllm/models/minimax_m25
    source:
      kind: hub
      repo: MiniMaxAI/MiniMax-M2.5
      revision: 0f3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a
    hub_client: huggingface_hub
    hub_token: "{{ vllm_server_hf_token }}"
  vars:
    ansible_python_interpreter: /opt/vllm/venv/bin/python
"""

RETURN = r"""
path:
  description: Directory from which vLLM loads the weights.
  returned: always
  type: str
  sample: /var/lib/vllm/models/minimax_m25
files:
  description:
    - Every file of the source, with its size, hash when known, and what was (or would be) done.
    - C(offset) is the bytes already there (of a resumed file, the byte ranges it holds).
  returned: always
  type: list
  elements: dict
  sample: [{"path": "model-00001-of-00002.safetensors", "size": 4998000000, "sha256": "3f1a...",
            "action": "resume", "offset": 1048576, "reason": "partial: 1048576 of 4998000000 bytes"}]
total_bytes:
  description: Size of all the source's files.
  returned: always
  type: int
  sample: 230500000000
needed_bytes:
  description: Bytes still to fetch (the files minus what is already complete, resumed files counting their rest).
  returned: always
  type: int
  sample: 4996951424
required_free_bytes:
  description: Free bytes the download requires, with the margin and the reserve; 0 when nothing is needed.
  returned: always
  type: int
  sample: 6320000000
free_bytes:
  description: Free bytes on the filesystem that holds O(path) (or its closest existing parent).
  returned: always
  type: int
  sample: 1800000000000
fetch_client:
  description:
    - What fetches (or would fetch) the files, and why; the Python that ran the module.
    - C(name) is V(huggingface_hub) (with C(version)) or V(builtin), the module's own fetch.
  returned: when O(source.kind=hub)
  type: dict
  sample: {"name": "huggingface_hub", "version": "2.4.0", "python": "/opt/vllm/venv/bin/python",
           "reason": "/opt/vllm/venv/bin/python has huggingface_hub 2.4.0"}
workers:
  description: Files and byte ranges fetched at once.
  returned: when O(source.kind=hub)
  type: int
  sample: 8
fetched_bytes:
  description: Bytes fetched by this run.
  returned: when O(state=present), not in check mode
  type: int
  sample: 4996951424
missing:
  description: Files that the failed fetch left missing, as the manifest records them; the next run resumes them.
  returned: when the fetch failed
  type: list
  elements: str
  sample: ["model-00002-of-00002.safetensors"]
elapsed:
  description: Seconds the fetch took.
  returned: when O(state=present), not in check mode
  type: float
  sample: 41.2
bytes_per_second:
  description: Average download rate of this run.
  returned: when O(state=present), not in check mode
  type: int
  sample: 121300000
commit:
  description: The hub commit that the revision resolved to, when the hub (not a mirror) was asked.
  returned: when O(source.kind=hub) without O(mirror)
  type: str
  sample: 5a1e4b8f3c2d0e9f8a7b6c5d4e3f2a1b0c9d8e7f
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.weights.fetch import (
    Fetcher,
    Manifest,
    Progress,
    default_workers,
)
from ansible_collections.llmops.vllm.plugins.module_utils.weights.hub_client import (
    CLIENTS,
    LibrarySource,
    choose_client,
    fetch_with_library,
)
from ansible_collections.llmops.vllm.plugins.module_utils.weights.listing import (
    WeightsError,
    local_files,
    read_manifest,
    select_files,
)
from ansible_collections.llmops.vllm.plugins.module_utils.weights.options import problems, reserve_bytes
from ansible_collections.llmops.vllm.plugins.module_utils.weights.plan import (
    check_space,
    disk_usage_free,
    nearest_existing_directory,
    plan_fetch,
    required_free_bytes,
)
from ansible_collections.llmops.vllm.plugins.module_utils.weights.sources import hub_endpoint, open_source


def describe(step):
    return {
        "path": step.file.path,
        "size": step.file.size,
        "sha256": step.file.sha256,
        "action": step.action,
        "offset": step.offset,
        "reason": step.reason,
    }


def local_weights(module, path):
    """Weights already on the host: they must be a directory with a config.json; nothing is fetched."""
    if not os.path.isfile(os.path.join(path, "config.json")):
        module.fail_json(msg=f"source.path {path} holds no config.json: it is not a model directory on this host")
    files = local_files(path)
    module.exit_json(
        changed=False,
        path=path,
        files=[{"path": file.path, "size": file.size, "action": "keep"} for file in files],
        total_bytes=sum(file.size for file in files),
        needed_bytes=0,
        required_free_bytes=0,
        free_bytes=disk_usage_free(path),
    )


def list_files(module, source, description, workers):
    """(the client that fetches, the source, its files, the plan), or fail naming the repository."""
    params = module.params
    endpoint = hub_endpoint(params["hub_endpoint"])
    try:
        library, client = choose_client(params["hub_client"], params["mirror"])
        if library is not None:
            origin = LibrarySource(
                library, source["repo"], source["revision"], endpoint, params["hub_token"], params["timeout"]
            )
        else:
            origin = open_source(
                source["repo"], source["revision"], params["mirror"], endpoint, params["hub_token"], params["timeout"]
            )
        files = select_files(origin.files(), source["allow_patterns"])
        if not files:
            raise WeightsError(f"the source has no files matching {source['allow_patterns']}")
        steps = plan_fetch(files, params["path"], description, ranges=library is None, workers=workers)
    except WeightsError as error:
        hint = " (a gated or private repository: set hub_token)" if error.status in (401, 403) else ""
        module.fail_json(msg=f"Cannot list the weights of {source['repo']}: {error}{hint}")
    return client, origin, files, steps


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "source": {
                "type": "dict",
                "required": True,
                "options": {
                    "kind": {"type": "str", "required": True, "choices": ["hub", "local"]},
                    "repo": {"type": "str"},
                    "revision": {"type": "str", "default": "main"},
                    "allow_patterns": {"type": "list", "elements": "raw", "default": []},
                    "path": {"type": "path"},
                },
                "required_if": [("kind", "hub", ["repo"]), ("kind", "local", ["path"])],
            },
            "mirror": {"type": "str"},
            "hub_endpoint": {"type": "str"},
            "hub_token": {"type": "str", "no_log": True},
            "hub_client": {"type": "str", "choices": list(CLIENTS), "default": "auto"},
            "workers": {"type": "int"},
            "state": {"type": "str", "choices": ["present", "check"], "default": "present"},
            "margin": {"type": "float", "default": 0.05},
            "reserve": {"type": "str", "default": "1G"},
            "progress_file": {"type": "path"},
            "timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    params = module.params
    found = problems(params)
    if found:
        module.fail_json(msg="model_weights cannot run: " + "; ".join(found), problems=found)
    source = params["source"]
    if source["kind"] == "local":
        local_weights(module, source["path"])
    reserve = reserve_bytes(params["reserve"])
    workers = params["workers"] or default_workers()

    dest = params["path"]
    description = {"kind": "hub", "repo": source["repo"], "revision": source["revision"]}
    client, origin, files, steps = list_files(module, source, description, workers)
    needed = sum(step.bytes_needed for step in steps)
    free = disk_usage_free(dest)
    report = {
        "path": dest,
        "files": [describe(step) for step in steps],
        "total_bytes": sum(file.size for file in files),
        "needed_bytes": needed,
        "required_free_bytes": required_free_bytes(needed, params["margin"], reserve),
        "free_bytes": free,
        "fetch_client": client,
        "workers": workers,
    }
    if getattr(origin, "commit", None):
        report["commit"] = origin.commit
    try:
        check_space(needed, free, params["margin"], reserve, nearest_existing_directory(dest))
    except WeightsError as error:
        module.fail_json(msg=str(error), **report)
    if params["state"] == "check" or module.check_mode:
        module.exit_json(changed=params["state"] == "present" and needed > 0, **report)

    progress = Progress(params["progress_file"], needed)
    started = time.monotonic()
    try:
        os.makedirs(dest, exist_ok=True)
        manifest = Manifest(dest, description, {file.path for file in files}, report.get("commit"))
        if isinstance(origin, LibrarySource):
            fetch_with_library(origin, steps, dest, manifest, progress, workers)
        else:
            Fetcher(origin, dest, manifest, progress, workers).run(steps)
    except (WeightsError, OSError) as error:
        module.fail_json(
            msg=f"Fetching the weights into {dest} failed: {error}",
            fetched_bytes=progress.done,
            missing=sorted(read_manifest(dest).get("missing") or {}),
            **report,
        )
    finally:
        progress.remove()
    elapsed = time.monotonic() - started
    module.exit_json(
        changed=needed > 0,
        fetched_bytes=progress.done,
        elapsed=round(elapsed, 3),
        bytes_per_second=round(progress.done / elapsed) if elapsed > 0 else 0,
        **report,
    )


if __name__ == "__main__":
    main()
