# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The layout planner: will this tensor/pipeline/data/expert parallel layout load and serve here?

vLLM finds most layout mistakes only after the download and the load (TP 8 of an FP8 model whose
expert shards miss the 128 block: "not divisible by weight quantization block_n = 128"). These pure
functions find them from the model's config.json (its shape, read by `model_shape`), its catalog entry
and the host's GPU facts (the `vllm_gpus` shape of llmops.vllm.gpu_facts) in milliseconds, and on failure
name the rule that broke and the layouts that pass. Without GPU facts (a CPU host) the rules that need GPUs are skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ansible_collections.llmops.vllm.plugins.module_utils.plan.catalog import serve_spec
from ansible_collections.llmops.vllm.plugins.module_utils.plan.model_shape import PlanInputError, model_shape
from ansible_collections.llmops.vllm.plugins.module_utils.service.serve_command import build_serve_args

GIB = 2**30
MIB = 2**20
# vLLM's own default for --gpu-memory-utilization.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# Memory besides weights and KV cache: activations of the profiling batch, CUDA graphs, NCCL buffers, and what the
# driver keeps of the total that nvidia-smi reports. vLLM measures it at start; on one H200 (vLLM 0.26.0) it came
# to 1.0 GiB for a 1.1B bf16 Llama without CUDA graphs and 2.7 GiB for MiniMax-M2.5 cut to 16 layers (FP8, CUDA
# graphs, vocabulary 200,064). 3 GiB keeps the plan's KV cache within 5 % of vLLM's for both and never above it.
DEFAULT_RUNTIME_OVERHEAD_BYTES = 3 * GIB
# Compute capability by GPU name, for GPU facts that do not carry it (nvidia-smi's compute_cap does).
KNOWN_COMPUTE_CAPABILITIES = (
    ("GB300", "10.3"), ("B300", "10.3"), ("GB200", "10.0"), ("B200", "10.0"), ("RTX PRO 6000 Blackwell", "12.0"),
    ("H200", "9.0"), ("H100", "9.0"), ("H800", "9.0"), ("H20", "9.0"), ("GH200", "9.0"),
    ("L40", "8.9"), ("L4", "8.9"), ("A100", "8.0"), ("A800", "8.0"), ("A10", "8.6"),
)  # fmt: skip
# vLLM's block-quantised matmul runs on CUTLASS only when both sides of the weight are multiples of this; others
# fall back to a Triton kernel that asserts on block scales (vLLM 0.26, measured: an FP8 router of 8 experts).
BLOCK_MATMUL_MULTIPLE = 16


@dataclass(frozen=True)
class Layout:
    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    expert: bool = False

    @classmethod
    def from_mapping(cls, layout):
        """From a catalog layout that build_serve_args has already checked (numbers may be text)."""
        return cls(
            tensor=int(layout.get("tensor_parallel_size", 1)),
            pipeline=int(layout.get("pipeline_parallel_size", 1)),
            data=int(layout.get("data_parallel_size", 1)),
            expert=int(layout.get("expert_parallel_size", 1)) > 1,
        )

    @property
    def gpus(self):
        return self.tensor * self.pipeline * self.data

    @property
    def expert_parallel_size(self):
        return self.tensor * self.data if self.expert else 1

    def as_mapping(self):
        layout = {"tensor_parallel_size": self.tensor}
        if self.pipeline > 1:
            layout["pipeline_parallel_size"] = self.pipeline
        if self.data > 1:
            layout["data_parallel_size"] = self.data
        if self.expert:
            layout["expert_parallel_size"] = self.expert_parallel_size
        return layout

    def describe(self):
        parts = [f"TP{self.tensor}"]
        parts += [f"PP{self.pipeline}"] if self.pipeline > 1 else []
        parts += [f"DP{self.data}"] if self.data > 1 else []
        parts += [f"EP{self.expert_parallel_size}"] if self.expert else []
        return " ".join(parts)


# Each rule takes the shape and the layout and returns (passed, detail).


def check_attention_heads(shape, layout):
    if shape.attention_heads % layout.tensor:
        return False, (
            f"{shape.attention_heads} attention heads are not divisible by tensor_parallel_size {layout.tensor}"
        )
    return True, f"{shape.attention_heads // layout.tensor} attention heads per rank"


