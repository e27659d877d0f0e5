# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The model catalog: one YAML file per model, found by name in an ordered list of directories.

A user's own directories come first, so an entry there overrides the collection's entry of the same
name. Reading is separate from checking: `check_entry` is pure and says exactly which key is wrong,
including every server setting, so that a deploy fails on a bad entry before it changes any host.
The facts that the layout planner needs beyond config.json (checkpoint size, quantisation, GPU
requirements) are checked here too, and the entry gets `checkpoint_bytes` from `checkpoint_size`.
An entry with `group` is one model over the hosts of an inventory group (plan/group_layout.py).
"""

from __future__ import annotations

import os
import re

from ansible_collections.llmops.vllm.plugins.module_utils.observability.alert_rules import check_slo
from ansible_collections.llmops.vllm.plugins.module_utils.plan.group_layout import (
    check_group,
    check_group_entry_settings,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.serve_command import ServeSpecError, build_serve_args

ENTRY_NAME = re.compile(r"[a-z0-9][a-z0-9_]*\Z")
# "230 GB", "540GiB", "1.2 TB": decimal units as the hub shows sizes, binary ones as nvidia-smi does.
SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?) *([KMGT]i?B)\Z")
SIZE_UNITS = {
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}  # fmt: skip
COMPUTE_CAPABILITY = re.compile(r"[0-9]+\.[0-9]+\Z")
# What the weights are stored as; `none` is the config's own dtype (bf16/fp16).
QUANTIZATIONS = ("none", "fp8", "int4", "int8", "nvfp4", "mxfp4")
REQUIREMENT_KEYS = ("min_compute_capability",)
CATALOG_SUFFIXES = (".yml", ".yaml")
SOURCE_KINDS = ("generated", "hub", "local")
# The keys each kind of source takes. A mirror is not among them: where a fleet fetches from is a
# deployment's choice (the collection's vllm_mirror), not a property of the model.
SOURCE_KEYS = {
    "hub": ("repo", "revision", "allow_patterns"),
    "local": ("path",),
    "generated": ("vocab_size", "hidden_size", "num_hidden_layers", "seed"),
}
HUB_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+\Z")

ENTRY_DEFAULTS = {
    "description": "",
    "layout": {"tensor_parallel_size": 1},
    "alternatives": {},
    "max_model_len": None,
    "max_num_seqs": None,
    "gpu_memory_utilization": None,
    "trust_remote_code": False,
    # Start the server with vLLM's sleep mode, so that a swap can put it to sleep instead of stopping it
    # (CUDA builds only; docs/fleet.md).
    "sleep_mode": False,
    # Open vLLM's development endpoints (VLLM_SERVER_DEV_MODE) to the host itself alone; sleep mode opens them.
    "dev_endpoints": False,
    "extra_args": [],
    "env": {},
    # Seconds the model may take from start to serving; big checkpoints load for 10+ minutes.
    "load_timeout": 600,
    # Seconds in-flight requests may take to finish when the server stops (vLLM's --shutdown-timeout).
    "drain_timeout": 30,
    # Size of the weights as stored ("230 GB"); the planner divides it over the GPUs.
    "checkpoint_size": None,
    "quantization": None,
    # What the GPUs must offer, e.g. {min_compute_capability: "10.0"} for FP4 tensor cores (Blackwell).
    "requires": {},
    # Latency objectives, as vllm_bench names its results ({p99_ttft_ms: 500}): the vllm_prometheus role alerts
    # when an instance of the model misses one (docs/observability.md).
    "slo": {},
}
REQUIRED_KEYS = ("source", "served_name")
# Keys that an entry holds only when given: `group` makes it a multi-host entry (plan/group_layout.py).
OPTIONAL_KEYS = ("group",)
# Keys that check_entry adds; an entry passed on (to a module) carries them.
DERIVED_KEYS = ("name", "checkpoint_bytes")


class CatalogError(ValueError):
    """An unknown model name or an entry that does not follow the catalog's schema."""


def _fail(name, message):
    raise CatalogError(f"catalog entry {name!r}: {message}")


def serve_spec(entry, layout, model, host="0.0.0.0", port=8000):
    """The spec of `build_serve_args` for this entry served from `model` with `layout`."""
    spec = {key: entry[key] for key in ("served_name", "max_model_len", "max_num_seqs", "gpu_memory_utilization")}
    spec.update(model=model, host=host, port=port, layout=layout)
    spec.update(trust_remote_code=entry["trust_remote_code"], sleep_mode=entry["sleep_mode"])
    spec.update(dev_endpoints=entry["dev_endpoints"])
    spec.update(extra_args=entry["extra_args"])
    return spec


def _check_server_settings(name, entry, layout, alternative=None):
    """Build the server's command line once, so a bad layout or flag fails before any host changes."""
    where = f"alternatives.{alternative}: " if alternative else ""
    if not isinstance(layout, dict):
        _fail(name, f"{where}layout must be a mapping of parallel sizes, got {layout!r}")
    try:
        build_serve_args(serve_spec(entry, layout, model="weights"))
    except ServeSpecError as error:
        _fail(name, f"{where}{error}")


