# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A tiny random Llama checkpoint that vLLM serves like any other: config, tokenizer, safetensors.

The shapes and configs are pure functions of the parameters. Training the tokenizer and writing the
weights need `tokenizers`, `numpy` and `safetensors`, which every vLLM install brings: the module runs
them with the vLLM venv's interpreter.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

MANIFEST_NAME = ".llmops-tiny-model.json"
SPECIAL_TOKENS = ("<s>", "</s>", "<unk>")
# Roles in a chat are marked the same way in the template and the tokenizer's training text.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Training text for the byte-level BPE: enough distinct words for a few hundred merges, deterministic.
TRAINING_TEXT = """
An inference server loads the weights of a language model onto its accelerators and answers requests
over HTTP. Operators deploy the server under systemd, benchmark it at several levels of concurrency,
and swap one model for another when a better one appears. Each step has a failure that costs hours:
a layout that does not divide the attention heads, a download that does not fit on the disk, a stop
that hangs because a worker ignores its signal, or memory that stays allocated after the process exits.
The tokenizer splits text into pieces, the model predicts the next piece, and the server streams every
piece back to the client as soon as it is sampled. Time to first token, time per output token, and the
inter-token latency describe how fast the answer arrives; throughput says how many tokens per second the
whole server produces for all clients together. The quick brown fox jumps over the lazy dog while the
system user, the assistant, and the tool exchange messages about tensors, experts, pipelines, and data.
Zero one two three four five six seven eight nine ten hundred thousand million billion trillion.
"""


class TinyModelError(ValueError):
    """Parameters that do not make a valid Llama."""


def check_shape(params):
    """Refuse parameters that vLLM could not load; return the head dimension."""
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "max_position_embeddings",
    ):
        if params[key] < 1:
            raise TinyModelError(f"{key} must be at least 1, got {params[key]}")
    if params["hidden_size"] % params["num_attention_heads"]:
        raise TinyModelError(
            f"hidden_size {params['hidden_size']} is not divisible by "
            f"num_attention_heads {params['num_attention_heads']}"
        )
    if params["num_attention_heads"] % params["num_key_value_heads"]:
        raise TinyModelError(
            f"num_attention_heads {params['num_attention_heads']} is not a multiple of "
            f"num_key_value_heads {params['num_key_value_heads']}"
        )
    if params["vocab_size"] < 256 + len(SPECIAL_TOKENS):
        raise TinyModelError(f"vocab_size must hold the 256 bytes and {len(SPECIAL_TOKENS)} special tokens")
    # numpy's generator takes seeds of 0 to 2**32 - 1.
    if not 0 <= params["seed"] < 2**32:
        raise TinyModelError(f"seed must be from 0 to {2**32 - 1}, got {params['seed']}")
    return params["hidden_size"] // params["num_attention_heads"]