def check_kv_heads(shape, layout):
    if shape.mla_latent_dim:
        return True, "MLA: one latent KV head, replicated on every tensor parallel rank"
    kv, tp = shape.kv_heads, layout.tensor
    if tp <= kv:
        if kv % tp:
            return False, f"{kv} KV heads are not divisible by tensor_parallel_size {tp}"
        return True, f"{kv // tp} KV heads per rank"
    if tp % kv:
        return False, (
            f"tensor_parallel_size {tp} is above the {kv} KV heads and not a multiple of them, so they cannot be "
            "replicated evenly"
        )
    return True, f"each of the {kv} KV heads replicated on {tp // kv} ranks"


def check_quantization_alignment(shape, layout):
    if not shape.quantization_unit or not shape.quantized_parts:
        return True, f"no block or group alignment needed ({shape.quantization})"
    unit, unit_text = shape.quantization_unit
    shards = []
    for part, size in shape.intermediate_sizes.items():
        if part not in shape.quantized_parts:
            continue
        # Expert parallelism places whole experts on ranks; without it the routed experts are split over every
        # TP x DP rank, everything else by TP.
        whole_experts = part == "routed experts" and layout.expert
        over_data = part == "routed experts" and layout.data > 1
        divisor = 1 if whole_experts else layout.tensor * (layout.data if over_data else 1)
        shard = size / divisor
        if shard != int(shard) or shard % unit:
            split = f"TP {layout.tensor} x DP {layout.data}" if over_data else f"TP {divisor}"
            how = f"{size} (whole experts)" if whole_experts else f"{size} / {split} = {shard:g}"
            # Quote vLLM's own words for FP8 blocks, the error users search for.
            quote = f' ("... = {shard:g} is not divisible by weight quantization block_n = {unit}")'
            return False, (
                f"the {part}' intermediate shard {how} is not a multiple of the {unit_text}; vLLM would fail "
                f"only while loading the weights{quote if 'FP8' in unit_text else ''}"
            )
        shards.append(f"{part} {int(shard)}")
    return True, f"intermediate shards {', '.join(shards)} are multiples of the {unit_text}"


def check_router(shape, _layout):
    if not shape.experts:
        return True, "no experts, no router"
    if not shape.quantized_router:
        return True, f"{shape.experts} outputs, not block-quantised"
    if shape.experts % BLOCK_MATMUL_MULTIPLE:
        return False, (
            f"the router's {shape.experts} outputs (one per expert) are block-quantised with the rest and not a "
            f"multiple of {BLOCK_MATMUL_MULTIPLE}: vLLM's block-quantised matmul leaves CUTLASS for a Triton kernel "
            "that fails the first forward pass (AssertionError in triton_scaled_mm); a checkpoint keeps its router "
            "unquantised (quantization_config.modules_to_not_convert: [gate])"
        )
    return True, f"{shape.experts} outputs, block-quantised, a multiple of {BLOCK_MATMUL_MULTIPLE}"


def check_expert_parallel(shape, layout):
    if not layout.expert:
        return True, "off" if not shape.experts else f"off: the {shape.experts} experts are split by TP"
    if not shape.experts:
        return False, "expert parallelism needs a mixture-of-experts model; this one has no experts"
    size = layout.expert_parallel_size
    if shape.experts % size:
        return False, f"{shape.experts} experts are not divisible by the expert parallel size {size} (TP x DP)"
    return True, f"{shape.experts // size} of the {shape.experts} experts per rank"


def check_pipeline(shape, layout):
    if layout.pipeline > shape.layers:
        return False, f"pipeline_parallel_size {layout.pipeline} is above the {shape.layers} layers"
    return True, f"{math.ceil(shape.layers / layout.pipeline)} layers per stage"


def _check_context(shape, max_model_len):
    limit = shape.max_position_embeddings
    if not (limit and max_model_len):
        return {"status": "skipped", "detail": "the model's max_position_embeddings or max_model_len unknown"}
    if max_model_len > limit:
        return {"status": "fail", "detail": f"max_model_len {max_model_len} is above the model's {limit} positions"}
    return {"status": "pass", "detail": f"{max_model_len} of the model's {limit} positions"}


MODEL_RULES = (
    ("attention_heads", check_attention_heads),
    ("kv_heads", check_kv_heads),
    ("quantization_alignment", check_quantization_alignment),
    ("router", check_router),
    ("expert_parallel", check_expert_parallel),
    ("pipeline", check_pipeline),
)


def _is_count(value, minimum=0):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= minimum


