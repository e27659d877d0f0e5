# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Weights at line rate: the collection's fetch against today's (commit b6a2f07) and the anchors, on the local host.

On a local host (a podman container booting systemd, scripts/local-host.sh) it serves a model of SHARDS
shards of SHARD_GIB GiB each, plus a config, from two servers on loopback:

- nginx (autoindex, sendfile), the fleet mirror, with the directory's manifest (sizes and SHA-256);
- the hub stand-in of the tests (tests/hub_standin.py): model API, resolve URLs that redirect the shards
  to a CDN on another port, Range.

and fetches it into a tmpfs, round after round, each fetcher once a round in a rotating order:

- today: `fetch` of plugins/module_utils/_weights.py at b6a2f07 (one file after another, one connection);
- new: the collection's fetch (`Fetcher`, WORKERS connections); from the hub also through huggingface_hub
  (`fetch_with_library`, the path vLLM's venv takes), which downloads each file over one connection;
- aria2c -x 8 -s 8 (Debian's aria2) on the same URLs; from the hub also `hf download` (huggingface_hub's CLI).

It prints, per source and fetcher, the median rate and the median CPU seconds per GB of the fetcher's
process (user + system, from wait4) and of the server, and the ratios the issue asks for. The shards are
hard links to one file of random bytes, so that the source stays in the page cache beside the tmpfs
destination on a 24 GiB machine; every byte is still sent, received, written and (by today's and the new
fetch) hashed. Everything it writes on the host is removed at the end.

    python3 benchmarks/weights_fetch.py [--host llmops-vllm-bench20] [--shards 9] [--shard-gib 1] [--rounds 3]

Run it alone on the machine (`flock /tmp/llmops-heavy.lock ...`): other work on the cores is in the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TODAY = "b6a2f07"
WORK = "/srv/bench"  # code, the model and the servers' files on the host
DEST = "/srv/fetched"  # a tmpfs: the fetch is measured, not the disk
REPO = "bench/model"
NGINX_PORT, HUB_PORT, CDN_PORT = 8090, 8091, 8092
GB = 1e9
NGINX_SITE = f"""
server {{
    listen 127.0.0.1:{NGINX_PORT};
    root {WORK}/src;
    autoindex on;
    sendfile on;
}}
"""
# ---- on the controller ---------------------------------------------------------------------------


def podman(host, *command, check=True, **options):
    return subprocess.run(["podman", "exec", host, *command], check=check, text=True, **options)


def copy_code(host):
    """This script, the stand-in, today's and the new module_utils, into WORK/code on the host."""
    with tempfile.TemporaryDirectory() as staging:
        code = Path(staging) / "code"
        package = code / "ansible_collections" / "llmops" / "vllm" / "plugins" / "module_utils"
        shutil.copytree(ROOT / "plugins" / "module_utils", package, ignore=shutil.ignore_patterns("__pycache__"))
        today = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{TODAY}:plugins/module_utils/_weights.py"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (code / "weights_today.py").write_text(today)
        shutil.copy(Path(__file__), code / "weights_fetch.py")
        shutil.copy(ROOT / "tests" / "hub_standin.py", code / "hub_standin.py")
        podman(host, "mkdir", "-p", WORK)
        subprocess.run(["podman", "cp", str(code), f"{host}:{WORK}/"], check=True)


def controller(args):
    env = {
        **os.environ,
        "LLMOPS_LOCAL_NAME": args.host,
        "LLMOPS_LOCAL_PORT": "",
        "LLMOPS_LOCAL_TMPFS": f"{DEST}:{args.tmpfs}",
    }
    subprocess.run([str(ROOT / "scripts" / "local-host.sh"), "up"], check=True, env=env)
    copy_code(args.host)
    inside = [
        "python3", f"{WORK}/code/weights_fetch.py", "--inside", "--shards", str(args.shards), "--shard-gib",
        str(args.shard_gib), "--rounds", str(args.rounds), "--workers", str(args.workers),
    ]  # fmt: skip
    try:
        return podman(args.host, *inside, check=False).returncode
    finally:
        podman(args.host, "rm", "-rf", WORK, check=False)
        podman(args.host, "sh", "-c", f"rm -rf {DEST}/*", check=False)
        if not args.keep_host:
            subprocess.run([str(ROOT / "scripts" / "local-host.sh"), "down"], check=False, env=env)


# ---- on the host: setup --------------------------------------------------------------------------


def sh(script, **options):
    return subprocess.run(["bash", "-c", script], check=True, text=True, **options)


def setup(args):
    sh(
        "command -v nginx >/dev/null && command -v aria2c >/dev/null"
        " || DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx-light aria2 >/dev/null"
    )
    if not os.path.exists(f"{WORK}/hf/bin/hf"):
        sh(
            f"python3 -m venv {WORK}/hf && {WORK}/hf/bin/pip install -q --no-index --find-links /opt/wheelhouse"
            " huggingface_hub hf_xet"
        )
    model = Path(WORK) / "src" / REPO
    model.mkdir(parents=True, exist_ok=True)
    block = Path(WORK) / "block.bin"
    size = int(args.shard_gib * 2**30)
    sh(f"head -c {size} /dev/urandom > {block}")
    digest = sh(f"sha256sum {block}", capture_output=True).stdout.split()[0]
    files = {}
    for index in range(1, args.shards + 1):
        name = f"model-{index:05d}-of-{args.shards:05d}.safetensors"
        os.link(block, model / name)
        files[name] = {"size": size, "sha256": digest}
    config = json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}).encode()
    (model / "config.json").write_bytes(config)
    # The mirror's manifest, as a host that fetched the model writes it: sizes and hashes for every fetch.
    files["config.json"] = {"size": len(config), "sha256": hashlib.sha256(config).hexdigest()}
    (model / ".llmops-weights.json").write_text(json.dumps({"source": {"kind": "hub", "repo": REPO}, "files": files}))
    sh(f"cat > /etc/nginx/sites-enabled/bench <<'EOF'\n{NGINX_SITE}\nEOF\nsystemctl restart nginx")
    sh(
        "systemd-run --quiet --unit=bench-hub --property=KillMode=mixed"
        f" python3 {WORK}/code/hub_standin.py {WORK}/src --port {HUB_PORT} --cdn-port {CDN_PORT}"
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{HUB_PORT}/api/models/{REPO}/revision/main", timeout=5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("the hub stand-in did not answer within 60 s") from None
            time.sleep(0.5)
    return sum(file["size"] for file in files.values())


def teardown():
    sh("systemctl stop bench-hub 2>/dev/null; rm -f /etc/nginx/sites-enabled/bench; systemctl reload nginx || true")
    sh(f"rm -rf {WORK}/src {WORK}/block.bin {DEST}/*")


# ---- on the host: the fetchers -------------------------------------------------------------------


def fetchers(args):
    """(source, name, command) of every fetcher; each command fetches the model into DEST."""
    python = [sys.executable, f"{WORK}/code/weights_fetch.py", "--fetch"]
    hf_python = [f"{WORK}/hf/bin/python", f"{WORK}/code/weights_fetch.py", "--fetch"]
    mirror = f"http://127.0.0.1:{NGINX_PORT}"
    hub = f"http://127.0.0.1:{HUB_PORT}"
    workers = ["--workers", str(args.workers)] if args.workers else []
    aria = ["aria2c", "-x", "8", "-s", "8", "--file-allocation=none", "--console-log-level=warn",
            "--summary-interval=0", "--download-result=hide", "-d", DEST, "-i"]  # fmt: skip
    return [
        ("nginx", "today (b6a2f07)", [*python, "today", "--mirror", mirror]),
        ("nginx", "new", [*python, "new", "--mirror", mirror, *workers]),
        ("nginx", "aria2c -x 8 -s 8", [*aria, f"{WORK}/nginx.list"]),
        ("hub stand-in", "today (b6a2f07)", [*python, "today", "--hub", hub]),
        ("hub stand-in", "new (builtin)", [*python, "new", "--hub", hub, *workers]),
        ("hub stand-in", "new (huggingface_hub)", [*hf_python, "library", "--hub", hub, *workers]),
        ("hub stand-in", "aria2c -x 8 -s 8", [*aria, f"{WORK}/hub.list"]),
        ("hub stand-in", "hf download", [f"{WORK}/hf/bin/hf", "download", REPO, "--local-dir", DEST]),
    ]


def url_lists():
    names = sorted(os.listdir(Path(WORK) / "src" / REPO))
    for list_name, base in (
        ("nginx.list", f"http://127.0.0.1:{NGINX_PORT}/{REPO}"),
        ("hub.list", f"http://127.0.0.1:{HUB_PORT}/{REPO}/resolve/main"),
    ):
        lines = [f"{base}/{name}\n  out={name}\n" for name in names if not name.startswith(".")]
        (Path(WORK) / list_name).write_text("".join(lines))


def server_cpu_seconds():
    """CPU seconds so far of nginx's processes and of the hub stand-in."""
    ticks = os.sysconf("SC_CLK_TCK")
    pids = sh("pgrep -f 'nginx: |hub_standin.py' || true", capture_output=True).stdout.split()
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def measure(command, total):
    """Run one fetch into an empty DEST; its wall time, CPU time (wait4) and the server's CPU time."""
    sh(f"rm -rf {DEST}/* {DEST}/.[!.]*")
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{HUB_PORT}", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    server_before = server_cpu_seconds()
    started = time.monotonic()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(child.pid, 0)
    wall = time.monotonic() - started
    server = server_cpu_seconds() - server_before
    stderr = child.stderr.read().decode(errors="replace")
    landed = sum(path.stat().st_size for path in Path(DEST).iterdir() if path.is_file() and path.name[0] != ".")
    if status != 0 or landed != total:
        raise SystemExit(
            f"{shlex.join(command)} failed (status {status}, {landed} of {total} bytes):\n{stderr[-3000:]}"
        )
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "server_cpu": server}


