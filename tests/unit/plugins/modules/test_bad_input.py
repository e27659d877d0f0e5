"""Bad input, as a new user gives it, is refused with a message that names the option and the value, and nothing
happens: no record or file read, no request, no file written, no GPU poll, no command. (vllm_service's cases are in
test_vllm_service.py, vllm_import_check's and vllm_install_info's in theirs.)"""

import math

import pytest

from ansible_collections.llmops.vllm.plugins.modules import (
    gpu_memory_wait,
    tiny_model,
    vllm_bench,
    vllm_bench_report,
    vllm_instance,
    vllm_instance_info,
    vllm_plan,
    vllm_tune_report,
)

# ---- vllm_instance: the record is never written from bad fields ---------------------------------------------

RECORD_ARGS = {
    "instance": "tiny", "unit": "vllm-tiny.service", "model": "tiny", "served_name": "tiny", "host": "0.0.0.0",
    "port": 8000, "model_path": "/var/lib/vllm/models/tiny", "python": "/opt/vllm/venv/bin/python",
    "vllm_version": "0.32.0", "layout": {"tensor_parallel_size": 1}, "load_timeout": 300, "drain_timeout": 10,
    "stop_timeout": 30, "environment": {"HOME": "/var/lib/vllm"}, "unit_content": "[Service]\n",
}  # fmt: skip


def record_args(tmp_path, **changes):
    """vllm_instance's options for an instance whose files all go to tmp_path."""
    files = {"config_dir": str(tmp_path), "environment_file": str(tmp_path / "tiny.env"),
             "unit_file": str(tmp_path / "vllm-tiny.service")}  # fmt: skip
    return {**RECORD_ARGS, **files, **changes}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"instance": "../tiny"},
            "instance must be letters, digits and '_.-', starting with a letter or digit, got '../tiny'",
        ),
        ({"port": 0}, "has port 0, not a port number"),
        ({"port": 70000}, "has port 70000, not a port number"),
        ({"load_timeout": 0}, "has load_timeout 0, not a number of seconds of at least 1"),
        ({"drain_timeout": -1}, "has drain_timeout -1, not a number of seconds of at least 0"),
        ({"stop_timeout": -30}, "has stop_timeout -30, not a number of seconds of at least 1"),
        ({"gpus": [0, -1]}, "has gpus [0, -1], not a list of GPU indices"),
        (
            {"gpus": ["zero"]},
            "Elements value for option 'gpus' is of type str and we were unable to convert to int",
        ),
        ({"served_name": " "}, "has served_name ' ', not a non-empty text"),
        ({"environment_file": "tiny.env"}, "has secrets {'environment_file': 'tiny.env'"),
        ({"environment": {"BAD NAME": "1"}}, "'BAD NAME' is not a valid environment variable name"),
        ({"environment": {"NCCL_DEBUG": "INFO\nEvil=1"}}, "the value of NCCL_DEBUG contains a control character"),
        ({"unit": "vllm tiny.service"}, "unit must be a systemd unit name such as vllm-tiny.service, got 'vllm tiny"),
        ({"python": "venv/bin/python"}, "python must be an absolute path, got 'venv/bin/python'"),
        ({"model_path": "models/tiny"}, "model_path must be an absolute path, got 'models/tiny'"),
        ({"unit_file": "vllm-tiny.service"}, "unit_file must be an absolute path, got 'vllm-tiny.service'"),
    ],
)
def test_the_instance_refuses_bad_fields_and_writes_nothing(run_module, tmp_path, changes, message):
    result = run_module(vllm_instance.main, record_args(tmp_path, **changes), fails=True)
    assert message in result["msg"]
    assert list(tmp_path.iterdir()) == []


def test_the_instance_needs_the_unit_s_directory(run_module, tmp_path):
    args = record_args(tmp_path, unit_file=str(tmp_path / "none" / "vllm-tiny.service"))
    result = run_module(vllm_instance.main, args, fails=True)
    assert result["msg"] == f"{tmp_path / 'none'} is not a directory; create it first"
    assert list(tmp_path.iterdir()) == []


