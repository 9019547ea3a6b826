"""minitp checkpoint -> a transformers directory (``config.json`` + ``model.safetensors``),
and back.

`to_hf` reads a checkpoint saved at any layout, dense or sharded, whole in this one
process (`minitp.checkpoint.load_dense`: the plain GPT, no process group), maps its
tensors (`mapping`) and writes them. `from_hf` reads such a directory (one
``model.safetensors``, or the shards a ``model.safetensors.index.json`` lists) and writes
a dense minitp checkpoint without optimizer state (`minitp.checkpoint.files`), which
`mt.checkpoint.load` then loads at any layout. Only safetensors are read: a
``pytorch_model.bin`` is a pickle, and importing a model must not run its code.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import torch

from .. import checkpoint
from ..checkpoint.files import FORMAT, write_checkpoint
from ..model import GPTConfig
from . import hf_config, mapping
from .hf_config import refuse

WEIGHTS, INDEX, CONFIG = "model.safetensors", "model.safetensors.index.json", "config.json"
# what an HF checkpoint may hold beside the weights: GPT-2's causal-mask buffers, old
# Llamas' RoPE frequencies (computed, not learned)
IGNORED = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")


def _safetensors():
    try:
        import safetensors.torch
    except ImportError:
        refuse("reading and writing model.safetensors needs the safetensors package "
               "(pip install safetensors)")
    return safetensors.torch


def to_hf(load: str, out: str) -> dict:
    """Write the checkpoint `load` (a directory `--load` accepts) as transformers' files
    in `out`. Returns what was written: {"kind", "dtype", "parameters", "files"}."""
    path = checkpoint.resolve(load)
    model, _, _ = checkpoint.load_dense(path)
    cfg = model.cfg
    kind = hf_config.check_exportable(cfg)
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    dtype = str(sd["wte.weight"].dtype).removeprefix("torch.")
    tensors = mapping.TO_HF[kind](cfg, sd)
    if os.path.exists(out) and not os.path.isdir(out):
        refuse(f"{out!r} exists and is not a directory")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, CONFIG), "w") as f:
        json.dump(hf_config.to_hf_config(cfg, dtype), f, indent=1)
    _safetensors().save_file(tensors, os.path.join(out, WEIGHTS), metadata={"format": "pt"})
    return {"kind": kind, "dtype": dtype, "parameters": model.num_parameters(),
            "files": [CONFIG, WEIGHTS], "source": path}


def read_hf(directory: str) -> tuple[dict, dict]:
    """(config.json parsed, {name: tensor}) of a transformers directory; one-line errors."""
    if not os.path.isdir(directory):
        refuse(f"{directory!r}: no such directory")
    config = os.path.join(directory, CONFIG)
    if not os.path.isfile(config):
        refuse(f"{directory!r} has no {CONFIG}: not a transformers model directory")
    with open(config) as f:
        try:
            hf = json.load(f)
        except json.JSONDecodeError as exc:
            refuse(f"{config} is not JSON ({exc})")
    if os.path.isfile(os.path.join(directory, INDEX)):
        with open(os.path.join(directory, INDEX)) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.isfile(os.path.join(directory, WEIGHTS)):
        files = [WEIGHTS]
    else:
        refuse(f"{directory!r} has no {WEIGHTS} (nor {INDEX}); minitp reads safetensors only "
               "(a pytorch_model.bin is a pickle: loading it could run code)")
    tensors = {}
    for name in files:
        if os.path.basename(name) != name:  # an index naming a file outside the directory
            refuse(f"{INDEX} names {name!r}, outside {directory!r}")
        tensors.update(_safetensors().load_file(os.path.join(directory, name)))
    return hf, tensors


def from_hf(directory: str, out: str) -> dict:
    """Write the transformers model in `directory` as a dense minitp checkpoint in `out`.
    Returns {"kind", "dtype", "parameters", "config"}."""
    hf, tensors = read_hf(directory)
    try:
        cfg = hf_config.from_hf_config(hf)
    except KeyError as exc:
        refuse(f"{directory!r}: its {CONFIG} lacks {exc.args[0]!r}")
    kind = hf["model_type"]
    tensors = {k: v for k, v in tensors.items() if not k.endswith(IGNORED)}
    head = tensors.pop("lm_head.weight", None)
    try:
        weights = mapping.FROM_HF[kind](cfg, tensors)
    except KeyError as exc:
        refuse(f"{directory!r}: the {kind} model lacks the tensor {exc.args[0]!r}")
    if head is not None and not torch.equal(head, weights["wte.weight"]):
        refuse(f"{directory!r}: its lm_head is not its token embedding (untied), and minitp's "
               "output head is the embedding (tied)")
    _check_shapes(cfg, weights, directory)
    dtype = str(weights["wte.weight"].dtype).removeprefix("torch.")
    meta = {"format": FORMAT, "config": asdict(cfg), "step": 0, "dtype": dtype,
            "topology": {"dp": 1, "pp": 1, "cp": 1, "tp": 1, "ep": 1, "zero_stage": 0},
            "has_optimizer": False, "extra": {"imported_from": f"transformers {kind}"}}
    write_checkpoint(out, weights, None, meta)
    return {"kind": kind, "dtype": dtype, "config": cfg,
            "parameters": sum(t.numel() for t in weights.values())}


def _check_shapes(cfg: GPTConfig, weights: dict, directory: str) -> None:
    """Every tensor the model needs, of its shape, and nothing else (a config that does not
    describe its own weights is refused here, not by the first forward)."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        from ..model import GPT
        expected = {k: tuple(v.shape) for k, v in GPT(cfg).state_dict().items()}
    got = {k: tuple(v.shape) for k, v in weights.items()}
    if got != expected:
        odd = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
        refuse(f"{directory!r}: its tensors do not fit its config.json (first: {odd[0]} is "
               f"{got.get(odd[0])}, the config makes {expected.get(odd[0])})")