def inside(args):
    total = setup(args)
    try:
        url_lists()
        runs = fetchers(args)
        sys.path.insert(0, f"{WORK}/code")
        from ansible_collections.llmops.vllm.plugins.module_utils.weights.fetch import default_workers

        print(f"model: {args.shards} shards of {args.shard_gib} GiB and a config, {total / GB:.2f} GB; "
              f"{os.cpu_count()} CPUs; new fetch: {args.workers or default_workers()} workers", flush=True)  # fmt: skip
        measure(runs[1][2], total)  # warm the page cache with the source
        results = {index: [] for index in range(len(runs))}
        for round_number in range(args.rounds):
            order = list(range(len(runs)))
            order = order[round_number % len(order) :] + order[: round_number % len(order)]
            for index in order:
                source, name, command = runs[index]
                result = measure(command, total)
                results[index].append(result)
                print(f"round {round_number + 1}: {source:12} {name:24} {total / result['wall'] / GB:6.2f} GB/s "
                      f"{result['cpu'] / (total / GB):5.2f} CPU s/GB", flush=True)  # fmt: skip
        report(runs, results, total)
    finally:
        teardown()
    return 0


def report(runs, results, total):
    rows = {}
    for index, (source, name, _command) in enumerate(runs):
        rate = statistics.median(total / result["wall"] for result in results[index]) / GB
        cpu = statistics.median(result["cpu"] for result in results[index]) / (total / GB)
        server = statistics.median(result["server_cpu"] for result in results[index]) / (total / GB)
        rows[(source, name)] = rate
        print_row = (source, name, f"{rate:.2f}", f"{cpu:.2f}", f"{server:.2f}", str(len(results[index])))
        if index == 0:
            print("\n| source | fetcher | GB/s (median) | client CPU s/GB | server CPU s/GB | runs |")
            print("| --- | --- | ---: | ---: | ---: | ---: |")
        print("| " + " | ".join(print_row) + " |")
    print()
    for source, new_names, anchors in (
        ("nginx", ["new"], ["aria2c -x 8 -s 8"]),
        ("hub stand-in", ["new (builtin)", "new (huggingface_hub)"], ["aria2c -x 8 -s 8", "hf download"]),
    ):
        faster = max(anchors, key=lambda anchor: rows[(source, anchor)])
        for name in new_names:
            new = rows[(source, name)]
            print(f"{source}: {name} is {new / rows[(source, faster)]:.2f} x the faster anchor ({faster}) and "
                  f"{new / rows[(source, 'today (b6a2f07)')]:.2f} x today's")  # fmt: skip


