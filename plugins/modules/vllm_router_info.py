#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_router_info
short_description: Describe the vLLM router of this host, its workers and their health
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Reads the record of the router that the C(vllm_router) role runs on this host (O(config_dir)/router.json), its
    unit's state from systemd, and from the running router, with the key of its clients (read from its
    EnvironmentFile, never logged), each worker with its health and the requests the router has in flight on it,
    and the router's own counts of requests from its metrics, with the workers it would start with (its workers
    file).
  - With O(wait), waits until the router answers and every worker it lists is healthy.
  - With O(served_name) and O(api_key), says whether an instance that serves that model with that key may be
    one of the router's workers (RV(fits)), without showing either key.
extends_documentation_fragment:
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
    details: It only reads, so it runs in check mode like in a normal run.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  config_dir:
    description: Where the router's record and EnvironmentFile lie.
    type: path
    default: /etc/vllm-router
  wait:
    description:
      - Seconds to wait until the router answers and lists at least one worker, every one healthy; 0 reads once.
      - When the wait ends without that, the module fails with what it saw last.
    type: float
    default: 0
  served_name:
    description: A model that an instance serves, to compare with the router's (RV(fits)).
    type: str
  api_key:
    description: The key that an instance takes, to compare with the router's (RV(fits)); never logged.
    type: str
  timeout:
    description: Seconds that each HTTP request to the router may take.
    type: float
    default: 5
seealso:
  - module: llmops.vllm.vllm_router_workers
"""

EXAMPLES = r"""
- name: Wait until the router serves, every worker healthy
  llmops.vllm.vllm_router_info:
    wait: 120
  register: router

- name: Show the router's workers
  ansible.builtin.debug:
    msg: "{{ router.router.workers | map(attribute='url') | list }}"
"""

RETURN = r"""
router:
  description: The router's record, less its secrets, with its live state.
  returned: always
  type: dict
  sample:
    url: http://127.0.0.1:8080
    host: 0.0.0.0
    port: 8080
    served_name: tiny
    version: 0.1.17
    policy: cache_aware
    active_state: active
    reachable: true
    error: null
    workers:
      - {url: http://10.0.0.7:8000, healthy: true, load: 0}
    workers_saved: [http://10.0.0.7:8000]
    counts: {requests: 1200, errors: 0, retries: 3}
  contains:
    workers:
      description: The workers that the running router lists, each with its health and the requests in flight on it.
      type: list
      elements: dict
    workers_saved:
      description: The workers in the router's workers file, with which it starts.
      type: list
      elements: str
    counts:
      description: The router's own counts of requests (completed, ended in an error, retried); null without metrics.
      type: dict
fits:
  description:
    - Whether an instance with O(served_name) and O(api_key) may be a worker of the router, and why not.
    - Returned when O(served_name) is given.
  returned: when served_name is given
  type: dict
  sample: {ok: false, reasons: ["it takes another key than the router's clients send"]}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.common.wait import wait_for
from ansible_collections.llmops.vllm.plugins.module_utils.router.api import RouterApi, router_counts
from ansible_collections.llmops.vllm.plugins.module_utils.router.record import (
    DEFAULT_CONFIG_DIR,
    RouterError,
    read_record,
    router_api_key,
)
from ansible_collections.llmops.vllm.plugins.module_utils.router.workers import read_workers
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import Unit, UnitError
from ansible_collections.llmops.vllm.plugins.module_utils.service.vllm_api import get

POLL_INTERVAL = 1.0


def live_state(api: RouterApi, metrics_url: str) -> dict:
    """What the running router says: its workers and their health, and its counts of requests."""
    try:
        workers = api.worker_states()
    except RouterError as error:
        return {"reachable": False, "error": str(error), "workers": [], "counts": None}
    metrics = get(metrics_url, "/metrics", timeout=api.timeout)
    counts = router_counts(metrics.body) if metrics.status == 200 else None
    return {"reachable": True, "error": None, "workers": workers, "counts": counts}


def serving(state: dict) -> bool:
    return state["reachable"] and bool(state["workers"]) and all(worker["healthy"] for worker in state["workers"])


def fits(record: dict, router_key: str | None, served_name: str, api_key: str | None) -> dict:
    reasons = []
    if served_name != record["served_name"]:
        reasons.append(f"it serves {served_name}, and the router's workers serve {record['served_name']}")
    if (api_key or None) != router_key:
        reasons.append("it takes another key than the one the router's clients send")
    return {"ok": not reasons, "reasons": reasons}


def main():
    module = AnsibleModule(
        argument_spec={
            "config_dir": {"type": "path", "default": DEFAULT_CONFIG_DIR},
            "wait": {"type": "float", "default": 0.0},
            "served_name": {"type": "str"},
            "api_key": {"type": "str", "no_log": True},
            "timeout": {"type": "float", "default": 5.0},
        },
        required_by={"api_key": "served_name"},
        supports_check_mode=True,
    )
    params = module.params
    if params["wait"] < 0 or params["timeout"] <= 0:
        module.fail_json(
            msg=f"wait must be 0 or more and timeout more than 0 seconds, got {params['wait']} and {params['timeout']}"
        )
    try:
        record = read_record(params["config_dir"])
        router_key = router_api_key(record)
        saved = read_workers(record["workers_file"])
        unit = Unit(record["unit"], module.run_command).state()
    except (RouterError, UnitError) as error:
        module.fail_json(msg=str(error))
    api = RouterApi(record["url"], router_key, params["timeout"])

    def check():
        state = live_state(api, record["metrics_url"])
        return serving(state), state

    if params["wait"] > 0:
        waited = wait_for(check, params["wait"], POLL_INTERVAL)
        if not waited.ok:
            module.fail_json(
                msg=f"the router at {record['url']} did not serve with every worker healthy within "
                f"{params['wait']:g} s; last seen: {waited.observed}",
                elapsed=round(waited.elapsed, 3),
            )
        state = waited.observed
    else:
        state = live_state(api, record["metrics_url"])
    described = {key: value for key, value in record.items() if key != "secrets"}
    result = {"router": {**described, "active_state": unit.active_state, **state, "workers_saved": saved}}
    if params["served_name"] is not None:
        result["fits"] = fits(record, router_key, params["served_name"], params["api_key"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
