# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A tune's candidates: the layouts and server settings of one catalog entry, each a catalog entry of its own.

A tune deploys layouts and server settings of one catalog entry in turn, benchmarks each and keeps the best.
These pure functions take plain data (a checked catalog entry, the tune's options, the saved results) so that
the vllm_tune role only runs what they decide. A candidate reaches the unit as a catalog entry of its own,
derived from the model's, whose source is the weights already on the host: the swap machinery deploys it like
any other entry, and no candidate fetches the weights again. Its resume key says when a saved run measured it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import numbers

from ansible_collections.llmops.vllm.plugins.module_utils.plan.catalog import DERIVED_KEYS, CatalogError, check_entry
from ansible_collections.llmops.vllm.plugins.module_utils.plan.planner import Layout

# The server settings that a grid or a candidate may set; the first two are keys of the catalog entry, the
# others reach the command line through its extra_args.
SETTINGS = ("max_num_seqs", "gpu_memory_utilization", "max_num_batched_tokens", "enforce_eager", "extra_args")
ENTRY_SETTINGS = ("max_num_seqs", "gpu_memory_utilization")
CANDIDATE_KEYS = ("name", "layout", "settings")
# What a candidate ended as. Only `measured` and `failed` are kept for a resumed run: a refusal is planned again
# (it costs milliseconds); a pending candidate (the planner passed it) or a skipped one (the time budget) never ran.
VERDICTS = ("pending", "measured", "failed", "refused", "skipped")
KEPT_VERDICTS = ("measured", "failed")
ENFORCE_EAGER = "--enforce-eager"
BATCHED_TOKENS = "--max-num-batched-tokens"


class TuneError(ValueError):
    """Tune options that do not fit the catalog entry or each other; the message says which."""


def is_whole(value, minimum=1):
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _check_settings(settings, where):
    if not isinstance(settings, dict):
        raise TuneError(f"{where}: settings must be a mapping of {list(SETTINGS)}, got {settings!r}")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise TuneError(f"{where}: unknown settings {unknown}; a tune sets {list(SETTINGS)}")
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        if key in settings and not is_whole(settings[key]):
            raise TuneError(f"{where}: {key} must be a whole number of at least 1, got {settings[key]!r}")
    fraction = settings.get("gpu_memory_utilization", 0.5)
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 < fraction <= 1:
        raise TuneError(f"{where}: gpu_memory_utilization must be a fraction in (0, 1], got {fraction!r}")
    if not isinstance(settings.get("enforce_eager", False), bool):
        raise TuneError(f"{where}: enforce_eager must be true or false, got {settings['enforce_eager']!r}")
    extra = settings.get("extra_args", [])
    if not isinstance(extra, list) or not all(isinstance(arg, str) and arg for arg in extra):
        raise TuneError(f"{where}: extra_args must be a list of arguments, got {extra!r}")
    return settings


def _layouts(entry, layouts):
    """[(name, mapping)] of the layouts to try: names of the entry's own, or mappings (named as `TP8 EP8`)."""
    named = {"default": entry["layout"], **entry["alternatives"]}
    if not layouts:
        return list(named.items())
    chosen = []
    for layout in layouts:
        if isinstance(layout, dict):
            try:
                chosen.append((Layout.from_mapping(layout).describe(), layout))
            except (TypeError, ValueError):
                raise TuneError(f"layout {layout!r} must map parallel sizes to whole numbers") from None
        elif layout in named:
            chosen.append((layout, named[layout]))
        else:
            raise TuneError(f"layout {layout!r} is not a mapping nor one of {entry['name']}'s: {sorted(named)}")
    return chosen


def _grid(grid):
    """Every combination of the grid's values, in the grid's order; [{}] for no grid."""
    if not isinstance(grid, dict):
        raise TuneError(f"the grid must map settings to lists of values, got {grid!r}")
    for key, values in grid.items():
        if key not in SETTINGS:
            raise TuneError(f"the grid has an unknown setting {key!r}; a tune sets {list(SETTINGS)}")
        if not isinstance(values, list) or not values:
            raise TuneError(f"the grid's {key} must be a non-empty list of values, got {values!r}")
    keys = list(grid)
    return [
        dict(zip(keys, combination, strict=True)) for combination in itertools.product(*(grid[key] for key in keys))
    ]


def candidate_name(layout_name, settings):
    """`default`, `tp3 max_num_seqs=8`: the layout and the settings that differ from the entry's."""
    parts = [layout_name]
    for key in SETTINGS:
        if key in settings:
            value = " ".join(settings[key]) if key == "extra_args" else settings[key]
            parts.append(f"{key}={json.dumps(value) if isinstance(value, bool) else value}")
    return " ".join(parts)


def expand(entry, layouts=None, grid=None, candidates=None):
    """The candidates of a tune: {name, layout_name, layout, settings}, in the order they will run.

    Either `candidates` (the user's list: each {layout: a name or a mapping, settings, name}) or the layouts
    (the entry's default and alternatives unless named) times every combination of the grid's values.
    """
    found = []
    if candidates:
        if not isinstance(candidates, list):
            raise TuneError(f"candidates must be a list of {{layout, settings, name}}, got {candidates!r}")
        for position, item in enumerate(candidates):
            where = f"candidate {position + 1}"
            if not isinstance(item, dict) or set(item) - set(CANDIDATE_KEYS):
                raise TuneError(f"{where} must be a mapping of {list(CANDIDATE_KEYS)}, got {item!r}")
            [(layout_name, layout)] = _layouts(entry, [item.get("layout", "default")])
            settings = _check_settings(item.get("settings", {}), where)
            found.append((item.get("name"), layout_name, layout, settings))
    else:
        for (layout_name, layout), settings in itertools.product(_layouts(entry, layouts), _grid(grid or {})):
            found.append((None, layout_name, layout, _check_settings(settings, candidate_name(layout_name, {}))))
    result, names = [], set()
    for name, layout_name, layout, settings in found:
        name = name or candidate_name(layout_name, settings)
        if name in names:
            raise TuneError(f"two candidates are both {name!r}")
        names.add(name)
        result.append({"name": name, "layout_name": layout_name, "layout": layout, "settings": settings})
    return result


def _with_settings(raw, layout, settings):
    """The raw entry with the candidate's layout and settings applied."""
    entry = {**raw, "layout": layout, "alternatives": {}}
    for key in ENTRY_SETTINGS:
        if key in settings:
            entry[key] = settings[key]
    extra = list(raw.get("extra_args", []))
    if "max_num_batched_tokens" in settings:
        extra = [arg for arg in extra if not arg.startswith(BATCHED_TOKENS + "=")]
        if BATCHED_TOKENS in extra:
            del extra[extra.index(BATCHED_TOKENS) : extra.index(BATCHED_TOKENS) + 2]
        extra += [BATCHED_TOKENS, str(settings["max_num_batched_tokens"])]
    if "enforce_eager" in settings:
        extra = [arg for arg in extra if arg != ENFORCE_EAGER] + ([ENFORCE_EAGER] if settings["enforce_eager"] else [])
    entry["extra_args"] = extra + list(settings.get("extra_args", []))
    return entry


def raw_entry(entry):
    """A checked catalog entry as a file holds it: without the keys that checking adds."""
    return {key: value for key, value in entry.items() if key not in DERIVED_KEYS}


def resume_key(entry, candidate, workload):
    """A hash of the model's entry, the candidate and the workload: equal keys measure the same thing."""
    subject = {
        "entry": {key: value for key, value in raw_entry(entry).items() if key != "description"},
        "layout": candidate["layout"],
        "settings": candidate["settings"],
        "workload": workload,
    }
    return hashlib.sha256(json.dumps(subject, sort_keys=True, default=str).encode()).hexdigest()[:16]


def candidate_entry(entry, candidate, key, weights_path=""):
    """(name, raw entry, checked entry) of the catalog entry that deploys `candidate` from `weights_path`, the
    tuned instance's weights on the host (empty: the entry's own source, for a plan before any deploy)."""
    name = f"{entry['name']}_tune_{key[:10]}"
    raw = _with_settings(raw_entry(entry), candidate["layout"], candidate["settings"])
    raw["description"] = f"{entry['name']} tune candidate {candidate['name']}"
    if weights_path:
        raw["source"] = {"kind": "local", "path": weights_path}
    try:
        return name, raw, check_entry(name, raw)
    except CatalogError as error:
        raise TuneError(f"candidate {candidate['name']}: {error}") from None


def overlay_entry(entry, candidate):
    """The model's own entry with the winner's layout and settings: the catalog overlay that deploy.yml reads."""
    raw = _with_settings(raw_entry(entry), candidate["layout"], candidate["settings"])
    raw["description"] = f"{entry.get('description') or entry['name']}; layout and settings from a tune"
    raw["alternatives"] = entry["alternatives"]
    check_entry(entry["name"], raw)
    return raw


def plan_candidates(entry, options, saved=None):
    """Each candidate with its resume key, its derived entry and what a saved run measured of it.

    options: layouts, grid, candidates, workload, weights_path (the tuned instance's weights on the host).
    saved: a previous report of this host (its `candidates`); a candidate whose key it holds as measured or
    failed is not run again.
    """
    kept = {item["key"]: item for item in (saved or {}).get("candidates", []) if item.get("verdict") in KEPT_VERDICTS}
    result = []
    for candidate in expand(entry, options.get("layouts"), options.get("grid"), options.get("candidates")):
        key = resume_key(entry, candidate, options["workload"])
        name, raw, checked = candidate_entry(entry, candidate, key, options.get("weights_path", ""))
        result.append({**candidate, "key": key, "entry_name": name, "entry": checked, "raw_entry": raw,
                       "saved": kept.get(key)})  # fmt: skip
    return result
