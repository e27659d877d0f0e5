import json

import pytest

from ansible_collections.llmops.vllm.plugins.modules import vllm_throughput_info

METRICS = 'vllm:generation_tokens_total{{engine="0",model_name="tiny"}} {}\nvllm:prompt_tokens_total{{engine="0"}} 10\n'


def write_record(config_dir, name, url):
    config_dir.mkdir(exist_ok=True)
    port = int(url.rsplit(":", 1)[1])
    record = {
        "instance": name, "unit": f"vllm-{name}.service", "model": name, "served_name": name, "host": "0.0.0.0",
        "port": port, "url": url, "gpus": [], "model_path": f"/m/{name}", "python": "/p", "vllm_version": "0.32.0",
        "layout": {}, "load_timeout": 300, "drain_timeout": 10, "stop_timeout": 30,
        "secrets": {"environment_file": "/etc/vllm/x.env", "api_key_variable": "VLLM_API_KEY"},
    }  # fmt: skip
    (config_dir / f"{name}.json").write_text(json.dumps(record))


def test_tokens_per_second_of_each_instance(run_module, tmp_path, serve):
    reads = []

    def metrics(_headers):
        reads.append(1)
        return 200, METRICS.format(100 + 50 * (len(reads) - 1))

    url, _asked = serve({"/metrics": metrics})
    config_dir = tmp_path / "vllm"
    write_record(config_dir, "tiny", url)
    write_record(config_dir, "stopped", "http://127.0.0.1:9")
    result = run_module(vllm_throughput_info.main, {"config_dir": str(config_dir), "seconds": 0.5})
    assert result["changed"] is False
    stopped, tiny = result["instances"]
    assert stopped == {"instance": "stopped", "generation_tokens_per_second": None, "prompt_tokens_per_second": None,
                       "seconds": stopped["seconds"]}  # fmt: skip
    assert tiny["instance"] == "tiny" and 0.5 <= tiny["seconds"] < 5
    assert tiny["generation_tokens_per_second"] == pytest.approx(50 / tiny["seconds"], rel=0.05)
    assert tiny["prompt_tokens_per_second"] == 0.0


@pytest.mark.parametrize(
    ("args", "message"),
    [({"seconds": 0}, "seconds must be more than 0 seconds"), ({"instances": ["nope"]}, "No instance record for nope")],
)
def test_bad_input_is_refused(run_module, tmp_path, args, message):
    result = run_module(vllm_throughput_info.main, {"config_dir": str(tmp_path), **args}, fails=True)
    assert message in result["msg"]
