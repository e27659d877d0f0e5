#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: tiny_model
short_description: Write a tiny random Llama checkpoint that vLLM can serve
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Writes C(config.json), a byte-level BPE tokenizer trained on the host (C(tokenizer.json),
    C(tokenizer_config.json) with a chat template), and random weights in C(model.safetensors).
  - The checkpoint needs no download, so a host without network access, or a test, serves a real model
    through the real vLLM loading path. Its answers are noise.
  - A manifest records the parameters and each file's SHA-256; the module changes nothing while they match.
  - Needs the Python packages C(tokenizers), C(numpy) and C(safetensors), which every vLLM install brings,
    so run the module with the vLLM venv's interpreter (see the examples).
extends_documentation_fragment:
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  idempotent:
    support: full
options:
  path:
    description: Directory of the checkpoint, an absolute path; created when missing.
    type: path
    required: true
  vocab_size:
    description:
      - Vocabulary size that the tokenizer is trained up to. The training text may give fewer tokens;
        the config takes the tokenizer's real size.
    type: int
    default: 512
  hidden_size:
    description: Width of the model. vLLM's CPU attention needs a head dimension (hidden size / heads) of 64 or more.
    type: int
    default: 256
  intermediate_size:
    description: Width of each MLP.
    type: int
    default: 512
  num_hidden_layers:
    description: Number of decoder layers.
    type: int
    default: 2
  num_attention_heads:
    description: Attention heads; must divide O(hidden_size).
    type: int
    default: 4
  num_key_value_heads:
    description: Key/value heads (grouped-query attention); must divide O(num_attention_heads).
    type: int
    default: 2
  max_position_embeddings:
    description: Longest context the model accepts.
    type: int
    default: 4096
  dtype:
    description: The C(torch_dtype) written to the config; vLLM serves in it unless told otherwise.
    type: str
    choices: [bfloat16, float16, float32]
    default: bfloat16
  weights:
    description:
      - Write random weights to C(model.safetensors).
      - With V(false), no weights are written and the server must use C(--load-format dummy).
    type: bool
    default: true
  seed:
    description: Seed of the random weights, from 0 to 2**32 - 1, so two hosts get the same checkpoint.
    type: int
    default: 0
"""

EXAMPLES = r"""
- name: Write the tiny model with the interpreter of the vLLM venv
  llmops.vllm.tiny_model:
    path: /var/lib/vllm/models/tiny
  vars:
    ansible_python_interpreter: /opt/vllm/venv/bin/python

- name: A wider variant, config and tokenizer only (serve it with --load-format dummy)
  llmops.vllm.tiny_model:
    path: /var/lib/vllm/models/tiny-wide
    hidden_size: 512
    num_attention_heads: 8
    num_key_value_heads: 2
    weights: false
  vars:
    ansible_python_interpreter: /opt/vllm/venv/bin/python
"""

RETURN = r"""
path:
  description: The checkpoint's directory.
  returned: always
  type: str
  sample: /var/lib/vllm/models/tiny
files:
  description: Files of the checkpoint, with their SHA-256, as the manifest records them.
  returned: always
  type: dict
  sample: {"config.json": "9f2c...", "model.safetensors": "51ab..."}
config:
  description: The model's config.json.
  returned: when changed and not in check mode
  type: dict
  sample: {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "vocab_size": 512}
num_parameters:
  description: Number of parameters of the model.
  returned: when changed and not in check mode
  type: int
  sample: 1180928
"""

import os
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.llmops.vllm.plugins.module_utils.weights.tiny_model import (
    TinyModelError,
    check_shape,
    generate,
    is_intact,
    read_manifest,
)

try:
    import numpy  # noqa: F401  pylint: disable=unused-import
    import safetensors  # noqa: F401  pylint: disable=unused-import
    import tokenizers  # noqa: F401  pylint: disable=unused-import
except ImportError:
    LIBRARY_IMPORT_ERROR = traceback.format_exc()
else:
    LIBRARY_IMPORT_ERROR = None

SHAPE_OPTIONS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "vocab_size": {"type": "int", "default": 512},
            "hidden_size": {"type": "int", "default": 256},
            "intermediate_size": {"type": "int", "default": 512},
            "num_hidden_layers": {"type": "int", "default": 2},
            "num_attention_heads": {"type": "int", "default": 4},
            "num_key_value_heads": {"type": "int", "default": 2, "no_log": False},
            "max_position_embeddings": {"type": "int", "default": 4096},
            "dtype": {"type": "str", "default": "bfloat16", "choices": ["bfloat16", "float16", "float32"]},
            "weights": {"type": "bool", "default": True},
            "seed": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    params = {key: module.params[key] for key in (*SHAPE_OPTIONS, "dtype", "weights", "seed")}
    if not os.path.isabs(path):
        module.fail_json(msg=f"path must be an absolute directory, got {path!r}")
    try:
        check_shape(params)
    except TinyModelError as error:
        module.fail_json(msg=f"Cannot write a tiny Llama with these parameters: {error}")

    manifest = read_manifest(path)
    if is_intact(path, manifest, params):
        module.exit_json(changed=False, path=path, files=manifest["files"])

    diff = {
        "before": {"params": (manifest or {}).get("params")},
        "after": {"params": params},
        "before_header": f"{path} (manifest)",
        "after_header": f"{path} (manifest)",
    }
    if module.check_mode:
        module.exit_json(changed=True, path=path, files={}, diff=diff)
    if LIBRARY_IMPORT_ERROR:
        module.fail_json(
            msg=missing_required_lib("tokenizers, numpy and safetensors")
            + " Run this module with the interpreter of the vLLM venv (ansible_python_interpreter), which has them.",
            exception=LIBRARY_IMPORT_ERROR,
        )
    try:
        written = generate(path, params)
    except OSError as error:
        module.fail_json(msg=f"Cannot write the tiny model to {path}: {error}")
    module.exit_json(changed=True, path=path, files=read_manifest(path)["files"], diff=diff, **written)


if __name__ == "__main__":
    main()