def gpu_list(gpus):
    """The GPUs of the facts, [] on a host without any; PlanInputError for facts of another shape."""
    if not gpus or not gpus.get("present"):
        return []
    listed = gpus.get("gpus")
    if not isinstance(listed, list) or not all(isinstance(gpu, dict) for gpu in listed):
        raise PlanInputError("GPU facts: gpus must be a list of GPUs (the vllm_gpus fact of llmops.vllm.gpu_facts)")
    for position, gpu in enumerate(listed):
        index = gpu.get("index", position)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise PlanInputError(f"GPU facts: GPU {position + 1} has index {index!r}, not a GPU index (0, 1, ...)")
        if not _is_count(gpu.get("memory_total_mib")) or gpu["memory_total_mib"] <= 0:
            raise PlanInputError(f"GPU facts: GPU {index} has no memory_total_mib")
        if not _is_count(gpu.get("memory_used_mib", 0)):
            raise PlanInputError(f"GPU facts: GPU {index} has memory_used_mib {gpu['memory_used_mib']!r}, not MiB")
    topology = gpus.get("topology") or {}
    pairs = topology.get("pairs") or [] if isinstance(topology, dict) else None
    if not isinstance(pairs, list) or not all(isinstance(pair, dict) for pair in pairs):
        raise PlanInputError(f"GPU facts: topology must be a mapping with a list of pairs, got {topology!r}")
    return listed


def capability_tuple(text):
    """'9.0' -> (9, 0), so that capabilities compare as numbers ('10.0' > '9.0')."""
    major, minor = ([*str(text).split("."), "0"])[:2]
    return int(major), int(minor)


def compute_capability(gpu):
    """(major, minor) from the facts' optional compute_capability, else from the GPU's name, else None."""
    value = gpu.get("compute_capability")
    if value is None:
        value = next((cc for name, cc in KNOWN_COMPUTE_CAPABILITIES if name in str(gpu.get("name", ""))), None)
    return None if value is None else capability_tuple(value)


