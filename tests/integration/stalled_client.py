"""Run on the test host: ask for a long stream, then never read it, for SECONDS (stdlib only).

usage: python3 stalled_client.py BASE_URL MODEL API_KEY SECONDS

The answer is large (8 choices of 2000 tokens with their logprobs: about 10 MB) and this socket's receive
buffer small, so the server's socket buffers fill and vLLM's API server waits to send the rest: a client
that stopped reading, as a hung consumer or a half-open connection does. At a stop, vLLM's engine exits
and its API server keeps waiting for this connection to close.
"""

import json
import socket
import sys
import time
import urllib.parse


def main():
    url, model, api_key, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    target = urllib.parse.urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((target.hostname, target.port))
    body = {
        "model": model,
        "prompt": "The server waits",
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
        "n": 8,
        "logprobs": 5,
    }
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {target.netloc}\r\nAuthorization: Bearer {api_key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    time.sleep(seconds)
    sock.close()


if __name__ == "__main__":
    main()
