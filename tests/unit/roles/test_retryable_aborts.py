"""The middleware that answers 503 for a completion that a stopping or pausing vLLM did not serve
(roles/vllm_install/files/llmops_vllm_dev_guard.py, RetryableAborts in every server), driven as uvicorn drives an
ASGI app, with the answers vLLM's completion and chat completion streams give. A real vLLM that aborts queued
requests is in tests/integration/test_sleep_mode.py; one that drains at a stop, and the router that retries what it
refuses, in tests/integration/test_router.py.
"""

import asyncio
import json

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.service.serve_command import RETRYABLE_ABORTS

ROLE_CHUNK = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
USAGE_CHUNK = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 0}}


def event(body: dict) -> bytes:
    return f"data: {json.dumps(body)}\n\n".encode()


def text(value="", finish_reason=None):
    return {"choices": [{"index": 0, "text": value, "finish_reason": finish_reason}]}


def delta(finish_reason=None, **fields):
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": finish_reason}]}


def app_sending(*bodies, status=200):
    """An app that answers `status` and each of `bodies` as a body message, the last one ending the body."""

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"x")]})
        for position, body in enumerate(bodies):
            await send({"type": "http.response.body", "body": body, "more_body": position < len(bodies) - 1})

    return app


@pytest.fixture
def client_sees(guard):
    def client_sees(app, path="/v1/completions", method="POST"):
        """The messages a client gets for one request to `app` behind the middleware."""
        sent = []

        async def send(message):
            sent.append(message)

        async def receive():
            return {"type": "http.request"}

        scope = {"type": "http", "method": method, "path": path, "root_path": "", "client": ("10.0.0.7", 1)}
        asyncio.run(guard.RetryableAborts(app)(scope, receive, send))
        return sent

    return client_sees


def refused(sent) -> bool:
    start, body = sent
    headers = dict(start["headers"])
    error = json.loads(body["body"])["error"]
    return (start["status"], headers[b"retry-after"], error["code"], body.get("more_body", False)) == (
        503,
        b"1",
        503,
        False,
    ) and int(headers[b"content-length"]) == len(body["body"])


def test_a_completion_stream_aborted_before_its_first_token_is_refused_with_503(client_sees):
    # vLLM's answer to a request its draining engine took: 200, an abort with no text, the usage, [DONE].
    aborted = app_sending(event(text("", "abort")), event(USAGE_CHUNK), b"data: [DONE]\n\n")
    assert refused(client_sees(aborted))


@pytest.mark.parametrize(
    "bodies",
    [[b"data: [DONE]\n\n"], [event(USAGE_CHUNK), b"data: [DONE]\n\n"], [event(ROLE_CHUNK), b"data: [DONE]\n\n"]],
    ids=["done-alone", "usage-then-done", "role-then-done"],
)
def test_a_stream_that_ends_before_its_first_token_is_refused_with_503(client_sees, bodies):
    # vLLM's answer to a request aborted while it waited in the engine: [DONE] alone, or after the usage.
    assert refused(client_sees(app_sending(*bodies), "/v1/chat/completions"))


def test_a_chat_stream_aborted_after_its_role_chunk_is_refused_with_503(client_sees):
    aborted = app_sending(event(ROLE_CHUNK), event(delta("abort", content="")), b"data: [DONE]\n\n")
    assert refused(client_sees(aborted, "/v1/chat/completions"))


def test_a_request_that_a_stopping_server_could_not_begin_is_refused_with_503(client_sees):
    # vLLM's answer to a request that reaches it while it drains: its executors are shut down.
    error = {"error": {"message": "cannot schedule new futures after shutdown", "type": "InternalServerError"}}
    assert refused(client_sees(app_sending(json.dumps(error).encode(), status=500)))


def test_a_request_that_a_stopping_server_raised_on_is_refused_with_503(client_sees):
    # vLLM raises the executor's error; the server's outermost layer would answer it 500.
    async def stopping(scope, receive, send):
        raise RuntimeError("cannot schedule new futures after shutdown")

    assert refused(client_sees(stopping))


def test_other_errors_raised_pass_on(client_sees):
    async def failing(scope, receive, send):
        raise RuntimeError("the engine died")

    with pytest.raises(RuntimeError, match="the engine died"):
        client_sees(failing)


