# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The model_weights module's options, checked before anything is read or written.

The argument spec checks types and choices; what it cannot say (absolute paths, names the hub accepts,
numbers in range) is checked here, every option at once, each problem naming the option and its value.
"""

from __future__ import annotations

import math
import os
import urllib.parse

from ansible.module_utils.common.text.formatters import human_to_bytes

from ansible_collections.llmops.vllm.plugins.module_utils._weights_listing import repo_problem, revision_problem
from ansible_collections.llmops.vllm.plugins.module_utils._weights_plan import blocking_file

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


def problems(params, environ=None):
    """Every wrong option as 'OPTION=VALUE: why'; empty when all are right."""
    environ = os.environ if environ is None else environ
    found = []

    def check(option, value, problem):
        if problem:
            found.append(f"{option}={value!r}: {problem}")

    check("path", params["path"], _directory_problem(params["path"]))
    source = params["source"]
    if source["kind"] == "hub":
        check("source.repo", source["repo"], repo_problem(source["repo"]))
        check("source.revision", source["revision"], revision_problem(source["revision"]))
        for index, pattern in enumerate(source["allow_patterns"] or []):
            if not isinstance(pattern, str) or not pattern:
                check(
                    f"source.allow_patterns[{index}]",
                    pattern,
                    f"it is {type(pattern).__name__}; each pattern must be a non-empty string such as '*.safetensors'",
                )
    elif source["path"] is not None:
        check("source.path", source["path"], None if os.path.isabs(source["path"]) else "it must be an absolute path")

    mirror = params["mirror"]
    if mirror and "://" in mirror:
        check("mirror", mirror, url_problem(mirror))
    elif mirror:
        check("mirror", mirror, None if os.path.isabs(mirror) else "it must be an http(s) URL or an absolute path")
    if params["hub_endpoint"]:
        check("hub_endpoint", params["hub_endpoint"], url_problem(params["hub_endpoint"]))
    elif environ.get("HF_ENDPOINT"):
        check("HF_ENDPOINT (the environment's hub)", environ["HF_ENDPOINT"], url_problem(environ["HF_ENDPOINT"]))

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
