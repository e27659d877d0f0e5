import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.service.systemd import (
    SystemdSyntaxError,
    environment_file,
    environment_line,
    exec_arg,
    exec_line,
    parse_environment_assignments,
    parse_environment_directives,
    parse_environment_file,
    parse_environment_files_property,
    unit_file_exec_start,
)


@pytest.mark.parametrize(
    ("arg", "quoted"),
    [
        ("/opt/vllm/venv/bin/python", "/opt/vllm/venv/bin/python"),
        ("--max-model-len", "--max-model-len"),
        ("0.0.0.0", "0.0.0.0"),
        ("a b", '"a b"'),
        ('{"temperature": 0.6}', '"{\\"temperature\\": 0.6}"'),
        ("50%", "50%%"),
        ("$HOME", "$$HOME"),
        ("back\\slash", '"back\\\\slash"'),
        ("", '""'),
        (";", "\\;"),
        ("it's", '"it\'s"'),
    ],
)
def test_exec_arg(arg, quoted):
    assert exec_arg(arg) == quoted


def test_exec_line_keeps_each_argument_whole():
    line = exec_line(
        ["/opt/vllm/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--chat-template", "{{ x }} y"]
    )
    assert line == '/opt/vllm/venv/bin/python -m vllm.entrypoints.openai.api_server --chat-template "{{ x }} y"'


def test_the_serve_command_is_read_as_systemd_would_from_the_unit_file():
    unit = '[Service]\nExecStart=/opt/vllm/venv/bin/python -m vllm "--served-model-name" "a b" --x 50%%\nUser=vllm\n'
    assert unit_file_exec_start(unit) == [
        "/opt/vllm/venv/bin/python",
        "-m",
        "vllm",
        "--served-model-name",
        "a b",
        "--x",
        "50%",
    ]
    with pytest.raises(SystemdSyntaxError, match="no ExecStart"):
        unit_file_exec_start("[Service]\nUser=vllm\n")


def test_a_unit_file_s_exec_start_reads_back_every_argument_exec_line_wrote():
    argv = ["/bin/echo", ";", "50%", "$HOME", 'say "hi"', "back\\slash", "{{ x }} y", ""]
    assert unit_file_exec_start(f"[Service]\nExecStart={exec_line(argv)}\n") == argv


def test_exec_line_refuses_newlines_and_empty_commands():
    with pytest.raises(SystemdSyntaxError, match="control character"):
        exec_line(["/bin/echo", "two\nlines"])
    with pytest.raises(SystemdSyntaxError, match="at least the program"):
        exec_line([])


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("1", 'HF_HUB_OFFLINE="1"'),
        ('pa"ss', 'HF_HUB_OFFLINE="pa\\"ss"'),
        ("a$b`c\\d", 'HF_HUB_OFFLINE="a\\$b\\`c\\\\d"'),
        ("with spaces and # hash", 'HF_HUB_OFFLINE="with spaces and # hash"'),
        (None, 'HF_HUB_OFFLINE=""'),
    ],
)
def test_environment_line(value, line):
    assert environment_line("HF_HUB_OFFLINE", value) == line


@pytest.mark.parametrize("name", ["1ABC", "A-B", "", "A B", None])
def test_environment_line_refuses_invalid_names(name):
    with pytest.raises(SystemdSyntaxError, match="not a valid environment variable name"):
        environment_line(name, "x")


def test_environment_line_refuses_newlines():
    with pytest.raises(SystemdSyntaxError, match="the value of TOKEN contains a control character"):
        environment_line("TOKEN", "abc\ndef")


def test_environment_file_is_sorted_and_stable():
    variables = {"VLLM_API_KEY": "k", "HF_HOME": "/var/lib/vllm/huggingface", "CUDA_VISIBLE_DEVICES": "0,1"}
    text = environment_file(variables)
    assert text == 'CUDA_VISIBLE_DEVICES="0,1"\nHF_HOME="/var/lib/vllm/huggingface"\nVLLM_API_KEY="k"\n'
    assert environment_file(dict(reversed(list(variables.items())))) == text


def test_environment_file_reads_back_what_it_writes():
    variables = {"VLLM_API_KEY": 'k"e$y\\`', "CUDA_VISIBLE_DEVICES": "0,1", "EMPTY": "", "SPACED": "a b"}
    assert parse_environment_file(environment_file(variables)) == variables


def test_environment_file_as_people_write_it():
    text = "# comment\n; also a comment\n\nPLAIN=value\n  SPACED = x \nSINGLE='a \\b'\nLONG=a\\\nb\nnot a line\n"
    assert parse_environment_file(text) == {"PLAIN": "value", "SPACED": "x", "SINGLE": "a \\b", "LONG": "ab"}


def test_environment_lines_of_a_unit_and_its_drop_ins_in_order_an_empty_one_clearing():
    unit = '[Service]\nEnvironment=A=1 "B=two words"\nEnvironment=C=3\nExecStart=/bin/true\n'
    assert parse_environment_directives([unit]) == {"A": "1", "B": "two words", "C": "3"}
    drop_in = "[Service]\nEnvironment=A=9\n"
    assert parse_environment_directives([unit, drop_in]) == {"A": "9", "B": "two words", "C": "3"}
    assert parse_environment_directives([unit, "[Service]\nEnvironment=\nEnvironment=D=4\n"]) == {"D": "4"}


def test_environment_property():
    assert parse_environment_assignments('"A=b c" CUDA_VISIBLE_DEVICES=0,1 NOVALUE\n') == {
        "A": "b c",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }


def test_environment_files_property():
    text = "/etc/vllm/tiny.env (ignore_errors=no)\n/etc/vllm/my env (ignore_errors=yes)\n"
    assert parse_environment_files_property(text) == [("/etc/vllm/tiny.env", False), ("/etc/vllm/my env", True)]
    assert parse_environment_files_property("") == []