def test_other_server_errors_pass_as_sent(client_sees):
    error = json.dumps({"error": {"message": "EngineCore encountered an issue", "code": 500}}).encode()
    sent = client_sees(app_sending(error, status=500))
    assert [sent[0]["status"], sent[1]["body"]] == [500, error]


@pytest.mark.parametrize("completion", [text, delta], ids=["completion", "chat"])
def test_a_stream_whose_engine_fails_before_its_first_token_is_refused_with_503(client_sees, completion):
    """vLLM answers a stream 200 and then, its engine dead, an error event: a router takes that for an answer."""
    first = event(ROLE_CHUNK) if completion is delta else event(USAGE_CHUNK)
    dead = (
        b'data: {"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError",'
        b' "param": null, "code": 500}}\n\n'
    )
    assert refused(client_sees(app_sending(first, dead, b"data: [DONE]\n\n")))


def test_a_whole_completion_aborted_is_refused_with_503(client_sees):
    whole = json.dumps({**text("", "abort"), "usage": USAGE_CHUNK["usage"]}).encode()
    assert refused(client_sees(app_sending(whole)))


@pytest.mark.parametrize(
    "bodies",
    [
        [event(text("Hel")), event(text("lo", "length")), b"data: [DONE]\n\n"],
        [event(text("Hel")), event(text("", "abort")), b"data: [DONE]\n\n"],  # cut off after a token: not ours
        [event(text("", "stop")), b"data: [DONE]\n\n"],
        [b'data: {"error": {"message": "max_tokens is too large", "code": 400}}\n\n', b"data: [DONE]\n\n"],
        [event(text("Hel")), b'data: {"error": {"message": "engine dead", "code": 500}}\n\n', b"data: [DONE]\n\n"],
        [json.dumps(text("Hello", "length")).encode()],
    ],
    ids=[
        "finished",
        "cut-after-a-token",
        "empty-but-finished",
        "request-error-event",
        "engine-died-after-a-token",
        "whole",
    ],
)
def test_any_answer_that_is_not_an_abort_before_the_first_token_passes_as_sent(client_sees, bodies):
    sent = client_sees(app_sending(*bodies))
    assert [message.get("status") for message in sent[:1]] == [200]
    assert [message["body"] for message in sent[1:]] == bodies


def test_a_chat_stream_s_role_chunk_is_held_only_until_the_first_token(guard):
    """The client gets the role chunk with the first token: what it saw at each step of the app."""
    seen_at_each_step = []

    async def chat(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        seen_at_each_step.append(len(sent))
        await send({"type": "http.response.body", "body": event(ROLE_CHUNK), "more_body": True})
        seen_at_each_step.append(len(sent))
        await send({"type": "http.response.body", "body": event(delta(content="Hi")), "more_body": True})
        seen_at_each_step.append(len(sent))
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request"}

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "root_path": ""}
    asyncio.run(guard.RetryableAborts(chat)(scope, receive, send))
    assert seen_at_each_step == [0, 0, 3] and len(sent) == 4


def test_a_stream_with_no_token_in_many_messages_is_released(guard, client_sees):
    bodies = [event(USAGE_CHUNK)] * (guard.ABORT_HOLD_LIMIT + 2) + [b"data: [DONE]\n\n"]
    sent = client_sees(app_sending(*bodies))
    assert sent[0]["status"] == 200 and [message["body"] for message in sent[1:]] == bodies


def test_errors_and_other_paths_pass_untouched(client_sees):
    error = app_sending(b'{"error": {"message": "max_tokens is too large", "code": 400}}', status=400)
    assert [message.get("status") for message in client_sees(error)][:1] == [400]
    aborted = app_sending(event(text("", "abort")))
    assert client_sees(aborted, "/v1/embeddings")[0]["status"] == 200
    assert client_sees(aborted, "/v1/completions", "GET")[0]["status"] == 200


def test_an_app_that_ends_while_held_still_answers(client_sees):
    async def role_then_failure(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": event(ROLE_CHUNK), "more_body": True})

    sent = client_sees(role_then_failure, "/v1/chat/completions")
    assert [message["type"] for message in sent] == ["http.response.start", "http.response.body"]


def test_the_unit_names_the_middleware_the_server_has(guard):
    assert f"{guard.__name__}.{guard.RetryableAborts.__name__}" == RETRYABLE_ABORTS
