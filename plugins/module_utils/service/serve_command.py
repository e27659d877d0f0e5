# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The command line of one vLLM server, built from plain data.

`build_serve_args` is pure: a mapping in, a list of arguments out, no I/O. The role renders the list
into the unit's ExecStart; the tests assert the exact list.
"""

from __future__ import annotations

import numbers
import re

from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import API_KEY_VARIABLE

WHOLE_NUMBER = re.compile(r"[0-9]+\Z")
DECIMAL_NUMBER = re.compile(r"[0-9]*\.?[0-9]+\Z")
# Where vLLM keeps what it learnt of each model class, under VLLM_CACHE_ROOT.
MODEL_INFO_DIRECTORY = "modelinfos"

# Flags that this function writes from the spec: in extra_args they would contradict the spec,
# so they are refused with the spec key to use instead.
MANAGED_FLAGS = {
    "--model": "model",
    "--served-model-name": "served_name",
    "--host": "host",
    "--port": "port",
    "--tensor-parallel-size": "layout.tensor_parallel_size",
    "--pipeline-parallel-size": "layout.pipeline_parallel_size",
    "--data-parallel-size": "layout.data_parallel_size",
    "--enable-expert-parallel": "layout.expert_parallel_size",
    "--max-model-len": "max_model_len",
    "--max-num-seqs": "max_num_seqs",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--shutdown-timeout": "shutdown_timeout",
    "--trust-remote-code": "trust_remote_code",
    "--load-format": "load_format",
    "--enable-sleep-mode": "sleep_mode",
}

# The KV cache's size in bytes: vLLM then skips its own sizing from the memory profile.
KV_CACHE_FLAG = "--kv-cache-memory-bytes"

# VLLM_SERVER_DEV_MODE=1 opens vLLM's development endpoints (/sleep, /wake_up, /collective_rpc, /reset_*,
# /server_info and more), which --api-key does not guard. Where they are open, this ASGI middleware (the
# vllm_install role puts it in every venv) lets clients other than loopback reach the API alone.
DEV_MODE_VARIABLE = "VLLM_SERVER_DEV_MODE"
DEV_ENDPOINTS_GUARD = "llmops_vllm_dev_guard.LoopbackOnlyDevEndpoints"
# --api-key does not guard /metrics either: in every server, this one answers it to the host itself and to the
# readers that the vllm_targets role lists (docs/observability.md).
METRICS_GUARD = "llmops_vllm_dev_guard.MetricsReaders"
# In every server: 503 and Retry-After for a completion that vLLM aborted before answering any of it (a stopping
# server aborts each request it takes while it drains), where vLLM answers 200 and an empty stream.
RETRYABLE_ABORTS = "llmops_vllm_dev_guard.RetryableAborts"
# In every server: a journal line for each request that the server did not finish, which a stop counts.
CUT_OFF_ACCOUNTING = "llmops_vllm_dev_guard.CutOffRequests"

# Secrets on a command line are visible to every user in `ps`: they go to the EnvironmentFile.
SECRET_FLAGS = {"--api-key": ("the API key", "vllm_server_api_key, which goes to the EnvironmentFile as VLLM_API_KEY")}

LAYOUT_KEYS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "expert_parallel_size",
)


class ServeSpecError(ValueError):
    """The spec cannot become a valid vLLM command line; the message says which key and why."""


def _number(value, number_type, text_pattern, convert):
    """A number from a number or from its text (what `-e key=8` gives); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, number_type) or (isinstance(value, str) and text_pattern.match(value)):
        return convert(value)
    return None


def _whole_number(value):
    return _number(value, numbers.Integral, WHOLE_NUMBER, int)


def _fraction(value):
    return _number(value, numbers.Real, DECIMAL_NUMBER, float)


def _positive_int(value, key):
    number = _whole_number(value)
    if number is None or number < 1:
        raise ServeSpecError(f"{key} must be a whole number of at least 1, got {value!r}")
    return number


def _optional_positive_int(spec, key):
    value = spec.get(key)
    return None if value is None else _positive_int(value, key)


