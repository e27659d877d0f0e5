# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Start vLLM's router (the PyPI package vllm-router) as the llmops.vllm collection runs it.

usage: python llmops_vllm_router.py --workers-file FILE -- [vllm-router's own flags]

- The workers come from FILE ({"workers": [URL, ...]}), which llmops.vllm.vllm_router_workers keeps in step with the
  running router: a router that restarts comes back with the workers it had, not those of its first start.
- With VLLM_ROUTER_API_KEY in the environment (the unit's EnvironmentFile, never the command line), every request
  to the router needs `Authorization: Bearer KEY`, its management routes (/add_worker, /remove_worker) included.
  vllm-router 0.1.17 checks nothing itself: its --api-key is what it sends to workers for data-parallel routing.
  Its Rust core can check each new key of a client against a URL (`api_key_validation_urls`, which its launcher
  does not expose): a process of its own answers that check here, on loopback, and the router keeps each answer.
  Without the check process the router lets no one in.
- Then it starts the router through vllm-router's own launcher, with vllm-router's own flags.
"""

from __future__ import annotations

import argparse
import functools
import hmac
import json
import multiprocessing
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KEY_VARIABLE = "VLLM_ROUTER_API_KEY"


class KeyCheck(BaseHTTPRequestHandler):
    """200 when the request carries the router's key, 401 otherwise; the router asks once for each new key."""

    def do_GET(self):
        given = self.headers.get("Authorization", "").encode()
        status = 200 if hmac.compare_digest(given, self.server.expected) else 401
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass  # a log line per check would name no key, but says nothing useful either


def key_check_server(api_key: str) -> ThreadingHTTPServer:
    """The key check on a free port of loopback."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), KeyCheck)
    server.expected = f"Bearer {api_key}".encode()
    return server


def _serve_key_check(api_key: str, port_to) -> None:
    server = key_check_server(api_key)
    port_to.send(server.server_address[1])
    server.serve_forever()


def start_key_check(api_key: str) -> str:
    """Start the key check in a process of its own and return its URL.

    A process, not a thread: the router's Rust core holds Python's interpreter lock while it serves.
    """
    receiver, sender = multiprocessing.Pipe(duplex=False)
    multiprocessing.Process(target=_serve_key_check, args=(api_key, sender), daemon=True).start()
    return f"http://127.0.0.1:{receiver.recv()}/"


def read_workers(path: str) -> list[str]:
    with open(path, encoding="utf-8") as workers_file:
        return list(json.load(workers_file)["workers"])


def split_arguments(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """(this launcher's options, vllm-router's flags): they are separated by `--`."""
    separator = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description="Start vllm-router with its workers from a file and a key check.")
    parser.add_argument("--workers-file", required=True, help='JSON {"workers": [URL, ...]}')
    return parser.parse_args(argv[:separator]), argv[separator + 1 :]


def router_arguments(router_flags: list[str], workers: list[str]) -> list[str]:
    """vllm-router's flags with the workers added (--worker-urls takes them all, or none)."""
    return [*router_flags, "--worker-urls", *workers]


def main(argv: list[str] | None = None) -> None:
    import sys

    options, router_flags = split_arguments(sys.argv[1:] if argv is None else argv)
    # Imported here: the key check and the argument handling above need nothing of vllm-router.
    import vllm_router.router as router_module
    from vllm_router.launch_router import launch_router, parse_router_args

    router_args = parse_router_args(router_arguments(router_flags, read_workers(options.workers_file)))
    api_key = os.environ.get(KEY_VARIABLE, "")
    if api_key:
        check_url = start_key_check(api_key)
        router_module._Router = functools.partial(router_module._Router, api_key_validation_urls=[check_url])
    launch_router(router_args)


if __name__ == "__main__":
    main()
