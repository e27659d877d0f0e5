import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.instance.host_instances import (
    InstanceError,
    displaced,
    normalize,
    parse_gpus,
)


def record(instance, port, gpus=(), state="active"):
    return {"instance": instance, "port": port, "gpus": list(gpus), "active_state": state}


def test_defaults_name_port_and_gpus():
    assert normalize([{"model": "tiny"}]) == [
        {"name": "tiny", "model": "tiny", "port": 8000, "gpus": [], "cuda_visible_devices": ""}
    ]


def test_an_instance_s_own_catalog_paths_go_with_it():
    [instance] = normalize([{"model": "tiny_tune_tune_1a", "catalog_paths": ["/tmp/tune/catalog"]}])
    assert instance["catalog_paths"] == ["/tmp/tune/catalog"]


def test_two_tp4_models_on_eight_gpus():
    instances = normalize(
        [{"model": "minimax_m25", "gpus": "0,1,2,3"}, {"model": "kimi_k25", "gpus": [7, 6, "5", 4], "port": "8001"}],
        gpu_count=8,
    )
    assert [(i["name"], i["port"], i["cuda_visible_devices"]) for i in instances] == [
        ("minimax_m25", 8000, "0,1,2,3"),
        ("kimi_k25", 8001, "4,5,6,7"),
    ]


@pytest.mark.parametrize(
    ("instances", "message"),
    [
        ([{"model": "a"}, {"model": "b"}], "instances a and b both use port 8000"),
        ([{"model": "a", "gpus": "0,1"}, {"model": "b", "gpus": "1,2", "port": 8001}], "both use GPU 1$"),
        # On a host with GPUs an instance without gpus takes all of them.
        ([{"model": "a"}, {"model": "b", "gpus": "3", "port": 8001}], "both use GPU 3"),
        ([{"model": "a"}, {"model": "a", "port": 8001}], "instance name a is used twice"),
        ([{"model": "a", "gpus": "0,8"}], "GPU 8 does not exist; the host has GPUs 0 to 7"),
        ([{"model": "a", "port": 70000}], "port must be a number from 1 to 65535"),
        ([{"model": "a", "port": True}], "port must be"),
        ([{"name": "bad name", "model": "a"}], "instance name 'bad name' must be"),
        ([{"model": ""}], "needs a model"),
        ([{"model": "a", "gpu": "0"}], r"unknown keys \['gpu'\]"),
        ([{"model": "a", "gpus": "0,x"}], "instance a: gpus must hold GPU indices"),
        ([{"model": "a", "gpus": [1, 1]}], "names a GPU twice"),
        ([{"model": "a", "catalog_paths": "/srv/catalog"}], "instance a: catalog_paths must be a list of directories"),
        ([{"model": "a", "catalog_paths": [""]}], "catalog_paths must be a list of directories"),
        (["tiny"], "must be a mapping"),
        ([], "non-empty list"),
    ],
)
def test_refuses_clashes_and_bad_input(instances, message):
    with pytest.raises(InstanceError, match=message):
        normalize(instances, gpu_count=8)


def test_every_problem_is_named_at_once():
    with pytest.raises(InstanceError) as error:
        normalize([{"model": "a"}, {"model": "b"}, {"model": "c"}])
    assert str(error.value).count("both use port 8000") == 3


def test_a_host_without_gpus_refuses_gpu_indices_but_shares_nothing():
    with pytest.raises(InstanceError, match="the host has no GPUs"):
        normalize([{"model": "a", "gpus": "0"}], gpu_count=0)
    assert len(normalize([{"model": "a"}, {"model": "b", "port": 8001}], gpu_count=0)) == 2


def test_running_instances_outside_the_list_must_not_clash():
    active = [record("old", 8000), record("stopped", 8001, state="inactive"), record("a", 8002)]
    with pytest.raises(InstanceError, match="would use port 8000 of instance old, which is running"):
        normalize([{"model": "a", "port": 8000}], active=active)
    # Stopped instances and the listed instances' own records do not count.
    assert normalize([{"model": "a", "port": 8001}, {"model": "b", "port": 8003}], active=active)


def test_displaced_are_the_running_clashes_other_than_itself():
    new = normalize([{"model": "new", "gpus": "0,1,2,3"}], gpu_count=8)[0]
    active = [
        record("old", 8000, [4, 5, 6, 7]),  # same port
        record("left", 8001, [2, 3]),  # shares GPUs
        record("right", 8002, [4, 5]),  # neither
        record("idle", 8000, state="inactive"),
        record("new", 8000, [0, 1, 2, 3]),  # the instance itself, restarted in place
    ]
    assert [r["instance"] for r in displaced(new, active, gpu_count=8)] == ["old", "left"]


@pytest.mark.parametrize(("value", "indices"), [(None, []), ("", []), ("2, 0", [0, 2]), ([3], [3])])
def test_parse_gpus(value, indices):
    assert parse_gpus(value) == indices
