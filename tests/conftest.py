"""Fixtures shared by unit and integration tests."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


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
