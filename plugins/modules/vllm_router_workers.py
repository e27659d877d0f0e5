#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_router_workers
short_description: Add workers to, or take them out of, the vLLM router of this host
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Changes the workers of the router that the C(vllm_router) role runs on this host (vLLM's router, the PyPI
    package C(vllm-router)) in two places, the running router, through its C(/add_worker) and C(/remove_worker)
    routes, and the router's workers file, which it reads when it starts.
  - The router's record (O(config_dir)/router.json) gives its URL and the model its workers serve; its
    EnvironmentFile gives the key of its clients, which the router forwards to its workers and which every request
    to the router needs. The key is never logged.
  - Before a worker is added, it is asked for C(/v1/models) from this host with that key, and must list the model.
    A worker that this host cannot reach, that refuses the key or serves another model is refused, and nothing
    changes. The router answers an added worker once the worker answers C(/health).
  - A worker taken out gets no new request from the router at once; the requests it has in flight stream to their
    end. M(llmops.vllm.vllm_service) then drains them when it stops the instance.
  - O(workers) sets the exact list, also while the router is stopped (its workers file alone). O(add) and
    O(remove) need the running router; a router that does not answer fails the module before any change.
  - Changes of several hosts through the same router at once are made one after the other.
extends_documentation_fragment:
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Reads the router and checks the workers to add; changes nothing.
  diff_mode:
    support: full
    details: The router's workers before and after.
  idempotent:
    support: full
options:
  config_dir:
    description: Where the router's record, EnvironmentFile and workers file lie.
    type: path
    default: /etc/vllm-router
  workers:
    description: The router's workers, exactly (base URLs such as C(http://10.0.0.7:8000)).
    type: list
    elements: str
  add:
    description: Workers to add, when the router does not list them.
    type: list
    elements: str
  remove:
    description: Workers to take out, when the router lists them.
    type: list
    elements: str
  timeout:
    description: Seconds that the router may take to answer an added worker (it waits for the worker's C(/health)).
    type: float
    default: 60
seealso:
  - module: llmops.vllm.vllm_router_info
"""

EXAMPLES = r"""
- name: Take tiny out of the router on gateway-1 before it stops
  llmops.vllm.vllm_router_workers:
    remove: [http://10.0.0.7:8000]
  delegate_to: gateway-1

- name: Put the new instance into the router once it serves
  llmops.vllm.vllm_router_workers:
    add: [http://10.0.0.7:8000]
  delegate_to: gateway-1
"""

RETURN = r"""
workers_before:
  description: The router's workers before the change (the running router's, else its workers file's).
  returned: always
  type: list
  elements: str
  sample: [http://10.0.0.7:8000, http://10.0.0.8:8000]
workers:
  description: The router's workers after the change (in check mode, as they would be).
  returned: always
  type: list
  elements: str
  sample: [http://10.0.0.8:8000]
added:
  description: The workers added.
  returned: always
  type: list
  elements: str
  sample: []
removed:
  description: The workers taken out, of those asked to be; a worker the router did not list is not among them.
  returned: always
  type: list
  elements: str
  sample: [http://10.0.0.7:8000]
running:
  description: Whether the router answered; when it did not, only its workers file changed.
  returned: always
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.router.api import RouterApi, check_worker
from ansible_collections.llmops.vllm.plugins.module_utils.router.record import (
    DEFAULT_CONFIG_DIR,
    RouterError,
    RouterUnreachable,
    read_record,
    router_api_key,
)
from ansible_collections.llmops.vllm.plugins.module_utils.router.workers import (
    check_worker_urls,
    plan_workers,
    read_workers,
    workers_lock,
    write_workers,
)


def apply(module, api, record, to_remove, to_add, timeout):
    """Take out, then add, on the running router; a failure part way says what the router lists now."""
    try:
        for url in to_remove:
            api.remove(url)
        for url in to_add:
            api.add(url, timeout)
    except RouterError as error:
        try:
            listed = api.worker_list()
        except RouterError:
            raise RouterError(f"{error}; what the router lists now is unknown") from error
        write_workers(module, record["workers_file"], listed)
        raise RouterError(f"{error}; the router lists {', '.join(listed) or 'no worker'} now") from error


def change_workers(module, params):
    """Read the router, check the workers to add, then change the router and its workers file."""
    record = read_record(params["config_dir"])
    api_key = router_api_key(record)
    api = RouterApi(record["url"], api_key)
    asked = (params["workers"], check_worker_urls(params["add"] or []), check_worker_urls(params["remove"] or []))
    with workers_lock(record["workers_file"]):
        saved = read_workers(record["workers_file"])
        try:
            current, running = api.worker_list(), True
        except RouterUnreachable as error:
            if params["workers"] is None:
                raise RouterError(f"{error}; nothing changed") from error
            current, running = saved, False
        to_add, to_remove, after = plan_workers(current, *asked)
        # Every new worker must serve the router's model with its clients' key, before anything changes.
        try:
            for url in to_add:
                check_worker(url, record["served_name"], api_key)
        except RouterError as error:
            raise RouterError(f"{error}; nothing changed") from error
        if module.check_mode:
            file_changed = saved != after
        else:
            if running:
                apply(module, api, record, to_remove, to_add, params["timeout"])
            file_changed = write_workers(module, record["workers_file"], after)
    return {
        "changed": bool(to_add or to_remove or file_changed),
        "workers_before": current,
        "workers": after,
        "added": to_add,
        "removed": to_remove,
        "running": running,
        "diff": {"before": "\n".join(current) + "\n", "after": "\n".join(after) + "\n"},
    }


def main():
    module = AnsibleModule(
        argument_spec={
            "config_dir": {"type": "path", "default": DEFAULT_CONFIG_DIR},
            "workers": {"type": "list", "elements": "str"},
            "add": {"type": "list", "elements": "str"},
            "remove": {"type": "list", "elements": "str"},
            "timeout": {"type": "float", "default": 60.0},
        },
        mutually_exclusive=[("workers", "add"), ("workers", "remove")],
        required_one_of=[("workers", "add", "remove")],
        supports_check_mode=True,
    )
    params = module.params
    if params["timeout"] <= 0:
        module.fail_json(msg=f"timeout must be more than 0 seconds, got {params['timeout']}")
    try:
        for name in ("workers", "add", "remove"):
            check_worker_urls(params[name] or [])
    except RouterError as error:
        module.fail_json(msg=str(error))
    try:
        result = change_workers(module, params)
    except RouterError as error:
        module.fail_json(msg=str(error))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