def _required_text(spec, key):
    value = spec.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ServeSpecError(f"{key} must be a non-empty string, got {value!r}")
    return value


def layout_gpu_count(layout):
    """GPUs that a layout occupies: TP x PP x DP (expert parallelism reuses the TP x DP ranks)."""
    count = 1
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        count *= _positive_int(layout.get(key, 1), f"layout.{key}")
    return count


def _layout_args(layout):
    unknown = sorted(set(layout) - set(LAYOUT_KEYS))
    if unknown:
        raise ServeSpecError(f"layout has unknown keys {unknown}; known keys: {list(LAYOUT_KEYS)}")
    sizes = {key: _positive_int(layout.get(key, 1), f"layout.{key}") for key in LAYOUT_KEYS[:3]}
    args = ["--tensor-parallel-size", str(sizes["tensor_parallel_size"])]
    if sizes["pipeline_parallel_size"] > 1:
        args += ["--pipeline-parallel-size", str(sizes["pipeline_parallel_size"])]
    if sizes["data_parallel_size"] > 1:
        args += ["--data-parallel-size", str(sizes["data_parallel_size"])]
    expert_parallel_size = layout.get("expert_parallel_size")
    if expert_parallel_size is not None:
        expert_parallel_size = _positive_int(expert_parallel_size, "layout.expert_parallel_size")
        # vLLM has no EP size flag: --enable-expert-parallel spreads experts over all TP x DP ranks.
        ranks = sizes["tensor_parallel_size"] * sizes["data_parallel_size"]
        if expert_parallel_size not in (1, ranks):
            raise ServeSpecError(
                f"layout.expert_parallel_size {expert_parallel_size} is not possible: vLLM spreads experts "
                f"over tensor_parallel_size x data_parallel_size = {ranks} ranks; set it to {ranks}, "
                "or leave it out (or 1) for no expert parallelism"
            )
        if expert_parallel_size > 1:
            args.append("--enable-expert-parallel")
    return args


def _switch(spec, key):
    value = spec.get(key, False)
    if not isinstance(value, bool):
        raise ServeSpecError(f"{key} must be true or false, got {value!r}")
    return value


def dev_endpoints_open(spec):
    """Whether the server opens vLLM's development endpoints: asked for, or needed by sleep mode's /sleep."""
    return _switch(spec, "dev_endpoints") or _switch(spec, "sleep_mode")


def _flag_name(arg):
    """`--max_num_seqs=8` -> `--max-num-seqs`: vLLM accepts underscores and `=` forms alike."""
    return arg.split("=", 1)[0].replace("_", "-")


def _checked_extra_args(extra_args):
    if not isinstance(extra_args, (list, tuple)) or not all(isinstance(arg, str) for arg in extra_args):
        raise ServeSpecError(f"extra_args must be a list of strings, got {extra_args!r}")
    for arg in extra_args:
        if not arg.startswith("--"):
            continue
        flag = _flag_name(arg)
        if flag in SECRET_FLAGS:
            secret, setting = SECRET_FLAGS[flag]
            raise ServeSpecError(
                f"{flag} in extra_args would put {secret} on the command line, where `ps` shows it; set {setting}"
            )
        if flag in MANAGED_FLAGS:
            raise ServeSpecError(f"{flag} in extra_args conflicts with the spec: set {MANAGED_FLAGS[flag]} instead")
    return list(extra_args)