def kv_bytes_per_token(shape, layout, dtype_bytes):
    """KV cache bytes that one token takes on each GPU of the layout."""
    layers = math.ceil(shape.layers / layout.pipeline)
    if shape.mla_latent_dim:
        return layers * shape.mla_latent_dim * dtype_bytes
    kv_heads_per_rank = max(1, shape.kv_heads // layout.tensor)
    return 2 * layers * kv_heads_per_rank * shape.head_dim * dtype_bytes


def weights_per_gpu(shape, layout, checkpoint_bytes):
    # vLLM's MoE layers fold DP into TP: the routed experts are spread over every TP x DP rank, as whole experts
    # under expert parallelism, else as slices of each.
    expert_divisor = layout.tensor * layout.data
    share = shape.expert_byte_fraction / expert_divisor + (1 - shape.expert_byte_fraction) / layout.tensor
    return int(checkpoint_bytes * share / layout.pipeline)


def memory_plan(shape, layout, gpus, settings):
    """The memory of one GPU of the layout, and how many max_model_len sequences its KV cache holds."""
    total = min(gpu["memory_total_mib"] for gpu in gpus[: layout.gpus]) * MIB
    usable = int(total * settings["gpu_memory_utilization"])
    weights = weights_per_gpu(shape, layout, settings["checkpoint_bytes"])
    per_token = kv_bytes_per_token(shape, layout, settings["kv_cache_dtype_bytes"])
    kv_cache = usable - weights - settings["runtime_overhead_bytes"]
    tokens = max(0, kv_cache) // per_token
    per_replica = tokens // settings["max_model_len"]
    return {
        "gpu_memory_bytes": total,
        "gpu_memory_utilization": settings["gpu_memory_utilization"],
        "usable_bytes": usable,
        "weights_bytes": weights,
        "runtime_overhead_bytes": settings["runtime_overhead_bytes"],
        "kv_cache_bytes": max(0, kv_cache),
        "kv_cache_bytes_per_token": per_token,
        "kv_cache_tokens": tokens,
        "max_model_len": settings["max_model_len"],
        "max_concurrency_at_max_model_len": per_replica * layout.data,
        "weights_gib": round(weights / GIB, 1),
        "kv_cache_gib": round(max(0, kv_cache) / GIB, 1),
    }


def check_memory(memory):
    if memory["kv_cache_bytes"] <= 0:
        return False, (
            f"weights {memory['weights_bytes'] / GIB:.1f} GiB + runtime {memory['runtime_overhead_bytes'] / GIB:.1f} "
            f"GiB per GPU exceed the {memory['usable_bytes'] / GIB:.1f} GiB that gpu_memory_utilization "
            f"{memory['gpu_memory_utilization']} leaves of {memory['gpu_memory_bytes'] / GIB:.1f} GiB"
        )
    if memory["max_concurrency_at_max_model_len"] < 1:
        return False, (
            f"the KV cache left ({memory['kv_cache_bytes'] / GIB:.1f} GiB per GPU) holds {memory['kv_cache_tokens']} "
            f"tokens, less than one sequence of max_model_len {memory['max_model_len']}; vLLM refuses to start: "
            f"set max_model_len to {memory['kv_cache_tokens']} or less"
        )
    return True, (
        f"weights {memory['weights_bytes'] / GIB:.1f} GiB + KV cache {memory['kv_cache_bytes'] / GIB:.1f} GiB per GPU: "
        f"{memory['max_concurrency_at_max_model_len']} sequences of {memory['max_model_len']} tokens at once"
    )


def _links(gpus, topology, used):
    indices = {gpu.get("index", position) for position, gpu in enumerate(gpus[:used])}
    return [pair for pair in topology.get("pairs") or [] if set(pair.get("gpus", ())) <= indices]


def _gpu_checks(shape, layout, gpus, settings):
    """(rule, passed, detail) for the rules that need GPUs (passed None: skipped), and the memory plan."""
    if layout.gpus > len(gpus):
        return [("gpu_count", False, f"{layout.describe()} needs {layout.gpus} GPUs; this host has {len(gpus)}")], None
    checks, memory = gpu_rules(shape, layout, gpus[: layout.gpus], settings)
    return [("gpu_count", True, f"{layout.gpus} of {len(gpus)} GPUs"), *checks], memory


def gpu_rules(shape, layout, used, settings):
    """(rule, passed, detail) for compute capability and memory on `used`, the GPUs that the layout takes on one
    host (passed None: skipped), and the memory plan of one of them."""
    checks = []
    wanted = settings["min_compute_capability"]
    if wanted:
        found = {compute_capability(gpu) for gpu in used}
        if None in found:
            checks.append(("compute_capability", False, f"needs compute capability {wanted}; the GPU facts lack it"))
        elif min(found) < capability_tuple(wanted):
            have = ".".join(map(str, min(found)))
            detail = f"needs compute capability {wanted} or above; {used[0].get('name', 'the GPU')} has {have}"
            checks.append(("compute_capability", False, detail))
        else:
            checks.append(("compute_capability", True, f"compute capability {wanted} or above"))
    if shape is None:
        return checks, None
    missing = [key for key in ("checkpoint_bytes", "max_model_len") if not settings[key]]
    if missing:
        checks.append(("memory", None, f"not checked: {' and '.join(missing)} unknown"))
        return checks, None
    memory = memory_plan(shape, layout, used, settings)
    checks.append(("memory", *check_memory(memory)))
    return checks, memory


def model_checks(shape, layout, settings):
    """The rules of the model's shape and context on one layout; a check is {rule, status, detail}."""
    if shape is None:
        return [{"rule": "model", "status": "skipped", "detail": "no config.json: model rules not checked"}]
    checks = [{"rule": "max_model_len", **_check_context(shape, settings["max_model_len"])}]
    for rule, check in MODEL_RULES:
        passed, detail = check(shape, layout)
        checks.append({"rule": rule, "status": "pass" if passed else "fail", "detail": detail})
    return checks


def evaluate(shape, layout, gpus, settings):
    """Every rule on one layout: (checks, memory). A check is {rule, status, detail}."""
    checks = model_checks(shape, layout, settings)
    if not gpus:
        checks.append({"rule": "gpus", "status": "skipped", "detail": "no GPU facts: GPU count and memory not checked"})
        return checks, None
    gpu_checks, memory = _gpu_checks(shape, layout, gpus, settings)
    statuses = {True: "pass", False: "fail", None: "skipped"}
    checks += [{"rule": rule, "status": statuses[ok], "detail": detail} for rule, ok, detail in gpu_checks]
    return checks, memory


def _failures(checks):
    return [check for check in checks if check["status"] == "fail"]


def candidate_layouts(shape, gpu_count):
    """Layouts worth trying on `gpu_count` GPUs: powers of two of TP and DP, with and without EP."""
    sizes = [2**power for power in range(gpu_count.bit_length()) if 2**power <= gpu_count]
    for tensor in sizes:
        for data in sizes:
            if tensor * data > gpu_count:
                continue
            for expert in (False, True) if shape.experts and tensor * data > 1 else (False,):
                yield Layout(tensor=tensor, data=data, expert=expert)


def passing_layouts(shape, gpus, settings, named):
    """Named layouts that pass (catalog order), then other layouts that pass (fewest GPUs first)."""
    found, seen = [], set()
    generated = sorted(candidate_layouts(shape, len(gpus)), key=lambda lay: (lay.gpus, lay.tensor, lay.expert))
    for name, layout in [*named, *((None, layout) for layout in generated)]:
        if layout in seen:
            continue
        seen.add(layout)
        checks, memory = evaluate(shape, layout, gpus, settings)
        if not _failures(checks):
            found.append(
                {
                    "name": name or layout.describe(),
                    "layout": layout.as_mapping(),
                    "gpus": layout.gpus,
                    "weights_gib": memory and memory["weights_gib"],
                    "max_concurrency_at_max_model_len": memory and memory["max_concurrency_at_max_model_len"],
                }
            )
    return found


def _warnings(shape, layout, gpus, topology, settings):
    warnings = []
    used = gpus[: layout.gpus]
    if shape and shape.mla_latent_dim and layout.tensor > 1 and gpus:
        slow = [pair for pair in _links(gpus, topology, layout.gpus) if pair.get("kind") != "nvlink"]
        if slow or (not topology.get("pairs") and not topology.get("all_nvlink", True)):
            link = ""
            if slow:
                link = f" ({slow[0].get('link')} between GPUs {slow[0]['gpus'][0]} and {slow[0]['gpus'][1]})"
            warnings.append(
                f"MLA model with tensor parallel {layout.tensor} over PCIe{link}: attention needs an all-reduce on "
                f"every one of its {shape.layers} layers, which PCIe makes the bottleneck; expect far lower throughput "
                "than on NVLink GPUs"
            )
    utilization = settings["gpu_memory_utilization"]
    busy = [gpu for gpu in used if gpu.get("memory_used_mib", 0) > gpu["memory_total_mib"] * (1 - utilization)]
    if busy:
        listed = ", ".join(f"GPU {gpu.get('index')} ({gpu['memory_used_mib']} MiB)" for gpu in busy)
        warnings.append(
            f"memory is in use on {listed}: vLLM needs {utilization:.0%} of each GPU free when it starts "
            "(a server of this deployment that is restarted frees its own)"
        )
    if shape and settings["quantization"] not in (None, shape.quantization):
        warnings.append(
            f"the catalog says quantization {settings['quantization']}, config.json says {shape.quantization}"
        )
    return warnings


def _named_layouts(entry):
    return [("default", Layout.from_mapping(entry["layout"]))] + [
        (name, Layout.from_mapping(layout)) for name, layout in entry["alternatives"].items()
    ]


def _chosen_layout(entry, layout, shape, gpus, settings):
    """(name, Layout) of a layout given as `default`, an alternative's name, `auto` or a mapping."""
    if isinstance(layout, dict):
        build_serve_args(serve_spec(entry, layout, model="weights"))
        return "custom", Layout.from_mapping(layout)
    named = dict(_named_layouts(entry))
    if layout in named:
        return layout, named[layout]
    if layout != "auto":
        raise PlanInputError(f"layout {layout!r} is not auto, default, a mapping, or one of {sorted(named)}")
    if shape is not None and gpus:
        passing = passing_layouts(shape, gpus, settings, _named_layouts(entry))
        if passing:
            return passing[0]["name"], Layout.from_mapping(passing[0]["layout"])
    return "default", named["default"]


def _kv_cache_dtype_bytes(extra_args):
    # --kv-cache-dtype fp8* stores one byte per value; auto keeps the model's 16-bit dtype.
    for position, arg in enumerate(extra_args):
        if arg.startswith("--kv-cache-dtype"):
            value = arg.partition("=")[2] or (extra_args[position + 1] if position + 1 < len(extra_args) else "")
            return 1 if value.startswith("fp8") else 2
    return 2


def planning_settings(entry, shape, options):
    """What the rules need besides the shape and the layout: the entry's settings, and the options over them."""
    return {
        "max_model_len": options.get("max_model_len")
        or entry["max_model_len"]
        or (shape and shape.max_position_embeddings),
        "checkpoint_bytes": options.get("checkpoint_bytes") or entry.get("checkpoint_bytes"),
        "gpu_memory_utilization": float(entry["gpu_memory_utilization"] or DEFAULT_GPU_MEMORY_UTILIZATION),
        "runtime_overhead_bytes": options.get("runtime_overhead_bytes") or DEFAULT_RUNTIME_OVERHEAD_BYTES,
        "kv_cache_dtype_bytes": _kv_cache_dtype_bytes(entry["extra_args"]),
        "min_compute_capability": entry["requires"].get("min_compute_capability"),
        "quantization": entry["quantization"],
    }


def plan(entry, config=None, gpus=None, layout="default", **options):
    """Plan one catalog entry on one host.

    entry: a checked catalog entry; config: config.json as a dict, or None when there is none yet
    (generated models); gpus: the vllm_gpus facts, or None; layout: `default`, an alternative's name,
    `auto`, or a mapping of parallel sizes. options: max_model_len, checkpoint_bytes,
    runtime_overhead_bytes, model_path, host, port. Returns a dict with `ok`, the layout, its serve
    arguments, the checks, the memory plan, warnings, and on failure `failed_rules` (every rule that failed;
    `failed_rule` is the first), `reason` (what each found) and `passing_layouts`.
    """
    if "group" in entry:
        raise PlanInputError(
            f"{entry['name']} is a multi-host entry (group.hosts {entry['group']['hosts']}): it is planned over "
            "every host of its group, not on one host"
        )
    shape = None if config is None else model_shape(config)
    listed = gpu_list(gpus)
    settings = planning_settings(entry, shape, options)
    name, chosen = _chosen_layout(entry, layout, shape, listed, settings)
    checks, memory = evaluate(shape, chosen, listed, settings)
    failures = _failures(checks)
    spec_entry = {**entry, "max_model_len": options.get("max_model_len") or entry["max_model_len"]}
    model_path = options.get("model_path") or entry["source"].get("repo") or entry["name"]
    host, port = options.get("host", "0.0.0.0"), options.get("port", 8000)
    spec = serve_spec(spec_entry, chosen.as_mapping(), model_path, host, port)
    result = {
        "ok": not failures,
        "layout_name": name,
        "layout": chosen.as_mapping(),
        "description": chosen.describe(),
        "gpus": chosen.gpus,
        "serve_args": build_serve_args(spec),
        "checks": checks,
        "memory": memory,
        "layout_warnings": _warnings(shape, chosen, listed, (gpus or {}).get("topology") or {}, settings),
        "failed_rule": failures[0]["rule"] if failures else None,
        "failed_rules": [failure["rule"] for failure in failures],
        "passing_layouts": [],
    }
    result["summary"] = _summary(entry, result)
    if failures:
        if shape is not None and listed:
            result["passing_layouts"] = passing_layouts(shape, listed, settings, _named_layouts(entry))
        result["reason"] = f"{entry['name']} {chosen.describe()}: " + "; ".join(
            failure["detail"] for failure in failures
        )
    return result


def _summary(entry, result):
    """One line for people: what the plan found, or what it could not check."""
    head = f"{entry['name']} {result['description']}"
    if any(check["rule"] == "gpu_count" for check in result["checks"]):
        head += f" on {result['gpus']} GPU(s)"
    memory = result["memory"]
    if memory:
        return (
            f"{head}: weights {memory['weights_gib']} GiB + KV cache {memory['kv_cache_gib']} GiB per GPU, "
            f"{memory['max_concurrency_at_max_model_len']} sequence(s) of {memory['max_model_len']} tokens at once"
        )
    skipped = [check["rule"] for check in result["checks"] if check["status"] == "skipped"]
    return f"{head}; not checked: {', '.join(skipped)}" if skipped else head


def _weights_note(item):
    return f" ({item['weights_gib']} GiB of weights per GPU)" if item["weights_gib"] else ""


def failure_message(result):
    """One message for a failed plan: every rule that failed, what each found, and what would pass."""
    passing = result["passing_layouts"]
    if passing:
        alternatives = "; ".join(f"{item['name']} {item['layout']}{_weights_note(item)}" for item in passing[:6])
        advice = f"Layouts that pass on this host: {alternatives}"
    else:
        advice = "No layout of up to this host's GPUs passes."
    rules = result["failed_rules"]
    named = f"rule {rules[0]}" if len(rules) == 1 else f"rules {', '.join(rules)}"
    return f"Layout {named} failed for {result['reason']}. {advice}"
