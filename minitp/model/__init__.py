"""The plain model on one device: no parallel code, ever (`minitp.parallelize` splits it).

* `gpt`: the GPT, one forward, every step a module;
* `config`: `GPTConfig`, the sizes and the parts (GPT-2's, or `GPTConfig.llama`'s);
* `cross_entropy`: the next-token loss, chunk by chunk over tokens;
* `attention_core`: softmax(QKᵀ/√d + mask)·V, a module of its own;
* `llama_layers`: RMSNorm, rotary positions, grouped-query attention, SwiGLU;
* `mla`: multi-head latent attention (`GPTConfig.mla`): a K/V latent, decoupled RoPE;
* `moe`, `routing`, `expert_mlps`: the mixture of experts (layer, router, experts' MLPs);
* `vision`: a vision-language model's encoder and projector.
"""

from .attention_core import ATTENTIONS, AttentionCore
from .config import GPTConfig
from .cross_entropy import CrossEntropy, chunked_cross_entropy
from .gpt import GPT, MLP, Block, CausalSelfAttention, LearnedPositions, TiedOutput

__all__ = ["ATTENTIONS", "GPT", "AttentionCore", "Block", "CausalSelfAttention", "CrossEntropy",
           "GPTConfig", "LearnedPositions", "MLP", "TiedOutput", "chunked_cross_entropy"]
