# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that turn a deployment spec into the text of a systemd unit and its EnvironmentFile, check the
instances of a host for clashes, and keep the books of a swap and of a tune."""

from __future__ import annotations

import functools

from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.vllm.plugins.module_utils.bench.options import option_problem
from ansible_collections.llmops.vllm.plugins.module_utils.common.clock import ClockError
from ansible_collections.llmops.vllm.plugins.module_utils.common.table import records_table
from ansible_collections.llmops.vllm.plugins.module_utils.common.task_failure import task_failure
from ansible_collections.llmops.vllm.plugins.module_utils.instance.host_instances import (
    InstanceError,
    displaced,
    normalize,
)
from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import remote_url
from ansible_collections.llmops.vllm.plugins.module_utils.instance.status import group_rows, status_row
from ansible_collections.llmops.vllm.plugins.module_utils.plan.catalog import CatalogError
from ansible_collections.llmops.vllm.plugins.module_utils.plan.group_planner import group_hosts
from ansible_collections.llmops.vllm.plugins.module_utils.plan.model_shape import PlanInputError
from ansible_collections.llmops.vllm.plugins.module_utils.router.choice import (
    chosen_key,
    chosen_workers,
    refusals,
    routers_listing,
    status_rows,
)
from ansible_collections.llmops.vllm.plugins.module_utils.router.record import (
    RouterError,
    build_record,
    environment_text,
    router_command,
    worker_url,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.serve_command import (
    ServeSpecError,
    build_serve_args,
    build_server_environment,
    layout_gpu_count,
    model_info_sharing,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.systemd import (
    SystemdSyntaxError,
    environment_file,
    exec_line,
)
from ansible_collections.llmops.vllm.plugins.module_utils.swap.bookkeeping import (
    SwapError,
    beside_plan,
    budget_spent,
    gate_offer,
    gate_reference,
    new_instance,
    rollout_batches,
    sleep_plan,
    swap_outcome,
    swap_result,
    to_deploy,
)
from ansible_collections.llmops.vllm.plugins.module_utils.tune.candidates import (
    TuneError,
    overlay_entry,
    plan_candidates,
)
from ansible_collections.llmops.vllm.plugins.module_utils.tune.guard import bystanders, guard_command
from ansible_collections.llmops.vllm.plugins.module_utils.tune.ledger import (
    count,
    outcome,
    over_budget,
    planned_rows,
    runs,
)


def _as_filter_error(function):
    def filter_function(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except (
            CatalogError,
            ClockError,
            InstanceError,
            PlanInputError,
            RouterError,
            ServeSpecError,
            SwapError,
            SystemdSyntaxError,
            TuneError,
        ) as error:
            raise AnsibleFilterError(str(error)) from error

    return functools.wraps(function)(filter_function)


class FilterModule:
    def filters(self):
        return {
            "vllm_bench_option_problem": option_problem,
            "vllm_serve_args": _as_filter_error(build_serve_args),
            "vllm_server_environment": _as_filter_error(build_server_environment),
            "vllm_model_info_sharing": _as_filter_error(model_info_sharing),
            "vllm_layout_gpu_count": layout_gpu_count,
            "vllm_group_hosts": _as_filter_error(group_hosts),
            "systemd_exec_line": _as_filter_error(exec_line),
            "systemd_environment_file": _as_filter_error(environment_file),
            "vllm_instances": _as_filter_error(normalize),
            "vllm_displaced": _as_filter_error(displaced),
            "vllm_table": records_table,
            "vllm_instance_url": remote_url,
            "vllm_status_row": status_row,
            "vllm_status_groups": group_rows,
            "vllm_swap_new_instance": _as_filter_error(new_instance),
            "vllm_swap_outcome": _as_filter_error(swap_outcome),
            "vllm_swap_result": _as_filter_error(swap_result),
            "vllm_swap_sleep_plan": _as_filter_error(sleep_plan),
            "vllm_swap_beside_plan": _as_filter_error(beside_plan),
            "vllm_swap_to_deploy": _as_filter_error(to_deploy),
            "vllm_task_failure": task_failure,
            "vllm_rollout_batches": _as_filter_error(rollout_batches),
            "vllm_rollout_budget_spent": _as_filter_error(budget_spent),
            "vllm_rollout_gate_reference": gate_reference,
            "vllm_swap_gate_offer": gate_offer,
            "vllm_router_choose": _as_filter_error(chosen_workers),
            "vllm_router_command": _as_filter_error(router_command),
            "vllm_router_environment": _as_filter_error(environment_text),
            "vllm_router_key": _as_filter_error(chosen_key),
            "vllm_router_record": _as_filter_error(build_record),
            "vllm_router_listing": routers_listing,
            "vllm_router_refusals": refusals,
            "vllm_router_status_rows": status_rows,
            "vllm_router_worker_url": _as_filter_error(worker_url),
            "vllm_tune_bystanders": _as_filter_error(bystanders),
            "vllm_tune_candidates": _as_filter_error(plan_candidates),
            "vllm_tune_count": _as_filter_error(count),
            "vllm_tune_guard_command": _as_filter_error(guard_command),
            "vllm_tune_outcome": _as_filter_error(outcome),
            "vllm_tune_over_budget": _as_filter_error(over_budget),
            "vllm_tune_overlay": _as_filter_error(overlay_entry),
            "vllm_tune_rows": _as_filter_error(planned_rows),
            "vllm_tune_runs": _as_filter_error(runs),
        }
