import http.server
import json
import random
import statistics
import threading

import numpy
import pytest
import tokenizers

from ansible_collections.llmops.vllm.plugins.module_utils._bench import (
    BenchError,
    ChunkedDecoder,
    HTTPResponseParser,
    RequestResult,
    SSEParser,
    StreamedRequest,
    Target,
    describe,
    fixed_prompts,
    level_metrics,
    percentile,
    random_token_prompts,
    regressions,
    run_level,
)
from ansible_collections.llmops.vllm.plugins.module_utils._tiny_model import train_tokenizer


def sse(*payloads):
    return b"".join(b"data: " + payload.encode() + b"\n\n" for payload in payloads)


def text_chunk(text):
    return json.dumps({"choices": [{"index": 0, "text": text}]})


USAGE = json.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}})
STREAM = sse(text_chunk("héllo"), text_chunk(""), text_chunk(" wörld"), USAGE, "[DONE]")


def split_everywhere(data):
    """Every way to cut `data` in two, and the one-byte-at-a-time split."""
    yield [data]
    for cut in range(1, len(data)):
        yield [data[:cut], data[cut:]]
    yield [data[i : i + 1] for i in range(len(data))]


def test_sse_events_are_the_same_wherever_the_bytes_split():
    expected = [text_chunk("héllo"), text_chunk(""), text_chunk(" wörld"), USAGE, "[DONE]"]
    for pieces in split_everywhere(STREAM):
        parser = SSEParser()
        assert [event for piece in pieces for event in parser.feed(piece)] == expected


def test_sse_handles_crlf_comments_multiline_data_and_other_fields():
    parser = SSEParser()
    stream = b': ping\r\n\r\nevent: error\r\ndata: {"a":\r\ndata: 1}\r\n\r\nid: 4\n\ndata:[DONE]\n\n'
    assert parser.feed(stream) == ['{"a":\n1}', "[DONE]"]


def test_sse_keeps_an_incomplete_event_until_its_end_arrives():
    parser = SSEParser()
    assert parser.feed(b'data: {"choices": [') == []
    assert parser.feed(b"]}\n") == []
    assert parser.feed(b"\n") == ['{"choices": []}']


def chunked(data, sizes):
    out, start = b"", 0
    for size in sizes:
        piece = data[start : start + size]
        out += f"{len(piece):x};ext=1\r\n".encode() + piece + b"\r\n"
        start += size
    return out + b"0\r\n\r\n"


def test_chunked_decoding_wherever_the_bytes_split():
    body = b"0123456789abcdef" * 3
    encoded = chunked(body, [5, 16, 27])
    for pieces in split_everywhere(encoded):
        decoder = ChunkedDecoder()
        decoded = b"".join(decoder.feed(piece) for piece in pieces)
        assert decoded == body and decoder.done


def test_chunked_decoding_waits_for_the_end_of_trailers():
    decoder = ChunkedDecoder()
    assert decoder.feed(b"3\r\nabc\r\n0\r\nX-Trailer: 1\r\n") == b"abc"
    assert not decoder.done
    decoder.feed(b"\r\n")
    assert decoder.done


def response_bytes(status=200, body=STREAM, headers=b""):
    head = f"HTTP/1.1 {status} {'OK' if status == 200 else 'Unauthorized'}\r\n".encode()
    return (
        head
        + headers
        + b"Transfer-Encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n"
        + chunked(body, [40, 60, 1000])
    )


def test_a_streamed_response_split_anywhere_gives_vllm_timings():
    data = response_bytes()
    for pieces in list(split_everywhere(data))[::7]:
        stream = StreamedRequest(start=10.0, prompt_tokens=0)
        parser = HTTPResponseParser(stream.on_body)
        for now, piece in enumerate(pieces, start=11):
            parser.feed(piece, float(now))
        assert parser.complete and parser.status == 200
        result = stream.finish(parser.status, parser.reason)
        assert result.success and result.error == ""
        assert (result.prompt_tokens, result.output_tokens) == (7, 3)
        # TTFT at the first chunk with choices; E2EL at the last chunk with choices, not at the usage or [DONE].
        assert result.ttft > 0 and result.latency >= result.ttft
        assert len(result.itl) == 2 and sum(result.itl) == pytest.approx(result.latency - result.ttft)


