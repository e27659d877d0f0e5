"""Run on the test host: keep COUNT streamed completions going until the server stops taking them.

usage: python3 stream_clients.py BASE_URL MODEL API_KEY COUNT MAX_TOKENS OUTPUT_JSON   (stdlib only)
       python3 stream_clients.py --one BASE_URL MODEL API_KEY MAX_TOKENS PROMPT   (one request; prints its record)

Each of COUNT threads sends one request after another and stops after the first one that does not complete
with all MAX_TOKENS tokens (the server refused it, or cut it off). OUTPUT_JSON.streaming appears once every
thread has received a chunk; OUTPUT_JSON then lists every request: HTTP status, chunks, completion tokens
(from the usage chunk at the end), whether [DONE] came, the finish reason, the error if any, and for an error
answer its Retry-After and the code of its error object.
"""

import http.client
import json
import os
import sys
import threading
import time
import urllib.parse

# A thread never runs longer than this, whatever the server does.
GIVE_UP_AFTER = 120


def new_record():
    return {
        "status": None,
        "chunks": 0,
        "prompt_tokens": None,
        "tokens": None,
        "done": False,
        "finish_reason": None,
        "error": None,
        "retry_after": None,
        "error_code": None,
    }


def request(url, model, api_key, max_tokens, record, prompt="The server drains"):
    """Send one streamed completion; fill `record` as the answer arrives."""
    target = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), headers)
        response = connection.getresponse()
        record["status"] = response.status
        record["retry_after"] = response.getheader("Retry-After")
        for line in response:
            data = line.decode().strip().removeprefix("data: ")
            if data == "[DONE]":
                record["done"] = True
            elif data.startswith("{"):
                chunk = json.loads(data)
                if isinstance(chunk.get("error"), dict):  # an error answer, or an error event in the stream
                    record["error_code"] = chunk["error"].get("code")
                for choice in chunk.get("choices") or []:
                    record["chunks"] += 1
                    record["finish_reason"] = choice.get("finish_reason") or record["finish_reason"]
                if chunk.get("usage"):  # the last chunk, when the request completes
                    record["prompt_tokens"] = chunk["usage"]["prompt_tokens"]
                    record["tokens"] = chunk["usage"]["completion_tokens"]
    except (OSError, http.client.HTTPException) as error:
        record["error"] = repr(error)
    finally:
        connection.close()


def keep_streaming(url, model, api_key, max_tokens, records):
    deadline = time.monotonic() + GIVE_UP_AFTER
    while time.monotonic() < deadline:
        record = new_record()
        records.append(record)
        request(url, model, api_key, max_tokens, record)
        if record["tokens"] != max_tokens:
            return


def main():
    if sys.argv[1] == "--one":
        url, model, api_key, max_tokens, prompt = sys.argv[2:7]
        record = new_record()
        request(url, model, api_key, int(max_tokens), record, prompt)
        print(json.dumps(record))
        return
    url, model, api_key, count, max_tokens, output = sys.argv[1:7]
    per_thread = [[] for _thread in range(int(count))]
    threads = [
        threading.Thread(target=keep_streaming, args=(url, model, api_key, int(max_tokens), records))
        for records in per_thread
    ]
    for thread in threads:
        thread.start()
    # Read without a lock: a count seen late only delays the marker by one poll.
    while any(thread.is_alive() for thread in threads) and not all(
        records and records[0]["chunks"] for records in per_thread
    ):
        time.sleep(0.02)
    open(output + ".streaming", "w").close()
    for thread in threads:
        thread.join()
    with open(output + ".tmp", "w") as out:
        json.dump([record for records in per_thread for record in records], out)
    # Renamed when complete, so that a reader never sees half a file.
    os.rename(output + ".tmp", output)


if __name__ == "__main__":
    main()
