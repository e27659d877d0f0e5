# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The options of the modules that read weights (model_weights) or their config.json (vllm_plan), checked before
anything is read or written.

The argument spec checks types and choices; what it cannot say (absolute paths, names the hub accepts,
numbers in range) is checked here, every option at once, each problem named 'OPTION=VALUE: why'.
"""

from __future__ import annotations

import math
import os
import urllib.parse

from ansible.module_utils.common.text.formatters import human_to_bytes

from ansible_collections.llmops.vllm.plugins.module_utils.weights.listing import repo_problem, revision_problem
from ansible_collections.llmops.vllm.plugins.module_utils.weights.plan import blocking_file

MAX_WORKERS = 256


def reserve_bytes(value):
    """`reserve` in bytes (`1G`, `500M`, `0`), or ValueError."""
    return human_to_bytes(str(value).strip())


def url_problem(value):
    """Why `value` is not the http(s) address of a server, or None."""
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "it must be an http:// or https:// URL with a host"
    if parts.query or parts.fragment:
        return "it must not have a query or a fragment"
    return None


def _directory_problem(path):
    if not os.path.isabs(path):
        return "it must be an absolute path"
    blocker = blocking_file(path)
    if blocker == os.path.abspath(path):
        return "it is a file, not a directory"
    if blocker:
        return f"{blocker} is a file, not a directory, so nothing can be made under it"
    return None


def _problem(option, value, why):
    return [f"{option}={value!r}: {why}"] if why else []


def hub_problems(repo, revision, options=("source.repo", "source.revision")):
    """What is wrong with a hub repository and its revision, under the names of their `options`."""
    return _problem(options[0], repo, repo_problem(repo)) + _problem(options[1], revision, revision_problem(revision))


def where_problems(mirror, hub_endpoint, environ=None):
    """What is wrong with where the files come from: the mirror (a URL or a path), the hub's address."""
    environ = os.environ if environ is None else environ
    found = []
    if mirror and "://" in mirror:
        found += _problem("mirror", mirror, url_problem(mirror))
    elif mirror:
        found += _problem(
            "mirror", mirror, None if os.path.isabs(mirror) else "it must be an http(s) URL or an absolute path"
        )
    if hub_endpoint:
        found += _problem("hub_endpoint", hub_endpoint, url_problem(hub_endpoint))
    elif environ.get("HF_ENDPOINT"):
        found += _problem(
            "HF_ENDPOINT (the environment's hub)", environ["HF_ENDPOINT"], url_problem(environ["HF_ENDPOINT"])
        )
    return found


def problems(params, environ=None):
    """Every wrong option of model_weights as 'OPTION=VALUE: why'; empty when all are right."""
    found = []

    def check(option, value, problem):
        found.extend(_problem(option, value, problem))

    check("path", params["path"], _directory_problem(params["path"]))
    source = params["source"]
    if source["kind"] == "hub":
        found.extend(hub_problems(source["repo"], source["revision"]))
        for index, pattern in enumerate(source["allow_patterns"] or []):
            if not isinstance(pattern, str) or not pattern:
                check(
                    f"source.allow_patterns[{index}]",
                    pattern,
                    f"it is {type(pattern).__name__}; each pattern must be a non-empty string such as '*.safetensors'",
                )
    elif source["path"] is not None:
        check("source.path", source["path"], None if os.path.isabs(source["path"]) else "it must be an absolute path")

    found.extend(where_problems(params["mirror"], params["hub_endpoint"], environ))

    margin = params["margin"]
    check("margin", margin, None if math.isfinite(margin) and margin >= 0 else "it must be a fraction of 0 or more")
    try:
        reserve_bytes(params["reserve"])
    except ValueError:
        check("reserve", params["reserve"], "it must be a size of 0 or more, in bytes or with a unit such as 10G")
    check("timeout", params["timeout"], None if params["timeout"] > 0 else "it must be more than 0 seconds")
    workers = params["workers"]
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        check("workers", workers, f"it must be from 1 to {MAX_WORKERS}")
    progress_file = params["progress_file"]
    if progress_file is not None and not os.path.isabs(progress_file):
        check("progress_file", progress_file, "it must be an absolute path")
    return found