# ---- vllm_instance_info ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"timeout": -2}, "timeout must be more than 0 seconds, got -2.0"),
        ({"timeout": math.inf}, "timeout must be more than 0 seconds, got inf"),
        ({"metrics": "sometimes"}, "argument 'metrics' is of type str and we were unable to convert to bool"),
        (
            {"instances": ["tiny", "../etc"]},
            "instances must be letters, digits and '_.-', starting with a letter or digit, got '../etc'",
        ),
    ],
)
def test_instance_info_refuses_bad_options_before_reading(run_module, tmp_path, args, message, monkeypatch):
    monkeypatch.setattr(vllm_instance_info, "read_records", lambda _dir: pytest.fail("records were read"))
    result = run_module(vllm_instance_info.main, {"config_dir": str(tmp_path), **args}, fails=True)
    assert message in result["msg"]


# ---- vllm_bench: no request reaches the server -----------------------------------------------------------------


@pytest.fixture
def server(serve):
    return serve({"/v1/completions": (200, "")})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"warmup_requests": -1}, "warmup_requests must be 0 or more, got -1"),
        ({"seed": -3}, "seed must be 0 or more, got -3"),
        ({"max_failed_percent": 150}, "max_failed_percent must be from 0 to 100, got 150.0"),
        ({"max_failed_percent": -1}, "max_failed_percent must be from 0 to 100, got -1.0"),
        ({"max_regression_percent": -5}, "max_regression_percent must be 0 or more, got -5.0"),
        ({"goodput": {"ttft": "soon"}}, "goodput.ttft must be a number of milliseconds above 0, got 'soon'"),
        ({"goodput": {"tpot": 0}}, "goodput.tpot must be a number of milliseconds above 0, got 0"),
        ({"duration": math.nan}, "duration must be more than 0 seconds, got nan"),
        ({"request_timeout": -1}, "request_timeout must be more than 0 seconds, got -1.0"),
        ({"model": ""}, "model must be the served model name, without spaces, got ''"),
        ({"concurrency": [1, "many"]}, "Elements value for option 'concurrency' is of type str and we were unable"),
        ({"baseline": {"levels": [1]}}, "the baseline's level 1 is 1, not a level with max_concurrency"),
        (
            {"baseline": {"levels": []}},
            "the baseline must be a saved result: a dict (or JSON file) with a list `levels`",
        ),
        (
            {"baseline": {"levels": [{"max_concurrency": 1, "output_throughput": 9.5}]}, "regression_metrics": ["tps"]},
            "regression_metrics ['tps'] are not numbers in the baseline's level C=1",
        ),
        ({"instance": "tiny"}, "parameters are mutually exclusive: instance|url"),
    ],
)
def test_the_benchmark_refuses_bad_options_before_any_request(run_module, server, args, message):
    url, asked = server
    result = run_module(vllm_bench.main, {"url": url, "model": "tiny", **args}, fails=True)
    assert message in result["msg"]
    assert asked == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"seed": -3}, "seed must be 0 or more, got -3"),
        ({"concurrency": [0]}, "concurrency must list levels of 1 or more, got [0]"),
        ({"instance": "../tiny"}, "instance must be letters, digits and '_.-', starting with a letter or digit"),
    ],
)
def test_the_benchmark_of_an_instance_refuses_bad_options_before_its_record_is_read(
    run_module, tmp_path, monkeypatch, args, message
):
    monkeypatch.setattr(vllm_bench, "find", lambda *_args: pytest.fail("the record was read"))
    result = run_module(vllm_bench.main, {"instance": "tiny", "config_dir": str(tmp_path), **args}, fails=True)
    assert message in result["msg"]


def test_the_benchmark_of_an_instance_without_a_record_names_the_instances(run_module, tmp_path):
    result = run_module(vllm_bench.main, {"instance": "tiny", "config_dir": str(tmp_path)}, fails=True)
    assert result["msg"] == f"No instance record for tiny in {tmp_path}; the instances here are: none"


