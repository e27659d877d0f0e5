"""The middleware that writes a journal line for each request a server did not finish
(roles/vllm_install/files/llmops_vllm_dev_guard.py, CutOffRequests in every server), driven as uvicorn drives an
ASGI app. The real vLLM behind it, stopped with streams in flight, is in tests/integration/test_service.py.
"""

import asyncio
import contextlib
import json
import os
import signal
import time

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.service.lifecycle import (
    ACCOUNT_SIGNAL,
    ACCOUNTED,
    CUT_OFF_MARK,
    cut_off_requests,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.serve_command import CUT_OFF_ACCOUNTING


def chunk(finish_reason=None, text="x"):
    event = {"choices": [{"text": text, "finish_reason": finish_reason}]}
    return f"data: {json.dumps(event, separators=(',', ':'))}\n\n"


def stream(*events, status=200, ends=True):
    """An app that answers with `events` as body messages (the last one closing the body when `ends`)."""

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": []})
        for position, event in enumerate(events):
            last = ends and position == len(events) - 1
            await send({"type": "http.response.body", "body": event.encode(), "more_body": not last})

    return app


@pytest.fixture(autouse=True)
def account_handler():
    """The middleware installs its handler of ACCOUNT_SIGNAL in this process: put pytest's back after each test."""
    before = signal.getsignal(ACCOUNT_SIGNAL)
    yield
    signal.signal(ACCOUNT_SIGNAL, before)


def request_scope(path="/v1/completions", method="POST"):
    return {"type": "http", "method": method, "path": path, "root_path": "", "client": ("10.0.0.7", 1)}


async def ignore(_message):
    pass


async def request_body():
    return {"type": "http.request"}


@pytest.fixture
def lines_written(guard, capsys):
    def lines_written(app, path="/v1/completions", method="POST"):
        """The cut-off lines the middleware writes for one request to `app`."""
        with contextlib.suppress(RuntimeError):  # an app that fails: the line is written all the same
            asyncio.run(guard.CutOffRequests(app)(request_scope(path, method), request_body, ignore))
        return [line for line in capsys.readouterr().err.splitlines() if line.startswith(CUT_OFF_MARK)]

    return lines_written


@pytest.mark.parametrize("reason", ["length", "stop", "tool_calls"])
def test_a_finished_stream_writes_nothing(lines_written, reason):
    assert lines_written(stream(chunk(), chunk(reason), 'data: {"usage":{}}\n\n', "data: [DONE]\n\n")) == []


def test_a_stream_ended_without_a_finish_reason_is_cut_off(lines_written):
    # vLLM closes some streams whose engine died with [DONE] alone, or an error event.
    before = time.time()
    lines = lines_written(stream(chunk(), chunk(), 'data: {"error":{"message":"engine dead"}}\n\n', "data: [DONE]\n\n"))
    written = "POST /v1/completions (ended, status 200, 4 body messages, finish reason none)"
    assert lines[0].startswith(f"{CUT_OFF_MARK} {written}")
    # Written to the millisecond: rounded, it may read up to half of one before `before`.
    assert before - 0.001 <= cut_off_requests(lines)[0].started <= time.time() + 0.001


def test_a_stream_finished_with_abort_is_cut_off(lines_written):
    assert "finish reason abort" in lines_written(stream(chunk(), chunk("abort")), "/v1/chat/completions")[0]


def test_a_stream_whose_body_never_ends_is_cut_off(lines_written):
    assert len(lines_written(stream(chunk(), chunk("length"), ends=False))) == 1


def test_an_app_that_fails_mid_answer_is_cut_off(lines_written):
    async def failing(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("the engine died")

    assert "(ended, status 200, 0 body messages" in lines_written(failing)[0]


def test_server_errors_are_cut_off_and_client_errors_are_answers(lines_written):
    assert len(lines_written(stream('{"error":"EngineDeadError"}', status=500))) == 1
    assert lines_written(stream('{"error":"max_tokens too large"}', status=400)) == []


def test_other_api_answers_count_by_their_end_alone(lines_written):
    assert lines_written(stream('{"data":[{"embedding":[0.1]}]}'), "/v1/embeddings") == []
    assert len(lines_written(stream('{"data":', ends=False), "/v1/embeddings")) == 1


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("POST", "/sleep"), ("GET", "/metrics")])
def test_reads_and_control_paths_are_not_watched(lines_written, method, path):
    assert lines_written(stream(chunk(), ends=False), path, method) == []


def test_asked_for_an_account_it_writes_the_requests_still_open_once_and_their_number(guard, capsys):
    """As a stop asks before it kills an API server that outlived its engine: two streams still being answered,
    one request finished before. The two are written once, not again when they end unfinished afterwards."""
    accounted, streams_open = asyncio.Event(), []

    async def streaming(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": chunk().encode(), "more_body": True})
        streams_open.append(scope["path"])
        await accounted.wait()

    async def stop():
        middleware = guard.CutOffRequests(streaming)
        finished = guard.CutOffRequests(stream(chunk("length")))
        await finished(request_scope(), request_body, ignore)
        requests = [
            asyncio.create_task(middleware(request_scope(path), request_body, ignore))
            for path in ("/v1/completions", "/v1/chat/completions")
        ]
        while len(streams_open) < 2:
            await asyncio.sleep(0.001)
        os.kill(os.getpid(), ACCOUNT_SIGNAL)
        deadline = time.monotonic() + 10
        while not all(answer.accounted for _path, _started, answer in guard.CutOffRequests.answering.values()):
            assert time.monotonic() < deadline, "the signal's handler did not run"
            await asyncio.sleep(0.001)
        accounted.set()
        await asyncio.gather(*requests)

    asyncio.run(stop())
    written = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in written] == [
        f"{CUT_OFF_MARK} POST /v1/completions",
        f"{CUT_OFF_MARK} POST /v1/chat/completions",
        f"{ACCOUNTED} 2",
    ]
    assert all("(still open, status 200, 1 body messages, finish reason none) started " in line for line in written[:2])
    assert guard.CutOffRequests.answering == {}


def test_asked_with_nothing_open_it_says_so(guard, capsys):
    guard.CutOffRequests.account()
    assert capsys.readouterr().err == f"{ACCOUNTED} 0\n"


def test_the_module_reads_when_each_request_began_and_whether_it_was_answered(lines_written):
    streamed = lines_written(stream(chunk(), chunk(), ends=False))
    failed = lines_written(stream('{"error":"EngineDeadError"}', status=500))

    async def silent(scope, receive, send):
        raise RuntimeError("cut off before any answer")

    unanswered = lines_written(silent)
    assert [request.answered for request in cut_off_requests(streamed + failed + unanswered)] == [True, False, False]


def test_the_module_and_the_server_agree_on_the_names(guard):
    assert (guard.CUT_OFF_MARK, guard.ACCOUNTED, guard.ACCOUNT_SIGNAL) == (CUT_OFF_MARK, ACCOUNTED, ACCOUNT_SIGNAL)
    assert f"{guard.__name__}.{guard.CutOffRequests.__name__}" == CUT_OFF_ACCOUNTING
