# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""ExecStartPost of a vLLM unit: return once the server serves its model.

The unit stays "activating" until then, so `systemctl start` and the unit's state tell the truth, and
systemd's TimeoutStartSec bounds the whole model load. Ready means /health answers 200 and /v1/models
lists the served name (/health alone has been seen green early). The API key, if any, comes from the
unit's environment (VLLM_API_KEY), never from the command line.

systemd does not end ExecStartPost when the main process dies, so the probe watches it (MAINPID, which
systemd sets for control processes) and fails at once: a bad flag or an OOM fails the start in seconds,
not after the whole load timeout.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

POLL_INTERVAL_SECONDS = 1.0
REQUEST_TIMEOUT_SECONDS = 5.0


def get(url, api_key=None):
    request = urllib.request.Request(url)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS) as response:
        return response.status, response.read()


def serves(base_url, served_name, api_key):
    try:
        if get(f"{base_url}/health")[0] != 200:
            return False
        body = get(f"{base_url}/v1/models", api_key)[1]
        return served_name in {model.get("id") for model in json.loads(body).get("data", [])}
    except (OSError, ValueError):
        # Connection refused while loading, a 5xx, a half-written answer: not ready yet.
        return False


def is_running(pid):
    """False once the process is gone or a zombie; True when the PID is unknown (nothing to watch)."""
    if pid is None:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: vllm_wait_ready.py BASE_URL SERVED_NAME")
    base_url, served_name = sys.argv[1].rstrip("/"), sys.argv[2]
    api_key = os.environ.get("VLLM_API_KEY")
    main_pid = int(os.environ["MAINPID"]) if os.environ.get("MAINPID", "").isdigit() else None
    started = time.monotonic()
    while not serves(base_url, served_name, api_key):
        if not is_running(main_pid):
            sys.exit(f"the server (PID {main_pid}) exited while loading; its log is in the unit's journal")
        time.sleep(POLL_INTERVAL_SECONDS)
    print(f"{served_name} serves at {base_url} after {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