def test_the_benchmark_of_an_instance_takes_its_url_name_and_key_from_the_record(
    run_module, tmp_path, serve, write_instance, monkeypatch
):
    """bench.yml's defect: it benchmarked vllm_server_port, not the port of the instance it names."""
    url, asked = serve({})
    port = int(url.rsplit(":", 1)[1])
    write_instance(tmp_path, "tiny-b", port, load_timeout=300, key="b-key")
    args = {"instance": "tiny-b", "config_dir": str(tmp_path), "_ansible_check_mode": True}
    result = run_module(vllm_bench.main, args)
    assert result["msg"] == "check mode: no request sent" and asked == []
    # The module names the record's URL, served name and key to the client it builds.
    seen = {}
    original = vllm_bench.Target.build

    def build(url, endpoint, model, output_len, **kwargs):
        seen.update(url=url, model=model, api_key=kwargs["api_key"])
        return original(url, endpoint, model, output_len, **kwargs)

    monkeypatch.setattr(vllm_bench.Target, "build", staticmethod(build))
    run_module(vllm_bench.main, args)
    assert seen == {"url": f"http://127.0.0.1:{port}", "model": "tiny-b-served", "api_key": "b-key"}


# ---- vllm_plan: the hub is not asked ---------------------------------------------------------------------------

CONFIG_URL = "/MiniMaxAI/MiniMax-M2.5/resolve/main/config.json"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"checkpoint_bytes": -5}, "checkpoint_bytes must be a whole number of at least 1, got -5"),
        ({"max_model_len": 0}, "max_model_len must be a whole number of at least 1, got 0"),
        ({"runtime_overhead_gib": -1}, "runtime_overhead_gib must be 0 GiB or more, got -1.0"),
        ({"timeout": 0}, "timeout must be 1 second or more, got 0"),
        ({"layout": ["tensor_parallel_size", 4]}, "layout must be auto, default, an alternative's name or a mapping"),
        (
            {"gpus": {"present": True, "gpus": [{"index": "a", "memory_total_mib": 1}]}},
            "GPU 1 has index 'a', not a GPU index",
        ),
        (
            {"gpus": {"present": True, "gpus": [{"index": 0, "memory_total_mib": 1}], "topology": "nvlink"}},
            "topology must be a mapping",
        ),
        (
            {"gpus": {"present": True, "gpus": [{"index": 0, "memory_total_mib": -1}]}},
            "GPU facts: GPU 0 has no memory_total_mib",
        ),
        # A repository id that climbs out of a mirror (MIRROR/owner/name) or out of the hub's URL space.
        ({"hub_repo": "../MiniMax-M2.5"}, "hub_repo='../MiniMax-M2.5': it must not contain '--' or '..'"),
        ({"hub_repo": "MiniMaxAI/M2.5/x"}, "hub_repo='MiniMaxAI/M2.5/x': it must be owner/name, with one slash"),
        ({"hub_revision": "main..x"}, "hub_revision='main..x': it contains '..'"),
        ({"mirror": "mirror/models"}, "mirror='mirror/models': it must be an http(s) URL or an absolute path"),
        ({"mirror": "http://"}, "mirror='http://': it must be an http:// or https:// URL with a host"),
        ({"hub_endpoint": "huggingface.co"}, "hub_endpoint='huggingface.co': it must be an http:// or https:// URL"),
        # The layout and the serve options, checked before config.json (they used to be, after it).
        ({"layout": "ep4"}, "layout 'ep4' is not auto, default, a mapping, or one of ['default', 'dp8_ep', 'ep8']"),
        ({"layout": {"tensor_parallel_size": 0}}, "layout.tensor_parallel_size must be a whole number of at least 1"),
        ({"layout": {"tp": 4}}, "layout has unknown keys ['tp']"),
        ({"port": 0}, "port must be a whole number from 1 to 65535, got 0"),
        ({"host": ""}, "host must be a non-empty string, got ''"),
    ],
)
def test_the_plan_refuses_bad_options_before_asking_the_hub(run_module, hub_server, entry, args, message):
    endpoint, requests = hub_server({CONFIG_URL: b"{}"})
    base = {"model": entry("minimax_m25"), "hub_repo": "MiniMaxAI/MiniMax-M2.5", "hub_endpoint": endpoint}
    result = run_module(vllm_plan.main, {**base, **args}, fails=True)
    assert message in result["msg"] and result["msg"].startswith("Cannot plan minimax_m25: ")
    assert requests == []