# ---- on the host: one fetch, run as a child so that its CPU time is its own ------------------------


def fetch_one(args):
    sys.path.insert(0, f"{WORK}/code")
    description = {"kind": "hub", "repo": REPO, "revision": "main"}
    if args.fetch == "today":
        import weights_today as today

        source = today.open_source(REPO, "main", args.mirror, args.hub or today.HUB_ENDPOINT)
        steps = today.plan_fetch(source.files(), DEST, description)
        progress = today.Progress(None, sum(step.bytes_needed for step in steps))
        today.fetch(source, steps, DEST, description, progress)
        return 0
    from ansible_collections.llmops.vllm.plugins.module_utils.weights import (
        fetch as _weights_fetch,
    )
    from ansible_collections.llmops.vllm.plugins.module_utils.weights import (
        hub_client as _hub_client,
    )
    from ansible_collections.llmops.vllm.plugins.module_utils.weights import (
        plan as _weights_plan,
    )
    from ansible_collections.llmops.vllm.plugins.module_utils.weights import (
        sources as _weights_sources,
    )

    workers = args.workers or _weights_fetch.default_workers()

    if args.fetch == "library":
        import huggingface_hub

        source = _hub_client.LibrarySource(huggingface_hub, REPO, "main", args.hub)
    else:
        source = _weights_sources.open_source(REPO, "main", args.mirror, args.hub or _weights_sources.HUB_ENDPOINT)
    files = source.files()
    steps = _weights_plan.plan_fetch(files, DEST, description, ranges=args.fetch == "new", workers=workers)
    progress = _weights_fetch.Progress(None, sum(step.bytes_needed for step in steps))
    manifest = _weights_fetch.Manifest(DEST, description, {file.path for file in files})
    if args.fetch == "library":
        _hub_client.fetch_with_library(source, steps, DEST, manifest, progress, workers)
    else:
        _weights_fetch.Fetcher(source, DEST, manifest, progress, workers).run(steps)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--host", default="llmops-vllm-bench20", help="local host container (made if missing)")
    parser.add_argument("--shards", type=int, default=9)
    parser.add_argument("--shard-gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0, help="the new fetch's workers; 0: the module's default")
    parser.add_argument("--tmpfs", default="11g", help="size of the destination tmpfs")
    parser.add_argument("--keep-host", action="store_true", help="leave the container running afterwards")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fetch", choices=["today", "new", "library"], help=argparse.SUPPRESS)
    parser.add_argument("--mirror", help=argparse.SUPPRESS)
    parser.add_argument("--hub", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fetch:
        return fetch_one(args)
    if args.inside:
        return inside(args)
    return controller(args)


if __name__ == "__main__":
    sys.exit(main())
