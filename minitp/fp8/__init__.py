"""FP8 training, emulated exactly: scaled 8-bit casts around each block's GEMMs.

* `formats`: e4m3 and e5m2, the scaled cast (quantize-dequantize) in the run's dtype;
* `scaling`: tensorwise, delayed (an amax history) and rowwise scales, each amax reduced
  over the axes that split its tensor (the rule: `minitp.rules.fp8_groups`);
* `casts`: a linear layer's casts as autograd Functions (`LayerScales`): TransformerEngine's
  HYBRID recipe (tensorwise, delayed), torchao's ROWWISE (its backward cast again);
* `convert`: the one-process FP8 model (`convert(gpt, "tensorwise")`);
* `apply`: the same on a parallel model (`mt.parallelize(..., fp8=…)` calls it);
* `reference`: the one-process FP8 step every mesh equals (its microbatches);
* `blocks`: Blackwell's block-scaled casts, MXFP8 (e8m0 scales, blocks of 32 e4m3) and NVFP4
  (e4m3 scales, blocks of 16 e2m1, a tensor scale), recipes ``"mxfp8"`` and ``"nvfp4"``;
* `block_shards`: a ZeRO-3 shard boundary (or a tp split) inside a block, and block-atomic
  shards.
"""

from ..rules.fp8_groups import ROLES, SCALINGS, amax_axes, amax_table
from . import block_shards
from .apply import amax_groups, apply_fp8
from .blocks import BLOCKS, block_quantize
from .casts import LayerScales
from .convert import Fp8Linear, convert, fp8_layers
from .formats import E4M3, E5M2, FORMATS, quantize, representable, scale_from_amax
from .reference import accumulate, one_process_microbatches, reference_step
from .scaling import DEFAULT_HISTORY, TensorScale

__all__ = ["BLOCKS", "DEFAULT_HISTORY", "E4M3", "E5M2", "FORMATS", "ROLES", "SCALINGS",
           "Fp8Linear", "LayerScales", "TensorScale", "accumulate", "amax_axes", "amax_groups",
           "amax_table", "apply_fp8", "block_quantize", "block_shards", "convert", "fp8_layers",
           "one_process_microbatches", "quantize", "reference_step", "representable",
           "scale_from_amax"]
