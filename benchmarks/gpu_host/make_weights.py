# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Give a weightless Llama directory (the GPU bundle's 1.1B: config and tokenizer) real random weights.

Writes DST: the files of SRC and model.safetensors, random bf16 tensors of the shapes config.json gives (normal,
std 0.02; norms at one), drawn on the GPU when there is one. vLLM then loads real weights from disk instead of
filling them (--load-format dummy), so a load reads 2.2 GB as a real model's does. A DST already written for the
same config is left alone (a second run changes nothing).

usage: python3 make_weights.py SRC DST
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from session_unit import import_collection

import_collection()

from ansible_collections.llmops.vllm.plugins.module_utils.weights.tiny_model import (  # noqa: E402
    parameter_count,
    weight_shapes,
)

WEIGHTS = "model.safetensors"
MARK = ".llmops-random-weights.json"


def main():
    source, target = (Path(arg) for arg in sys.argv[1:3])
    config = json.loads((source / "config.json").read_text())
    fingerprint = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    mark = target / MARK
    if mark.exists() and json.loads(mark.read_text()).get("config") == fingerprint and (target / WEIGHTS).exists():
        print(f"{target} already has random weights for this config")
        return
    started = time.monotonic()
    target.mkdir(parents=True, exist_ok=True)
    target.chmod(0o755)
    for path in source.iterdir():
        if path.is_file():
            shutil.copyfile(path, target / path.name)
    shapes = weight_shapes(config, config["vocab_size"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(0)
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            drawn = torch.randn(shape, generator=generator, device=device, dtype=torch.float32) * 0.02
            tensors[name] = drawn.to(torch.bfloat16).cpu()
    drawn_s = time.monotonic() - started
    save_file(tensors, str(target / WEIGHTS), metadata={"format": "pt"})
    for path in target.iterdir():
        path.chmod(0o644)
    mark.write_text(json.dumps({"config": fingerprint, "parameters": parameter_count(shapes)}) + "\n")
    size = (target / WEIGHTS).stat().st_size
    print(
        f"wrote {target / WEIGHTS}: {parameter_count(shapes) / 1e9:.2f}B parameters, {size / 2**30:.2f} GiB, "
        f"drawn on {device} in {drawn_s:.1f} s, written in {time.monotonic() - started - drawn_s:.1f} s"
    )


if __name__ == "__main__":
    main()