def llama_config(params, vocab_size, special_token_ids):
    """config.json of a LlamaForCausalLM with the given shape and the tokenizer's real vocabulary size."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": params["hidden_size"],
        "intermediate_size": params["intermediate_size"],
        "num_hidden_layers": params["num_hidden_layers"],
        "num_attention_heads": params["num_attention_heads"],
        "num_key_value_heads": params["num_key_value_heads"],
        "head_dim": params["hidden_size"] // params["num_attention_heads"],
        "max_position_embeddings": params["max_position_embeddings"],
        "vocab_size": vocab_size,
        "bos_token_id": special_token_ids["<s>"],
        "eos_token_id": special_token_ids["</s>"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": params["dtype"],
    }


def tokenizer_config(max_length):
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": max_length,
        "chat_template": CHAT_TEMPLATE,
    }


def weight_shapes(params, vocab_size):
    """Name -> shape of every tensor of the Llama, as Hugging Face names them."""
    hidden = params["hidden_size"]
    head_dim = hidden // params["num_attention_heads"]
    kv_width = params["num_key_value_heads"] * head_dim
    intermediate = params["intermediate_size"]
    shapes = {
        "model.embed_tokens.weight": (vocab_size, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab_size, hidden),
    }
    for layer in range(params["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        shapes.update(
            {
                prefix + "input_layernorm.weight": (hidden,),
                prefix + "post_attention_layernorm.weight": (hidden,),
                prefix + "self_attn.q_proj.weight": (params["num_attention_heads"] * head_dim, hidden),
                prefix + "self_attn.k_proj.weight": (kv_width, hidden),
                prefix + "self_attn.v_proj.weight": (kv_width, hidden),
                prefix + "self_attn.o_proj.weight": (hidden, params["num_attention_heads"] * head_dim),
                prefix + "mlp.gate_proj.weight": (intermediate, hidden),
                prefix + "mlp.up_proj.weight": (intermediate, hidden),
                prefix + "mlp.down_proj.weight": (hidden, intermediate),
            }
        )
    return shapes


def parameter_count(shapes):
    count = 0
    for shape in shapes.values():
        size = 1
        for dimension in shape:
            size *= dimension
        count += size
    return count


def file_digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(directory):
    try:
        with open(os.path.join(directory, MANIFEST_NAME), encoding="utf-8") as stream:
            return json.load(stream)
    except (OSError, ValueError):
        return None


def is_intact(directory, manifest, params):
    """True when the manifest was written for these parameters and every file still has its digest."""
    if not manifest or manifest.get("params") != params:
        return False
    for name, digest in manifest.get("files", {}).items():
        path = os.path.join(directory, name)
        if not os.path.isfile(path) or file_digest(path) != digest:
            return False
    return bool(manifest.get("files"))


def train_tokenizer(vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = TRAINING_TEXT.strip().splitlines()
    chat_lines = [f"<|{role}|>" for role in ("system", "user", "assistant", "tool")]
    tokenizer.train_from_iterator(lines + chat_lines, trainer)
    return tokenizer


def random_weights(shapes, seed):
    import numpy

    generator = numpy.random.default_rng(seed)
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensors[name] = numpy.ones(shape, dtype=numpy.float32)
        else:
            tensors[name] = (generator.standard_normal(shape, dtype=numpy.float32) * 0.02).astype(numpy.float32)
    return tensors


def _write_atomically(directory, name, write):
    """Write through a temporary file in the same directory, so a reader never sees half a file."""
    descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
    os.close(descriptor)
    try:
        write(temporary)
        os.chmod(temporary, 0o644)
        os.replace(temporary, os.path.join(directory, name))
    except BaseException:
        os.unlink(temporary)
        raise


def _write_json(data):
    def write(path):
        with open(path, "w", encoding="utf-8") as stream:
            json.dump(data, stream, indent=2, sort_keys=True)
            stream.write("\n")

    return write


def generate(directory, params):
    """Write the checkpoint into `directory`; the manifest goes last, so only a whole checkpoint has one."""
    from safetensors.numpy import save_file

    os.makedirs(directory, mode=0o755, exist_ok=True)
    manifest_path = os.path.join(directory, MANIFEST_NAME)
    if os.path.exists(manifest_path):
        os.unlink(manifest_path)
    tokenizer = train_tokenizer(params["vocab_size"])
    vocab_size = tokenizer.get_vocab_size()
    special_token_ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    config = llama_config(params, vocab_size, special_token_ids)
    shapes = weight_shapes(params, vocab_size)
    files = {
        "config.json": _write_json(config),
        "tokenizer_config.json": _write_json(tokenizer_config(params["max_position_embeddings"])),
        "special_tokens_map.json": _write_json({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
        "tokenizer.json": tokenizer.save,
    }
    if params["weights"]:
        tensors = random_weights(shapes, params["seed"])
        files["model.safetensors"] = lambda path: save_file(tensors, path, metadata={"format": "pt"})
    elif os.path.exists(os.path.join(directory, "model.safetensors")):
        # Without weights vLLM runs with --load-format dummy; a stale file would contradict the manifest.
        os.unlink(os.path.join(directory, "model.safetensors"))
    for name, write in files.items():
        _write_atomically(directory, name, write)
    manifest = {"params": params, "files": {name: file_digest(os.path.join(directory, name)) for name in files}}
    _write_atomically(directory, MANIFEST_NAME, _write_json(manifest))
    return {"config": config, "num_parameters": parameter_count(shapes)}