def build_serve_args(spec):
    """Return the arguments of the OpenAI-compatible vLLM server for one instance.

    spec keys: model, served_name, host, port (required); layout (tensor/pipeline/data/expert parallel
    sizes); max_model_len, max_num_seqs, gpu_memory_utilization, shutdown_timeout, load_format,
    trust_remote_code, sleep_mode, kv_cache_memory_bytes (given to vLLM under sleep mode alone), dev_endpoints,
    extra_args (optional). Raises ServeSpecError naming the key
    at fault.
    """
    served_name = _required_text(spec, "served_name")
    if any(char.isspace() for char in served_name):
        raise ServeSpecError(f"served_name must not contain whitespace, got {served_name!r}")
    port = _whole_number(spec.get("port"))
    if port is None or not 1 <= port <= 65535:
        raise ServeSpecError(f"port must be a whole number from 1 to 65535, got {spec.get('port')!r}")

    args = [
        "--model", _required_text(spec, "model"),
        "--served-model-name", served_name,
        "--host", _required_text(spec, "host"),
        "--port", str(port),
        "--middleware", METRICS_GUARD,
        # vLLM adds each later middleware around the earlier ones: the account sees the 503s.
        "--middleware", RETRYABLE_ABORTS,
        "--middleware", CUT_OFF_ACCOUNTING,
    ]  # fmt: skip
    args += _layout_args(spec.get("layout") or {})

    for key, flag in (("max_model_len", "--max-model-len"), ("max_num_seqs", "--max-num-seqs")):
        value = _optional_positive_int(spec, key)
        if value is not None:
            args += [flag, str(value)]

    utilization = spec.get("gpu_memory_utilization")
    if utilization is not None:
        fraction = _fraction(utilization)
        if fraction is None or not 0 < fraction <= 1:
            raise ServeSpecError(f"gpu_memory_utilization must be above 0 and at most 1, got {utilization!r}")
        args += ["--gpu-memory-utilization", str(fraction)]

    shutdown_timeout = spec.get("shutdown_timeout")
    if shutdown_timeout is not None:
        seconds = _whole_number(shutdown_timeout)
        if seconds is None or seconds < 0:
            raise ServeSpecError(
                f"shutdown_timeout must be a whole number of seconds, 0 or more, got {shutdown_timeout!r}"
            )
        args += ["--shutdown-timeout", str(seconds)]

    load_format = spec.get("load_format")
    if load_format is not None:
        args += ["--load-format", _required_text(spec, "load_format")]

    if _switch(spec, "trust_remote_code"):
        args.append("--trust-remote-code")
    if dev_endpoints_open(spec):
        args += ["--middleware", DEV_ENDPOINTS_GUARD]
    extra_args = _checked_extra_args(spec.get("extra_args") or [])
    if _switch(spec, "sleep_mode"):
        args.append("--enable-sleep-mode")
        # Under sleep mode vLLM's memory profile misses what its own allocator holds and sizes the KV cache past
        # what the GPU has left (vLLM issue 40256): a 57 GiB FP8 model on an 80 GB GPU was given 20.6 GiB where
        # 11.7 GiB fit, and its start failed. The plan's KV cache is given instead, unless extra_args gives one.
        kv_cache_bytes = spec.get("kv_cache_memory_bytes") or 0
        if kv_cache_bytes and KV_CACHE_FLAG not in map(_flag_name, extra_args):
            args += [KV_CACHE_FLAG, str(_positive_int(kv_cache_bytes, "kv_cache_memory_bytes"))]

    return args + extra_args


def compile_cache_environment(home: str, vllm_version: str, model: str) -> dict:
    """Where vLLM keeps what it compiles for one entry on one release, under the home the unit may write.

    A directory per release and entry: a restart, a swap back and a rollback find their own, and the directory is
    exactly what identical hosts can share (llmops.vllm.vllm_compile_cache). Triton's kernels go there too.
    """
    root = f"{home}/.cache/vllm/{_path_part(vllm_version)}/{_path_part(model)}"
    return {"VLLM_CACHE_ROOT": root, "TRITON_CACHE_DIR": f"{root}/triton"}