def test_the_plan_needs_an_absolute_config_path(run_module, entry, tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    result = run_module(vllm_plan.main, {"model": entry("tiny"), "config_path": "config.json"}, fails=True)
    assert result["msg"] == "Cannot plan tiny: config_path must be an absolute path, got 'config.json'"


@pytest.mark.parametrize(
    ("quantization_config", "message"),
    [
        ("fp8", "quantization_config must be a mapping, got 'fp8'"),
        (
            {"quant_method": "fp8", "weight_block_size": 128},
            "quantization_config.weight_block_size must be two whole numbers",
        ),
        (
            {"quant_method": "awq", "group_size": "128"},
            "quantization_config.group_size must be a whole number, got '128'",
        ),
        ({"quant_method": "compressed-tensors", "config_groups": ["g"]}, "config_groups must map names to groups"),
    ],
)
def test_a_config_json_of_another_shape_is_named_not_a_crash(run_module, config, entry, quantization_config, message):
    shape = {**config("MiniMax-M2.5"), "quantization_config": quantization_config}
    result = run_module(vllm_plan.main, {"model": entry("minimax_m25"), "config": shape}, fails=True)
    assert message in result["msg"]


def test_the_plan_names_every_rule_that_fails(run_module, entry, config, seed_box):
    # TP 5 of MiniMax-M2.5: 48 heads, 8 KV heads and the 1536 expert width all fail to divide.
    args = {"model": entry("minimax_m25"), "config": config("MiniMax-M2.5"), "gpus": seed_box}
    result = run_module(vllm_plan.main, {**args, "layout": {"tensor_parallel_size": 5}}, fails=True)
    assert result["failed_rules"] == ["attention_heads", "kv_heads", "quantization_alignment"]
    assert result["msg"].startswith(
        "Layout rules attention_heads, kv_heads, quantization_alignment failed for minimax_m25 TP5: "
    )
    assert "48 attention heads are not divisible by tensor_parallel_size 5" in result["msg"]
    assert "8 KV heads are not divisible by tensor_parallel_size 5" in result["msg"]
    assert "1536 / TP 5 = 307.2 is not a multiple of the FP8 weight block 128x128" in result["msg"]


# ---- gpu_memory_wait: no GPU is polled -------------------------------------------------------------------------


class NoPolls:
    name = "nvml"

    def gpus(self):
        pytest.fail("the GPUs were polled")

    def close(self):
        pass


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"max_used_mib": -1}, "max_used_mib must be 0 MiB or more, got -1"),
        (
            {"max_above_baseline_mib": -256, "baseline": {"0": 100}},
            "max_above_baseline_mib must be 0 MiB or more, got -256",
        ),
        ({"gpus": []}, "gpus must name GPUs by index or UUID (or all), got []"),
        ({"gpus": ["0", " "]}, "gpus must name GPUs by index or UUID (or all), got ['0', ' ']"),
        ({"grace": -1}, "grace must be more than 0 seconds, got -1.0"),
        ({"interval": math.inf}, "interval must be more than 0 seconds, got inf"),
        ({"unit": "vllm tiny"}, "unit must be a systemd unit name such as vllm-tiny.service, got 'vllm tiny'"),
        ({"owner_unit": "a;b"}, "owner_unit must be a systemd unit name such as vllm-tiny.service, got 'a;b'"),
        # The baseline's values were read only after the GPUs had been polled.
        ({"baseline": {"0": "lots"}}, "baseline value for GPU 0 is 'lots', not a number of MiB"),
        ({"baseline": {"0": -5}}, "baseline value for GPU 0 is -5, not a number of MiB"),
    ],
)
def test_the_memory_wait_refuses_bad_options_before_any_poll(run_module, monkeypatch, args, message):
    monkeypatch.setattr(gpu_memory_wait, "open_backend", lambda *_args: NoPolls())
    monkeypatch.setattr(gpu_memory_wait.AnsibleModule, "run_command", lambda *_args, **_kw: pytest.fail("ran"))
    result = run_module(gpu_memory_wait.main, args, fails=True)
    assert message in result["msg"]


