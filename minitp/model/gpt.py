"""A plain GPT on one device: the reference every parallel version must equal.

No distributed code lives here. `minitp.parallelize` reads this model and
builds each rank's shard from its weights, following a plan table; the tests
then check that the two compute the same function, loss and gradients.

One forward serves every way of running the model. Each step of it is a module
— token embedding, a vision-language model's image (`minitp.model.vision`), positions,
dropout, blocks, final LayerNorm, output head, loss — so parallelism is applied
by *replacing modules*, never by a second forward: tensor parallelism swaps in
sharded ones (`minitp.tensor_parallel`), and a pipeline stage that lacks the
embedding or the head holds a pass-through in its place (`minitp.pipeline`), as picotron does.

Two layout choices make the sharding a plain slice:
* the attention projection's output features are ordered (head, q/k/v, head_dim),
  so a contiguous block of them is a set of whole heads with their q, k and v —
  a column split of this projection *is* a split by heads;
* the attention core (scores, softmax, dropout, ·V) is its own module, so that
  selective recomputation and the activation ledger can name it.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..rules import check_packing, check_positions, check_token_ids
from .attention_core import ATTENTIONS, AttentionCore
from .config import GPTConfig
from .cross_entropy import CrossEntropy
from .kv_cache import cache_start
from .llama_layers import GroupedQueryAttention, NoPositions, SwiGLU, dropped, norm
from .mla import LatentAttention
from .moe import MoE
from .vision import NoVision, VisionPrefix

__all__ = ["ATTENTIONS", "GPT", "AttentionCore", "Block", "CausalSelfAttention", "CrossEntropy",
           "GPTConfig", "MLP", "TiedOutput"]


def packed(positions) -> dict:
    """The keyword a module that may mask by document takes: none for an unpacked batch,
    so a replacement module written without packing (a lab's, an exercise's) still runs."""
    return {} if positions is None else {"positions": positions}


class CausalSelfAttention(nn.Module):
    kv_cache = None  # a LayerCache while a KVCache is bound (`minitp.model.kv_cache`)

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        # Output features ordered (head, q/k/v, head_dim): see the module docstring.
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.core = AttentionCore(cfg.dropout, cfg.attention, cfg.causal)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, positions=None):  # positions: packed documents' (attention_core)
        qkv = self.qkv(x)  # (B, T, 3C') with C' the features this module holds
        B, T, _ = qkv.shape  # read here: a sequence-parallel x holds only T/t positions
        heads = qkv.shape[-1] // (3 * self.head_dim)  # all heads here; a shard holds fewer
        qkv = qkv.view(B, T, heads, 3, self.head_dim)  # (B, T, nh, 3, hs)
        q, k, v = qkv.permute(3, 0, 2, 1, 4).unbind(0)  # each (B, nh, T, hs)
        if self.kv_cache is not None:  # decoding: K, V of every position so far
            k, v = self.kv_cache.append(k, v)
        y = self.core(q, k, v, **packed(positions))  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, heads * self.head_dim)  # (B, T, C')
        return dropped(self.dropout, self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.ffn_width, bias=cfg.bias)
        self.proj = nn.Linear(cfg.ffn_width, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)
        # exact (erf) GELU, or GPT-2's tanh form (an imported GPT-2's: `minitp.export`)
        self.approximate = "tanh" if cfg.activation == "gelu_tanh" else "none"

    def forward(self, x):  # (B, T, C)
        h = F.gelu(self.fc(x), approximate=self.approximate)
        return dropped(self.dropout, self.proj(h))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig, moe: bool = False):
        super().__init__()
        self.ln1 = norm(cfg)
        if cfg.kv_lora_rank:  # multi-head latent attention (`GPTConfig.mla`)
            self.attn = LatentAttention(cfg)
        elif cfg.n_kv_head is not None:
            self.attn = GroupedQueryAttention(cfg)
        else:
            self.attn = CausalSelfAttention(cfg)
        self.ln2 = norm(cfg)
        # a mixture of experts in the MLP's place (`minitp.model.moe`), same name: the block's
        # forward does not change
        dense = SwiGLU if cfg.mlp == "swiglu" else MLP
        self.mlp = MoE(cfg, MLP(cfg) if cfg.shared_expert else None) if moe else dense(cfg)

    def forward(self, x, positions=None):
        x = x + self.attn(self.ln1(x), **packed(positions))
        return x + self.mlp(self.ln2(x))


class LearnedPositions(nn.Embedding):
    """Adds a learned vector for each position 0..T−1 to the token embeddings — or, for
    packed documents, for each token's `positions` (B, T) in its document.

    An `nn.Embedding` (same weight, same initialisation) whose forward takes the
    token embeddings (B, T, C) rather than position ids, so that a stage or a
    shard can replace it as a whole. With a KV cache bound, the tokens are at positions
    length..length+T−1 of the cache."""

    kv_cache = None  # layer 0's LayerCache while a KVCache is bound

    def forward(self, x, positions=None):  # (B, T, C)
        start, T = cache_start(self), x.shape[1]
        if start + T > self.num_embeddings:
            raise ValueError(f"sequence of {start + T} tokens is longer than "
                             f"seq_len={self.num_embeddings}")
        if positions is not None:
            return x + self.weight[positions.to(x.device)]  # (B, T, C)
        return x + self.weight[start:start + T]  # (T, C) broadcast over the batch


class TiedOutput(nn.Module):
    """logits = x · Eᵀ, E the token embedding's weight (tied, as GPT-2 and Megatron-LM).

    The weight belongs to the embedding module; this module only points at it
    (kept out of the module tree, so the parameter is owned, counted and saved
    once, under ``wte.weight``)."""

    def __init__(self, embedding: nn.Module):
        super().__init__()
        object.__setattr__(self, "embedding", embedding)  # a reference, not a child

    @property
    def weight(self) -> torch.Tensor:
        return self.embedding.weight

    def forward(self, x):  # (B, T, C) -> (B, T, V)
        return x @ self.weight.T


class GPT(nn.Module):
    """Token and position embeddings, n_layer blocks, a final LayerNorm, and the
    output projection tied to the token embedding (as GPT-2 and Megatron-LM)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.vision = VisionPrefix(cfg, Block) if cfg.vision_patches else NoVision()
        self.wpe = (LearnedPositions(cfg.seq_len, cfg.d_model) if cfg.positions == "learned"
                    else NoPositions())
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, cfg.is_moe_layer(i)) for i in range(cfg.n_layer))
        self.ln_f = norm(cfg)
        self.head = TiedOutput(self.wte)
        self.loss = CrossEntropy(cfg.vocab_size, cfg.d_model)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, inputs, targets=None, positions=None):
        """inputs: token ids (B, T) — or, on a later pipeline stage, the previous
        stage's activations, which the embedding steps (pass-throughs there) leave
        as they are. positions: packed documents (`minitp.data.packing`), (B, T) each
        token's position in its document — the whole sequence's, even where a rank
        holds part of it (each parallel piece takes its part); None: one sequence a row.
        Returns (logits, loss); loss is None without targets."""
        if not inputs.is_floating_point():  # ids, not activations: the rule every model keeps
            check_token_ids(inputs, self.cfg.vocab_size, "input id")
        if positions is not None:
            check_packing(self.cfg.vision_patches)
            check_positions(positions, self.cfg.seq_len)
        x = self.vision(self.wte(inputs), inputs)  # an image's tokens first, if any
        x = dropped(self.dropout, self.wpe(x, **packed(positions)))  # (B, T, C)
        for block in self.blocks:
            x = block(x, **packed(positions))
        logits = self.head(self.ln_f(x))  # (B, T, V)
        loss = None if targets is None else self.loss(logits, targets)
        return logits, loss

    def num_parameters(self) -> int:
        """Every parameter once (the tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())