def size_in_bytes(size):
    """Bytes of a size given as a whole number of bytes or as text with a unit ("230 GB", "540 GiB")."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    match = SIZE.match(size.strip()) if isinstance(size, str) else None
    if not match or float(match.group(1)) <= 0:
        raise ValueError(
            f"must be a number of bytes or a size with a unit ({', '.join(SIZE_UNITS)}), e.g. '230 GB', got {size!r}"
        )
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2)])


def _check_planning_facts(name, entry):
    if entry["checkpoint_size"] is not None:
        try:
            entry["checkpoint_bytes"] = size_in_bytes(entry["checkpoint_size"])
        except ValueError as error:
            _fail(name, f"checkpoint_size {error}")
    else:
        entry["checkpoint_bytes"] = None
    if entry["quantization"] is not None and entry["quantization"] not in QUANTIZATIONS:
        _fail(name, f"quantization must be one of {list(QUANTIZATIONS)}, got {entry['quantization']!r}")
    requires = entry["requires"]
    if not isinstance(requires, dict):
        _fail(name, f"requires must be a mapping, e.g. {{min_compute_capability: '10.0'}}, got {requires!r}")
    unknown = sorted(set(requires) - set(REQUIREMENT_KEYS))
    if unknown:
        _fail(name, f"requires has unknown keys {unknown}; known keys: {list(REQUIREMENT_KEYS)}")
    capability = requires.get("min_compute_capability")
    if capability is not None and not COMPUTE_CAPABILITY.match(str(capability)):
        _fail(name, f"requires.min_compute_capability must be MAJOR.MINOR as a string, e.g. '10.0', got {capability!r}")


def _check_source(name, source):
    """The weights' source: the hub (repo at a revision), weights already on the host, or generated."""
    if not isinstance(source, dict) or source.get("kind") not in SOURCE_KINDS:
        _fail(name, f"source must be a mapping whose kind is one of {list(SOURCE_KINDS)}, got {source!r}")
    kind = source["kind"]
    unknown = sorted(set(source) - {"kind", *SOURCE_KEYS[kind]})
    if unknown:
        _fail(name, f"source: unknown keys {unknown} for kind {kind}; known: {list(SOURCE_KEYS[kind])}")
    if kind == "hub":
        if not isinstance(source.get("repo"), str) or not HUB_REPO.match(source["repo"]):
            _fail(name, f"a hub source needs repo (owner/name on the Hugging Face hub), got {source.get('repo')!r}")
        if not isinstance(source.get("revision", "main"), str) or not source.get("revision", "main"):
            _fail(name, f"source.revision must be a branch, tag or commit hash, got {source['revision']!r}")
        patterns = source.get("allow_patterns", [])
        if not isinstance(patterns, list) or not all(isinstance(pattern, str) and pattern for pattern in patterns):
            _fail(name, f"source.allow_patterns must be a list of shell patterns, got {patterns!r}")
    elif kind == "local":
        if not isinstance(source.get("path"), str) or not source["path"].startswith("/"):
            _fail(name, f"a local source needs path, an absolute directory on the host, got {source.get('path')!r}")
    else:
        for key in SOURCE_KEYS["generated"]:
            value = source.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                _fail(name, f"source.{key} must be a whole number, got {value!r}")


def check_entry(name, raw_entry):
    """Return the entry with defaults filled in and `name` added, or raise CatalogError."""
    if not isinstance(raw_entry, dict):
        _fail(name, f"must be a mapping, got {type(raw_entry).__name__}")
    known = set(ENTRY_DEFAULTS) | set(REQUIRED_KEYS) | set(OPTIONAL_KEYS)
    unknown = sorted(set(raw_entry) - known)
    if unknown:
        _fail(name, f"unknown keys {unknown}; known keys: {sorted(known)}")
    missing = [key for key in REQUIRED_KEYS if key not in raw_entry]
    if missing:
        _fail(name, f"missing required keys {missing}")
    entry = dict(ENTRY_DEFAULTS, **raw_entry)
    _check_source(name, entry["source"])
    _check_server_settings(name, entry, entry["layout"])
    if not isinstance(entry["alternatives"], dict):
        _fail(name, "alternatives must map a layout name to a layout")
    for alternative, layout in entry["alternatives"].items():
        _check_server_settings(name, entry, layout, alternative)
    for key, minimum in (("load_timeout", 1), ("drain_timeout", 0)):
        if isinstance(entry[key], bool) or not isinstance(entry[key], int) or entry[key] < minimum:
            _fail(name, f"{key} must be a whole number of seconds, at least {minimum}, got {entry[key]!r}")
    if not isinstance(entry["env"], dict):
        _fail(name, "env must map variable names to values")
    entry["env"] = {str(key): str(value) for key, value in entry["env"].items()}
    if "group" in entry:
        try:
            entry["group"] = check_group(entry["group"], entry["layout"])
            check_group_entry_settings(entry)
        except ValueError as error:
            _fail(name, str(error))
    _check_planning_facts(name, entry)
    try:
        entry["slo"] = check_slo(entry["slo"])
    except ValueError as error:
        _fail(name, f"slo {error}")
    entry["name"] = name
    return entry


def catalog_files(directories):
    """Map each model name to its file, the first directory in the list winning."""
    found = {}
    for directory in directories:
        if not os.path.isdir(directory):
            raise CatalogError(f"catalog directory {directory!r} does not exist")
        for file_name in sorted(os.listdir(directory)):
            stem, suffix = os.path.splitext(file_name)
            if suffix in CATALOG_SUFFIXES and ENTRY_NAME.match(stem):
                found.setdefault(stem, os.path.join(directory, file_name))
    return found


def find_entry_file(name, directories):
    """The file of model `name`, or a CatalogError that lists every known name."""
    files = catalog_files(directories)
    if name not in files:
        known = ", ".join(sorted(files)) or "none"
        raise CatalogError(f"unknown model {name!r}; the catalog ({', '.join(directories)}) knows: {known}")
    return files[name]
