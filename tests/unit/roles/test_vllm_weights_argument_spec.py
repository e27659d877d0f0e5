"""The vllm_weights role's argument spec: in step with its defaults, and refusing what its types and choices
rule out, through the validator Ansible itself runs on a role's inputs (the rest the module refuses)."""

from pathlib import Path

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

ROLE = Path(__file__).resolve().parents[3] / "roles" / "vllm_weights"
SPECS = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
ENTRY = {"name": "tiny", "source": {"kind": "generated"}}


def test_every_default_is_declared_and_every_declared_input_has_a_default():
    assert set(SPECS["main"]["options"]) == set(DEFAULTS)
    # The preflight declares what the check reads: no fetch, no interpreter of the venv.
    assert set(SPECS["preflight"]["options"]) == set(DEFAULTS) - {
        "vllm_weights_python", "vllm_weights_python_found", "vllm_weights_hub_client", "vllm_weights_progress_interval",
        "vllm_weights_fetch_timeout",
    }  # fmt: skip


def test_the_declared_defaults_are_the_role_defaults_where_they_are_plain_values():
    validated = ArgumentSpecValidator(SPECS["main"]["options"]).validate({"vllm_weights_model": ENTRY})
    assert validated.error_messages == []
    for name, value in DEFAULTS.items():
        if not (isinstance(value, str) and "{{" in value) and name != "vllm_weights_model":
            assert validated.validated_parameters[name] == value, name


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"vllm_weights_hub_client": "wget"}, "value of vllm_weights_hub_client must be one of: auto, huggingface_hub"),
        ({"vllm_weights_workers": "many"}, "argument 'vllm_weights_workers' is of type str and we were unable"),
        ({"vllm_weights_margin": "lots"}, "argument 'vllm_weights_margin' is of type str and we were unable"),
        ({"vllm_weights_model": "tiny"}, "argument 'vllm_weights_model' is of type str and we were unable"),
    ],
    ids=["client", "workers", "margin", "model"],
)
def test_inputs_of_the_wrong_type_or_choice_are_refused(inputs, message):
    messages = ArgumentSpecValidator(SPECS["main"]["options"]).validate({"vllm_weights_model": ENTRY, **inputs})
    assert any(message in error for error in messages.error_messages), messages.error_messages