def test_timings_follow_the_arrival_of_each_event():
    stream = StreamedRequest(start=1.0, prompt_tokens=5)
    stream.on_body(sse(text_chunk("a")), 1.5)
    stream.on_body(sse(text_chunk("b"))[:10], 1.6)  # part of an event counts for nothing
    stream.on_body(sse(text_chunk("b"))[10:] + sse(text_chunk("c")), 2.0)
    stream.on_body(sse(USAGE, "[DONE]"), 2.5)
    result = stream.finish(200, "OK")
    assert result.ttft == 0.5 and result.itl == [0.5, 0.0] and result.latency == 1.0
    assert result.output_tokens == 3 and result.prompt_tokens == 7


def test_an_error_event_fails_the_request_with_its_message():
    stream = StreamedRequest(start=0.0, prompt_tokens=0)
    stream.on_body(sse(text_chunk("a"), json.dumps({"error": {"message": "engine died", "code": 500}})), 1.0)
    result = stream.finish(200, "OK")
    assert not result.success and result.error == "error event in the stream: engine died"


def test_a_usage_only_stream_fails_for_want_of_a_token():
    stream = StreamedRequest(start=0.0, prompt_tokens=0)
    stream.on_body(sse(USAGE, "[DONE]"), 1.0)
    result = stream.finish(200, "OK")
    assert not result.success and "without a chunk that has choices" in result.error


def test_an_http_error_keeps_the_status_and_the_body():
    stream = StreamedRequest(start=0.0, prompt_tokens=0)
    parser = HTTPResponseParser(stream.on_error_body)
    parser.feed(b'HTTP/1.1 404 Not Found\r\nContent-Length: 40\r\n\r\n{"error": "The model `x` does not exist"}', 1.0)
    result = stream.finish(parser.status, parser.reason)
    assert parser.complete and not result.success
    assert result.error.startswith('HTTP 404 Not Found: {"error": "The model `x` does not exis')


@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 1.5, 9.25, 2.0, 7.0]])
def test_statistics_agree_with_numpy(values):
    for p in (0.1, 1, 25, 50, 90, 99, 99.9, 100):
        assert percentile(values, p) == pytest.approx(numpy.percentile(values, p))
    stats = describe(values, [50, 90, 99.9])
    assert stats["mean"] == pytest.approx(numpy.mean(values))
    assert stats["median"] == pytest.approx(numpy.median(values))
    assert stats["std"] == pytest.approx(numpy.std(values))
    assert stats["p99.9"] == pytest.approx(numpy.percentile(values, 99.9))


def test_statistics_agree_with_numpy_on_random_samples():
    rng = random.Random(3)
    for size in (2, 17, 1000):
        values = [rng.expovariate(10) for _sample in range(size)]
        for p in (50, 90, 99):
            assert percentile(values, p) == pytest.approx(numpy.percentile(values, p))


def test_an_empty_sample_counts_as_zero_as_in_vllm():
    assert describe([], [99]) == {"mean": 0.0, "median": 0.0, "std": 0.0, "p99": 0.0}


def result(ttft, latency, tokens, itl=(), prompt=10):
    return RequestResult(
        start=0.0, ttft=ttft, itl=list(itl), latency=latency, prompt_tokens=prompt, output_tokens=tokens, success=True
    )


