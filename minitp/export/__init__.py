"""Out of minitp and into it: a checkpoint as a transformers model, and back.

* `convert`: `to_hf` (a checkpoint at any layout -> ``config.json`` + ``model.safetensors``)
  and `from_hf` (such a directory -> a dense minitp checkpoint);
* `mapping`: the tensors' orders on each side (fused qkv, interleaved SwiGLU, Conv1D);
* `hf_config`: GPTConfig <-> GPT2Config / LlamaConfig, and what neither can express;
* ``python -m minitp.export``: the command line (docs/export.md).
"""

from .convert import from_hf, read_hf, to_hf

__all__ = ["from_hf", "read_hf", "to_hf"]
