"""Serving: generation through a KV cache on one device, over tensor ranks and over
pipeline stages.

* `sampling`: the next token from logits, and the seed rule every layout keeps;
* `decode`: `Decoder` (a growing sequence fed to a cached model, the window rule) and
  `generate` (prefill, then decode, timed apart);
* `tp`: each rank its heads and their cache; the logits all-gathered;
* `pp`: prefill as microbatches through the stages, decode with several groups of
  sequences in flight; the bubble measured beside its model;
* `throughput`: tokens per second against batch size and tp, measured;
* `cache_bytes`: a rank's KV cache bytes, read from its tensors (MLA's latent: whole per rank);
* `refit`: a trained model's weights moved live onto the serving layout;
* `parity`: the generator's log-probabilities (and a mixture's routing) beside the
  trainer's.
"""

from .decode import Decoder, Generation, generate
from .parity import generator_logprobs, logprob_parity, routing_flips, token_logprobs
from .pp import PipelineGeneration, bubble_model, pipeline_bubble, pp_generate
from .refit import Refit, RefitReport, refit
from .sampling import draw, generator
from .throughput import decode_throughput
from .tp import per_token_collectives, tp_generate, tp_model, vocab_gather

__all__ = ["Decoder", "Generation", "PipelineGeneration", "Refit", "RefitReport", "bubble_model",
           "decode_throughput", "draw", "generate", "generator", "generator_logprobs",
           "logprob_parity", "per_token_collectives", "pipeline_bubble", "pp_generate", "refit",
           "routing_flips", "token_logprobs", "tp_generate", "tp_model", "vocab_gather"]