def model_info_sharing(settings: dict) -> list[list[str]]:
    """The commands (the unit's ExecStartPre=) that let an entry's compile cache read vLLM's answers about model
    classes from a directory that every entry of the release shares.

    vLLM learns what a model's class supports by importing it in a Python process of its own, seconds at the first
    start of each entry, unless VLLM_CACHE_ROOT/modelinfos holds the answer already, kept per class with its source
    file's hash: an answer found for one entry holds for every entry of the same architecture on the release, so a
    swap to a new entry of a model family does not pay it again. The compile cache's archive carries the answers
    the link leads to as the entry's own directory, which this leaves in place (llmops.vllm.vllm_compile_cache).

    settings: environment (build_server_environment's), home, vllm_version, model. None where the environment puts
    VLLM_CACHE_ROOT elsewhere (a catalog entry's env): that directory is left as the user made it.
    """
    if not (settings.get("vllm_version") and settings.get("model")):
        return []
    home = _required_text(settings, "home")
    own = compile_cache_environment(home, settings["vllm_version"], settings["model"])["VLLM_CACHE_ROOT"]
    if (settings.get("environment") or {}).get("VLLM_CACHE_ROOT") != own:
        return []
    shared = f"{own.rsplit('/', 1)[0]}/{MODEL_INFO_DIRECTORY}"
    return [
        ["/bin/mkdir", "-p", shared, own],
        # A directory that a start before this setting made stays where it is: its answers hold as well.
        ["/bin/sh", "-c", f'[ -d "$0" ] && [ ! -L "$0" ] || exec /bin/ln -sfnT ../{MODEL_INFO_DIRECTORY} "$0"',
         f"{own}/{MODEL_INFO_DIRECTORY}"],
    ]  # fmt: skip


def _path_part(name: str) -> str:
    """`name` as one directory name: a hub id's `/` and anything unusual become `--`."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "--", str(name)).strip(".") or "-"


def build_server_environment(settings):
    """Return the environment of one vLLM server, as the unit's EnvironmentFile holds it.

    settings keys: home, load_timeout (required); model and vllm_version (the catalog entry and the release,
    which give the compile cache its directory), device (`cpu` adds the CPU build's KV-cache size,
    cpu_kvcache_space_gib), cuda_visible_devices, sleep_mode and dev_endpoints (as build_serve_args takes
    them), env (the catalog's and the user's, which may override the defaults), api_key (a secret: it goes
    only here, never on the command line). Pure.
    """
    home = _required_text(settings, "home")
    load_timeout = _whole_number(settings.get("load_timeout"))
    if load_timeout is None or load_timeout < 1:
        raise ServeSpecError(
            f"load_timeout must be a whole number of seconds, 1 or more, got {settings.get('load_timeout')!r}"
        )
    env = settings.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(name, str) for name in env):
        raise ServeSpecError(f"env must be a mapping of variable names to values, got {env!r}")
    dev_endpoints = dev_endpoints_open(settings)
    if DEV_MODE_VARIABLE in env:
        raise ServeSpecError(
            f"env sets {DEV_MODE_VARIABLE}, which opens vLLM's development endpoints (/sleep, /collective_rpc, ...) "
            "to every client, API key or not; set dev_endpoints (vllm_server_dev_endpoints) instead, which opens "
            "them to loopback clients alone"
        )
    environment = {
        "HOME": home,
        "HF_HOME": f"{home}/huggingface",
        # Weights are on the host before the server starts: the server never reaches the hub.
        "HF_HUB_OFFLINE": "1",
        # vLLM's own limit on the engine's start; vllm_service's load_timeout bounds the whole load.
        "VLLM_ENGINE_READY_TIMEOUT_S": str(load_timeout),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
        # Python's bytecode of every module the server imports, kept where the unit may write: packages installed
        # without it (a base image's torch had none) are otherwise compiled again by both processes at each start.
        "PYTHONPYCACHEPREFIX": f"{home}/.cache/python-bytecode",
    }
    if settings.get("model") and settings.get("vllm_version"):
        environment.update(compile_cache_environment(home, settings["vllm_version"], settings["model"]))
    if settings.get("device") == "cpu":
        environment["VLLM_CPU_KVCACHE_SPACE"] = str(settings.get("cpu_kvcache_space_gib", 1))
    if settings.get("cuda_visible_devices"):
        environment["CUDA_VISIBLE_DEVICES"] = str(settings["cuda_visible_devices"])
    if dev_endpoints:
        environment[DEV_MODE_VARIABLE] = "1"
    environment.update({name: str(value) for name, value in env.items()})
    if settings.get("api_key"):
        environment[API_KEY_VARIABLE] = settings["api_key"]
    return environment
