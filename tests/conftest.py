"""Fixtures shared by unit and integration tests, and `ansible_collections.llmops.vllm` importable from this
checkout, as Ansible itself finds it."""

from __future__ import annotations

import importlib.util
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder

COLLECTIONS_ROOT = Path(__file__).resolve().parents[1] / ".build" / "collections"


def pytest_sessionstart(session):
    link = COLLECTIONS_ROOT / "ansible_collections" / "llmops" / "vllm"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../../../.."))
    # The `ansible` package ships a regular ansible_collections package; Ansible's finder merges paths.
    _AnsibleCollectionFinder(paths=[str(COLLECTIONS_ROOT)])._install()


# A plain file, not a package module: the benchmark copies it onto the local host and runs it there.
_SPEC = importlib.util.spec_from_file_location("hub_standin", Path(__file__).with_name("hub_standin.py"))
hub_standin_module = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(hub_standin_module)


@pytest.fixture
def hub_server():
    """Start a Hugging Face hub stand-in on loopback: serve(files, token=None) -> (endpoint, requests).

    files maps URL paths to bytes; with a token, requests without `Authorization: Bearer TOKEN` get 401.
    Each request is recorded as {"path", "authorization"}. Real HTTP; nothing leaves the machine.
    """
    servers = []

    def serve(files, token=None):
        requests = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                authorization = self.headers.get("Authorization")
                requests.append({"path": self.path, "authorization": authorization})
                if self.path not in files:
                    self.send_error(404)
                elif token and authorization != f"Bearer {token}":
                    self.send_error(401)
                else:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(files[self.path])))
                    self.end_headers()
                    self.wfile.write(files[self.path])

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", requests

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def hub_standin(tmp_path):
    """A hub stand-in that answers as the hub does (model info, tree, resolve with redirects to a CDN on
    another port, Range, X-Linked-Etag), serving the repositories put under `standin.root` (owner/name/):
    call `standin.add_repo("owner/name")` once the files are there. See tests/hub_standin.py."""
    root = tmp_path / "hub"
    root.mkdir()
    standin = hub_standin_module.HubStandIn(str(root)).start()
    yield standin
    standin.stop()