def test_level_metrics_use_vllm_definitions_and_count_failures():
    results = [
        result(0.1, 1.1, 11, itl=[0.1] * 10),
        result(0.3, 0.3, 1),  # one token: no TPOT, no ITL
        RequestResult(start=0.0, error="HTTP 500 Internal Server Error"),
        RequestResult(start=0.0, error="timed out"),
    ]
    metrics = level_metrics(results, duration=2.0, percentiles=[50, 99], slos={"ttft": 200})
    assert (metrics["completed"], metrics["failed"]) == (2, 2)
    assert metrics["errors"] == ["HTTP 500 Internal Server Error", "timed out"]
    assert metrics["total_output_tokens"] == 12 and metrics["total_input_tokens"] == 20
    assert metrics["output_throughput"] == 6.0 and metrics["total_token_throughput"] == 16.0
    assert metrics["request_throughput"] == 1.0 and metrics["request_goodput"] == 0.5
    assert metrics["mean_tpot_ms"] == pytest.approx(100.0)  # (1.1 - 0.1) / (11 - 1), only the long request
    assert metrics["median_ttft_ms"] == pytest.approx(200.0)
    assert metrics["p99_e2el_ms"] == pytest.approx(numpy.percentile([1100, 300], 99))
    assert metrics["mean_itl_ms"] == pytest.approx(100.0)


def test_goodput_is_none_without_slos():
    assert level_metrics([result(0.1, 1, 2)], 1.0, [50])["request_goodput"] is None


def test_regressions_know_which_way_is_better():
    baseline = [{"max_concurrency": 8, "output_throughput": 1000.0, "median_ttft_ms": 50.0}]
    slower = [
        {"max_concurrency": 8, "output_throughput": 850.0, "median_ttft_ms": 54.0},
        {"max_concurrency": 64, "output_throughput": 1.0, "median_ttft_ms": 1.0},
    ]
    comparisons, regressed = regressions(slower, baseline, ["output_throughput", "median_ttft_ms"], 10)
    assert [(c["metric"], round(c["change_percent"], 1), c["regressed"]) for c in comparisons] == [
        ("output_throughput", -15.0, True),
        ("median_ttft_ms", 8.0, False),
    ]
    assert [c["metric"] for c in regressed] == ["output_throughput"]
    faster = [{"max_concurrency": 8, "output_throughput": 2000.0, "median_ttft_ms": 60.0}]
    assert [c["metric"] for c in regressions(faster, baseline, ["output_throughput", "median_ttft_ms"], 10)[1]] == [
        "median_ttft_ms"
    ]


def test_a_baseline_without_the_levels_is_an_error():
    with pytest.raises(BenchError, match=r"the baseline has none of the levels \[4\] \(it has \[1, 8\]\)"):
        baseline = [{"max_concurrency": 1}, {"max_concurrency": 8}]
        regressions([{"max_concurrency": 4}], baseline, ["output_throughput"], 5)


def test_an_unknown_regression_metric_is_an_error():
    with pytest.raises(BenchError, match="p95_ttft_ms is missing"):
        regressions([{"max_concurrency": 1}], [{"max_concurrency": 1}], ["p95_ttft_ms"], 5)


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


def test_fixed_prompts_differ_from_the_first_word_and_have_the_asked_word_count():
    prompts = fixed_prompts(3, 40)
    assert len({prompt.split()[0] for prompt in prompts}) == 3
    assert all(len(prompt.split()) == 40 for prompt in prompts)


def test_random_token_prompts_encode_back_to_the_asked_length():
    tokenizer = tokenizers.Tokenizer.from_str(train_tokenizer(300).to_str())
    prompts = random_token_prompts(tokenizer, 5, 48, seed=1)
    assert prompts == random_token_prompts(tokenizer, 5, 48, seed=1) and len(set(prompts)) == 5
    lengths = [len(tokenizer.encode(prompt, add_special_tokens=False).ids) for prompt in prompts]
    # Random byte-level tokens may merge when encoded again; vLLM's random dataset has the same slack.
    assert all(abs(length - 48) <= 2 for length in lengths), lengths


def test_random_token_prompts_leave_room_for_the_bos_that_the_server_adds():
    tokenizer = tokenizers.Tokenizer.from_str(train_tokenizer(300).to_str())
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    prompts = random_token_prompts(tokenizer, 5, 48, seed=1)
    encoded = [tokenizer.encode(prompt).ids for prompt in prompts]
    assert all(ids[0] == bos for ids in encoded)
    assert statistics.median(len(ids) for ids in encoded) == 48, [len(ids) for ids in encoded]


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
