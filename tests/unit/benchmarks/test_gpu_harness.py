"""The GPU harness's bench server: rendered from the catalog entry it is given, with that entry's settings
(benchmarks/gpu/harness.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
import harness  # noqa: E402  pylint: disable=wrong-import-position,import-error

GPU_HOST_CATALOG = str(ROOT / "benchmarks" / "gpu_host" / "catalog" / "h200")


def bench_argv(tmp_path, **options) -> list[str]:
    args = argparse.Namespace(
        entry="gpu_tinyllama", catalog=[], bench_utilization=None, device="cuda", port=8100,
        python="/opt/torch/.venv/bin/python3", pythonpath="/tmp/site", model_dir="/tmp/tinyllama",
        load_format="dummy", home=str(tmp_path / "home"), logs=tmp_path,
    )  # fmt: skip
    for name, value in options.items():
        setattr(args, name, value)
    (server,) = harness.bench_servers(args)
    return server.argv


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_project_entry_is_compiled_at_its_own_share(tmp_path):
    argv = bench_argv(tmp_path)
    assert flag(argv, "--gpu-memory-utilization") == "0.9"
    assert "--enforce-eager" not in argv and "--enable-sleep-mode" not in argv


def test_an_entry_of_another_catalog_brings_its_share_sleep_mode_and_flags(tmp_path):
    argv = bench_argv(tmp_path, catalog=[GPU_HOST_CATALOG], entry="host_a")
    assert flag(argv, "--served-model-name") == "host-a"
    assert flag(argv, "--gpu-memory-utilization") == "0.4"
    assert "--enforce-eager" in argv and "--enable-sleep-mode" in argv
    assert flag(argv, "--model") == "/tmp/tinyllama"  # the harness's model directory, not the entry's path


def test_bench_utilization_overrides_the_entry(tmp_path):
    argv = bench_argv(tmp_path, catalog=[GPU_HOST_CATALOG], entry="host_a", bench_utilization=0.7)
    assert flag(argv, "--gpu-memory-utilization") == "0.7"
