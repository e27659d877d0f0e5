"""The load generator against a real HTTP server on loopback: requests, connections, failures, duration."""

import http.server
import json
import threading

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.bench.error import BenchError
from ansible_collections.llmops.vllm.plugins.module_utils.bench.load_generator import Target, run_level


def sse(*payloads):
    return b"".join(b"data: " + payload.encode() + b"\n\n" for payload in payloads)


def text_chunk(text):
    return json.dumps({"choices": [{"index": 0, "text": text}]})


USAGE = json.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}})


def test_the_request_carries_vllm_bench_serve_parameters():
    target = Target.build("http://10.0.0.5:8001/v1/", "completions", "tiny", 64, api_key="s3cret")
    head, body = target.request_bytes("hello").split(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\nHost: 10.0.0.5:8001\r\n")
    assert b"Authorization: Bearer s3cret" in head and f"Content-Length: {len(body)}".encode() in head
    assert json.loads(body) == {
        "model": "tiny",
        "prompt": "hello",
        "max_tokens": 64,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    chat = Target.build("https://gpu1.example/proxy", "chat", "m", 8, ignore_eos=False)
    payload = json.loads(chat.request_bytes("hi").split(b"\r\n\r\n")[1])
    assert chat.path == "/proxy/v1/chat/completions" and chat.port == 443 and chat.use_tls
    assert payload["messages"] == [{"role": "user", "content": "hi"}] and payload["max_completion_tokens"] == 8
    assert "ignore_eos" not in payload


def test_a_url_without_scheme_is_refused():
    with pytest.raises(BenchError, match="http"):
        Target.build("127.0.0.1:8000", "completions", "m", 8)


class StreamingHandler(http.server.BaseHTTPRequestHandler):
    """A local OpenAI-like server for the driver's tests: streams `tokens` chunks, or fails as asked."""

    protocol_version = "HTTP/1.1"
    seen = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StreamingHandler.seen.append((self.client_address[1], body["prompt"]))
        if body["model"] != "tiny":
            payload = b'{"error": "no such model"}'
            self.send_response(404)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = [text_chunk("x")] * body["max_tokens"]
        usage = {"prompt_tokens": 3, "completion_tokens": body["max_tokens"]}
        events += [json.dumps({"choices": [], "usage": usage}), "[DONE]"]
        for event in events:
            data = sse(event)
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StreamingHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    StreamingHandler.seen = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_level_sends_every_prompt_once_over_keep_alive_connections(server):
    target = Target.build(server, "completions", "tiny", 5)
    prompts = [(f"p{i}", 3) for i in range(12)]
    results, duration, cpu = run_level(target, prompts, concurrency=3, timeout=10)
    assert sorted(prompt for _port, prompt in StreamingHandler.seen) == sorted(p for p, _tokens in prompts)
    assert len({port for port, _prompt in StreamingHandler.seen}) == 3  # one connection per concurrent stream
    assert all(r.success and r.output_tokens == 5 and len(r.itl) == 4 for r in results)
    assert duration > 0 and cpu > 0


def test_failures_are_results_not_exceptions(server):
    wrong_model = Target.build(server, "completions", "other", 5)
    results = run_level(wrong_model, [("p", 0)] * 4, concurrency=2, timeout=10)[0]
    assert [r.error for r in results] == ['HTTP 404 Not Found: {"error": "no such model"}'] * 4
    closed_port = Target.build("http://127.0.0.1:9", "completions", "tiny", 5)
    results = run_level(closed_port, [("p", 0)] * 2, concurrency=1, timeout=10)[0]
    assert len(results) == 2 and all(not r.success and "ConnectionRefusedError" in r.error for r in results)


class ClosingHandler(StreamingHandler):
    """Answers with Connection: close, and one response with no length at all: its body ends at the close."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StreamingHandler.seen.append((self.client_address[1], body["prompt"]))
        self.send_response(200)
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(sse(text_chunk("x"), text_chunk("y"), USAGE, "[DONE]"))
        self.close_connection = True


def test_connection_close_and_bodies_that_end_at_the_close():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ClosingHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    StreamingHandler.seen = []
    try:
        target = Target.build(f"http://127.0.0.1:{httpd.server_address[1]}", "completions", "tiny", 3)
        results = run_level(target, [(f"p{i}", 0) for i in range(4)], concurrency=2, timeout=10)[0]
    finally:
        httpd.shutdown()
    assert [(r.success, r.output_tokens) for r in results] == [(True, 3)] * 4
    assert len({port for port, _prompt in StreamingHandler.seen}) == 4  # a new connection for every request


def test_a_duration_bounds_the_level_instead_of_the_prompt_count(server):
    target = Target.build(server, "completions", "tiny", 2)
    results, duration, _cpu = run_level(target, [("a", 0), ("b", 0)], concurrency=2, timeout=10, duration=0.3)
    assert len(results) > 2 and all(r.success for r in results)
    assert duration >= 0.3
