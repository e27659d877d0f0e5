from ansible_collections.llmops.vllm.plugins.module_utils.common.task_failure import task_failure


def test_a_failed_task_says_its_name_and_its_message():
    assert task_failure({"failed": True, "msg": "No instance record for tiny"}, "Start") == (
        "Start: No instance record for tiny"
    )
    assert task_failure({"failed": True, "msg": "timed out"}) == "timed out"


def test_a_failed_loop_says_why_its_first_failed_item_failed():
    loop = {
        "failed": True,
        "msg": "One or more items failed",
        "results": [{"changed": True}, {"failed": True, "msg": "tiny did not stop"}, {"failed": True, "msg": "b"}],
    }
    assert task_failure(loop, "Stop the old instances") == "Stop the old instances: tiny did not stop"


def test_a_failure_without_a_message_says_failed():
    assert task_failure({"failed": True, "results": [{"failed": True}]}, "Wait") == "Wait: failed"
    assert task_failure(None) == "failed"
