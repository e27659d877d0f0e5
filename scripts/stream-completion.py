# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stream one completion from an OpenAI-compatible endpoint and print it as it arrives.

usage: python stream-completion.py ENDPOINT MODEL [PROMPT]   (the API key, if any, from VLLM_API_KEY)
"""

import json
import os
import sys
import time

import requests

MAX_TOKENS = 48


def stream_completion(endpoint, model, prompt, usage, api_key=None):
    """Yield the text of each streamed chunk; fill `usage` with what the server reports at the end."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with requests.post(f"{endpoint}/v1/completions", json=body, headers=headers, stream=True, timeout=60) as response:
        response.raise_for_status()
        for line in response.iter_lines(decode_unicode=True):
            if not line or not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                return
            chunk = json.loads(data)
            usage.update(chunk.get("usage") or {})
            for choice in chunk.get("choices", []):
                yield choice.get("text", "")


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__.strip().splitlines()[-1])
    endpoint, model = sys.argv[1].rstrip("/"), sys.argv[2]
    prompt = sys.argv[3] if len(sys.argv) == 4 else "The inference server streams"
    print(f"endpoint: {endpoint}/v1  model: {model}")
    print(f"prompt:   {prompt}")
    print("stream:   ", end="", flush=True)
    started = time.monotonic()
    first_chunk_at = None
    chunks = 0
    usage = {}
    for text in stream_completion(endpoint, model, prompt, usage, os.environ.get("VLLM_API_KEY")):
        first_chunk_at = first_chunk_at or time.monotonic()
        chunks += 1
        print(text.replace("\n", " "), end="", flush=True)
    elapsed = time.monotonic() - started
    print()
    if not chunks:
        sys.exit("the server streamed no text")
    print(
        f"streamed {chunks} chunks, {usage.get('completion_tokens', '?')} tokens in {elapsed:.2f} s "
        f"(first chunk after {first_chunk_at - started:.3f} s)"
    )


if __name__ == "__main__":
    main()
