"""A streamed response parsed wherever its bytes split, and timed as `vllm bench serve` times it."""

import json

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.bench.streamed_response import (
    ChunkedDecoder,
    HTTPResponseParser,
    SSEParser,
    StreamedRequest,
)


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
