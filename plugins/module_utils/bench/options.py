# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The options of a benchmark, checked before anything is read or sent: by the vllm_bench module, and by the
vllm_bench role before it reads the instance's record."""

from __future__ import annotations

import math

from ansible_collections.llmops.vllm.plugins.module_utils.bench.error import BenchError
from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import RecordError, check_instance_name

# The service-level objectives of goodput, as vllm bench serve names them.
SLO_KEYS = ("ttft", "tpot", "e2el")


def check_options(params: dict, prefix: str = "") -> None:
    """Refuse a bad option before anything is read (the instance's record, a file) or sent; BenchError names it,
    as `prefix` + the module's name of it (the vllm_bench role names its own variables, vllm_bench_...)."""
    check_target(params, prefix)
    check_workload(params, prefix)


def check_target(params: dict, prefix: str = "") -> None:
    """Refuse a server named badly: an instance name that could not name a record, a served name with spaces."""
    if params.get("instance") is not None:
        try:
            check_instance_name(params["instance"], f"{prefix}instance")
        except RecordError as error:
            raise BenchError(str(error)) from None
    elif not params.get("model") or any(char.isspace() for char in params.get("model")):
        raise BenchError(f"{prefix}model must be the served model name, without spaces, got {params.get('model')!r}")


def check_workload(params: dict, prefix: str = "") -> None:
    """Refuse a workload that cannot run: levels, lengths, counts, times, goodput SLOs and percentiles."""
    bad = [level for level in params["concurrency"] if level < 1]
    if not params["concurrency"] or bad:
        raise BenchError(f"{prefix}concurrency must list levels of 1 or more, got {params['concurrency']}")
    for name in ("input_len", "output_len"):
        if params[name] < 1:
            raise BenchError(f"{prefix}{name} must be 1 or more, got {params[name]}")
    for name in ("warmup_requests", "seed"):
        if params[name] < 0:
            raise BenchError(f"{prefix}{name} must be 0 or more, got {params[name]}")
    if params["num_requests"] is not None and params["num_requests"] < 1:
        raise BenchError(f"{prefix}num_requests must be 1 or more, got {params['num_requests']}")
    for name in ("duration", "request_timeout"):
        if params[name] is not None and not 0 < params[name] < math.inf:
            raise BenchError(f"{prefix}{name} must be more than 0 seconds, got {params[name]}")
    if not 0 <= params.get("max_failed_percent", 0) <= 100:
        raise BenchError(f"{prefix}max_failed_percent must be from 0 to 100, got {params['max_failed_percent']}")
    if not 0 <= params.get("max_regression_percent", 0) < math.inf:
        raise BenchError(f"{prefix}max_regression_percent must be 0 or more, got {params['max_regression_percent']}")
    goodput = params.get("goodput") or {}
    unknown = set(goodput) - set(SLO_KEYS)
    if unknown:
        raise BenchError(f"{prefix}goodput takes the keys {', '.join(SLO_KEYS)}; unknown: {', '.join(sorted(unknown))}")
    for key, value in goodput.items():
        try:
            good = 0 < float(value) < math.inf
        except (TypeError, ValueError):
            good = False
        if isinstance(value, bool) or not good:
            raise BenchError(f"{prefix}goodput.{key} must be a number of milliseconds above 0, got {value!r}")
    bad_percentiles = [p for p in params.get("percentiles", ()) if not 0 < p < 100]
    if bad_percentiles:
        raise BenchError(f"{prefix}percentiles must be between 0 and 100 (exclusive), got {bad_percentiles}")


def option_problem(params: dict, prefix: str = "") -> str:
    """What `check_options` refuses, or an empty string."""
    try:
        check_options(params, prefix)
    except BenchError as error:
        return str(error)
    return ""
