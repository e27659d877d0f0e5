# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The router's workers file (CONFIG_DIR/workers.json), the plan of a change to its workers, and the lists the
router gives of them."""

from __future__ import annotations

import fcntl
import json
from contextlib import contextmanager

from ansible_collections.llmops.vllm.plugins.module_utils.common.file_writer import current_text, write_if_changed
from ansible_collections.llmops.vllm.plugins.module_utils.router.record import FIX, RouterError
from ansible_collections.llmops.vllm.plugins.module_utils.service.vllm_api import (
    check_base_url,
)


def check_worker_urls(urls) -> list[str]:
    """Worker base URLs, each checked, without repeats, in the order given."""
    if not isinstance(urls, (list, tuple)):
        raise RouterError(f"workers must be a list of base URLs, got {urls!r}")
    checked = []
    for url in urls:
        try:
            base = check_base_url(url)
        except ValueError as error:
            raise RouterError(f"worker {url!r}: {error}") from None
        if base not in checked:
            checked.append(base)
    return checked


def workers_text(urls: list[str]) -> str:
    return json.dumps({"workers": list(urls)}, indent=2) + "\n"


def read_workers(path: str) -> list[str]:
    """The workers that the router starts with; [] when the file is not there yet."""
    text = current_text(path)
    if text is None:
        return []
    try:
        return check_worker_urls(json.loads(text)["workers"])
    except (ValueError, KeyError, TypeError) as error:
        raise RouterError(f"The router's workers file {path} cannot be read ({error}); {FIX}") from error


def write_workers(module, path: str, urls: list[str]) -> bool:
    return write_if_changed(module, path, workers_text(urls), 0o644)


@contextmanager
def workers_lock(path: str):
    """One change of the router's workers at a time: hosts of one play drain through the same router at once."""
    with open(path + ".lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def plan_workers(current: list[str], workers=None, add=(), remove=()) -> tuple[list[str], list[str], list[str]]:
    """(to add, to remove, the workers after): the exact set `workers`, or `current` with `add` and less `remove`."""
    current = check_worker_urls(current)
    if workers is not None:
        wanted = check_worker_urls(workers)
    else:
        gone = check_worker_urls(remove)
        wanted = [url for url in current if url not in gone] + [
            url for url in check_worker_urls(add) if url not in current and url not in gone
        ]
    return (
        [url for url in wanted if url not in current],
        [url for url in current if url not in wanted],
        wanted,
    )


def parse_worker_list(body: str) -> list[str]:
    """The URLs of /list_workers ({"urls": [...]}), sorted; RouterError for another answer."""
    try:
        # The router lists them in its hash map's order, which changes from one start to the next.
        return sorted(check_worker_urls(json.loads(body)["urls"]))
    except (ValueError, KeyError, TypeError) as error:
        raise RouterError(f"the router's /list_workers answered {body[:200]!r}, not a list of URLs") from error


def parse_worker_states(body: str) -> list[dict]:
    """Each worker of /workers with its health and the requests the router has in flight on it, sorted by URL."""
    try:
        states = [
            {"url": check_base_url(worker["url"]), "healthy": bool(worker["is_healthy"]), "load": worker.get("load")}
            for worker in json.loads(body)["workers"]
        ]
        return sorted(states, key=lambda state: state["url"])
    except (ValueError, KeyError, TypeError) as error:
        raise RouterError(f"the router's /workers answered {body[:200]!r}, not a list of workers") from error
