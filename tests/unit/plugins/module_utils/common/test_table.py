from ansible_collections.llmops.vllm.plugins.module_utils.common.table import markdown_table, records_table


def test_markdown_table_pads_and_aligns():
    assert markdown_table(["host", "s"], [["gpu-01", 12.5], ["b", None]], numeric=(1,)) == (
        "| host   |    s |\n|--------|-----:|\n| gpu-01 | 12.5 |\n| b      |    - |\n"
    )


def test_records_table_takes_keys_or_header_key_pairs():
    records = [{"host": "a", "result": "swapped", "seconds": 41.2}, {"host": "b", "result": "rolled back"}]
    lines = records_table(records, ["host", ["outcome", "result"], "seconds"]).splitlines()
    assert lines[0] == "| host | outcome     | seconds |"
    assert lines[1] == "|------|-------------|--------:|"
    assert lines[3] == "| b    | rolled back |       - |"