# ---- tiny_model: nothing is written ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"path": "models/tiny"}, "path must be an absolute directory, got 'models/tiny'"),
        ({"seed": -1}, "seed must be from 0 to 4294967295, got -1"),
        ({"seed": 2**32}, "seed must be from 0 to 4294967295, got 4294967296"),
        ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ],
)
def test_the_tiny_model_refuses_bad_options_and_writes_nothing(run_module, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = run_module(tiny_model.main, {"path": str(tmp_path / "tiny"), **args}, fails=True)
    assert message in result["msg"]
    assert list(tmp_path.iterdir()) == []


# ---- vllm_bench_report: nothing is written ---------------------------------------------------------------------

SUMMARY = {"model": "tiny", "endpoint": "completions", "input_len": 16, "output_len": 8, "prompt_source": "fixed"}
LEVEL = {"max_concurrency": 1, "output_throughput": 90.0, "median_ttft_ms": 40.0, "median_tpot_ms": 9.0, "failed": 0}


@pytest.mark.parametrize(
    ("results", "message"),
    [
        ({"h1": {"summary": SUMMARY, "levels": "C=1"}}, "h1 has no list of levels"),
        (
            {"h1": {"summary": SUMMARY, "levels": [1]}},
            "h1's level 1 lacks the numbers max_concurrency, output_throughput",
        ),
        (
            {"h1": {"summary": SUMMARY, "levels": [{**LEVEL, "median_ttft_ms": "fast"}]}},
            "h1's level 1 lacks the numbers median_ttft_ms",
        ),
        ({"h1": {"levels": [LEVEL]}}, "h1 has no summary with model, endpoint"),
        # A host is a file name of the report (HOST.json): it must not climb out of dest.
        ({"../h1": {"summary": SUMMARY, "levels": [LEVEL]}}, "each host of results must be a file name, without '/'"),
    ],
)
def test_the_report_refuses_results_it_cannot_read_and_writes_nothing(run_module, tmp_path, results, message):
    args = {"results": results, "dest": str(tmp_path / "reports"), "formats": ["json", "markdown"]}
    result = run_module(vllm_bench_report.main, args, fails=True)
    assert message in result["msg"]
    assert list(tmp_path.iterdir()) == []


def test_the_report_needs_an_absolute_directory(run_module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = {"results": {"h1": {"summary": SUMMARY, "levels": [LEVEL]}}, "dest": "reports", "formats": ["json"]}
    assert (
        run_module(vllm_bench_report.main, args, fails=True)["msg"]
        == "dest must be an absolute directory, got 'reports'"
    )
    assert list(tmp_path.iterdir()) == []


# ---- vllm_tune_report: nothing is written ------------------------------------------------------------------------

TUNE = {"model": "tiny", "instance": "tiny-tune", "workload": {"concurrency": [1]},
        "candidates": [{"name": "default", "key": "k1", "verdict": "measured", "levels": [LEVEL]}]}  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"host": "../../etc/cron.d/x"}, "host must be a file name, without '/', got '../../etc/cron.d/x'"),
        ({"host": ".."}, "host must be a file name, without '/', got '..'"),
        ({"instance": "tiny tune"}, "instance must be letters, digits and '_.-', starting with a letter or digit"),
        ({"dest": "tune-results"}, "dest must be an absolute directory, got 'tune-results'"),
    ],
)
def test_the_tune_report_refuses_bad_options_and_writes_nothing(run_module, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    base = {"dest": str(tmp_path / "reports" / "tiny"), "host": "it17", **TUNE}
    result = run_module(vllm_tune_report.main, {**base, **args}, fails=True)
    assert message in result["msg"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("report", ["bench", "tune"])
def test_a_report_under_a_regular_file_names_dest_and_the_file_and_writes_nothing(run_module, tmp_path, report):
    file = tmp_path / "reports"
    file.write_text("a file where the reports' directory would go")
    dest = file / "tiny"
    main, args = {
        "bench": (vllm_bench_report.main, {"results": {"h1": {"summary": SUMMARY, "levels": [LEVEL]}}}),
        "tune": (vllm_tune_report.main, {"host": "it17", **TUNE}),
    }[report]
    result = run_module(main, {**args, "dest": str(dest)}, fails=True)
    assert result["msg"] == f"dest {str(dest)!r} cannot be a directory: {file} is a file, not a directory"
    assert list(tmp_path.iterdir()) == [file] and file.read_text().startswith("a file")
