"""A plain GPT on one device: the reference every parallel version must equal.

No distributed code lives here. `minitp.parallelize` reads this model and
builds each rank's shard from its weights, following a plan table; the tests
then check that the two compute the same function, loss and gradients.

One forward serves every way of running the model. Each step of it is a module
— token embedding, positions, dropout, blocks, final LayerNorm, output head,
loss — so parallelism is applied by *replacing modules*, never by a second
forward: tensor parallelism swaps in sharded ones (`minitp.tensor_parallel`),
and a pipeline stage that lacks the embedding or the head holds a pass-through
in its place (`minitp.pipeline`), as picotron does.

Two layout choices make the sharding a plain slice:
* the attention projection's output features are ordered (head, q/k/v, head_dim),
  so a contiguous block of them is a set of whole heads with their q, k and v —
  a column split of this projection *is* a split by heads;
* the attention core (scores, softmax, dropout, ·V) is its own module, so that
  selective recomputation and the activation ledger can name it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .mixed_precision import loss_precision
from .moe import MoE
from .moe_rules import check_moe_config
from .rules import IGNORE_INDEX, check_positive_int, check_token_ids

ATTENTIONS = ("math", "sdpa")  # how AttentionCore computes: see its docstring


@dataclass
class GPTConfig:
    vocab_size: int = 256  # byte-level tokens: every text is already tokenised
    seq_len: int = 64  # the context length; learned positions are made for exactly this many
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads; tensor parallelism splits them, so tp must divide this
    d_model: int = 64  # hidden size h; the MLP is 4h wide, as in GPT-2 and Megatron-LM
    dropout: float = 0.0  # on embeddings, attention probabilities and both residual branches
    bias: bool = True  # biases in Linear layers and LayerNorms, as GPT-2
    attention: str = "math"  # "math": written out; "sdpa": one fused kernel (AttentionCore)
    # Mixture of experts (`minitp.moe`, `minitp.routing`); n_experts=0: every MLP dense.
    n_experts: int = 0  # E expert MLPs in each MoE layer
    top_k: int = 2  # experts per token
    moe_every: int = 1  # layers moe_every-1, 2·moe_every-1, … are MoE (1: all; 2: every other)
    capacity_factor: float | None = None  # None: dropless; f: ⌈f·T·k/E⌉ per expert per sequence
    router: str = "softmax"  # "softmax" (Switch, Mixtral) or "sigmoid" (DeepSeek-V3)
    balance: str = "aux"  # "aux" (Switch's loss), "bias" (DeepSeek-V3's, loss-free), "none"
    aux_loss_coef: float = 0.01  # the aux loss's weight (Switch Transformer's α)
    bias_update_rate: float = 0.001  # the bias's step per optimizer step (DeepSeek-V3's γ)
    shared_expert: bool = False  # one dense MLP every token also goes through (DeepSeek-V3)

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model"):
            check_positive_int(f"GPTConfig.{name}", getattr(self, name))
        if self.d_model % self.n_head:
            raise ValueError(
                f"d_model={self.d_model} must be divisible by n_head={self.n_head} "
                "(each head gets d_model / n_head features)"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.attention == "sdpa" and self.dropout > 0:
            raise ValueError(
                "attention='sdpa' draws its dropout masks inside the fused kernel, where "
                "minitp's dropout (each rank the masks one device would draw) cannot reach; "
                f"use attention='math' with dropout={self.dropout}, or dropout=0")
        if self.n_experts:
            for name in ("n_experts", "top_k", "moe_every"):
                check_positive_int(f"GPTConfig.{name}", getattr(self, name))
            check_moe_config(self)

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer `index` holds a mixture of experts rather than a dense MLP."""
        return self.n_experts > 0 and index % self.moe_every == self.moe_every - 1

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


class AttentionCore(nn.Module):
    """softmax(QKᵀ/√d + causal mask) · V, with dropout on the probabilities.

    attention="math" writes it out: the scores and probabilities are tensors that
    autograd keeps for backward (the 5as/h term of Korthikanti et al.'s activation
    formula). "sdpa" calls `F.scaled_dot_product_attention`, one fused kernel (flash
    attention on a GPU) that keeps neither and recomputes them in its backward.
    """

    def __init__(self, dropout: float, attention: str = "math"):
        super().__init__()
        self.attention = attention
        self.dropout = nn.Dropout(dropout)

    def forward(self, q, k, v):  # each (B, nh, T, hs)
        if self.attention == "sdpa":  # GPTConfig refuses sdpa with dropout
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        T = q.shape[-2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, nh, T, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = self.dropout(F.softmax(scores, dim=-1))
        return probs @ v  # (B, nh, T, hs)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        # Output features ordered (head, q/k/v, head_dim): see the module docstring.
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.core = AttentionCore(cfg.dropout, cfg.attention)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):  # (B, T, C)
        qkv = self.qkv(x)  # (B, T, 3C') with C' the features this module holds
        B, T, _ = qkv.shape  # read here: a sequence-parallel x holds only T/t positions
        heads = qkv.shape[-1] // (3 * self.head_dim)  # all heads here; a shard holds fewer
        qkv = qkv.view(B, T, heads, 3, self.head_dim)  # (B, T, nh, 3, hs)
        q, k, v = qkv.permute(3, 0, 2, 1, 4).unbind(0)  # each (B, nh, T, hs)
        y = self.core(q, k, v)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, heads * self.head_dim)  # (B, T, C')
        return self.dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):  # (B, T, C)
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig, moe: bool = False):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        # a mixture of experts in the MLP's place (`minitp.moe`), same name: the block's
        # forward does not change
        self.mlp = MoE(cfg, MLP(cfg) if cfg.shared_expert else None) if moe else MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class LearnedPositions(nn.Embedding):
    """Adds a learned vector for each position 0..T−1 to the token embeddings.

    An `nn.Embedding` (same weight, same initialisation) whose forward takes the
    token embeddings (B, T, C) rather than position ids, so that a stage or a
    shard can replace it as a whole."""

    def forward(self, x):  # (B, T, C)
        T = x.shape[1]
        if T > self.num_embeddings:
            raise ValueError(f"sequence of {T} tokens is longer than seq_len={self.num_embeddings}")
        return x + self.weight[:T]  # (T, C) broadcast over the batch


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


class CrossEntropy(nn.Module):
    """The mean next-token loss over the targets that are not IGNORE_INDEX."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, logits, targets):  # (B, T, V), (B, T)
        check_token_ids(targets, self.vocab_size, "target id", ignore_index=IGNORE_INDEX)
        logits = loss_precision(logits)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=IGNORE_INDEX)


class GPT(nn.Module):
    """Token and position embeddings, n_layer blocks, a final LayerNorm, and the
    output projection tied to the token embedding (as GPT-2 and Megatron-LM)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = LearnedPositions(cfg.seq_len, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, cfg.is_moe_layer(i)) for i in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.head = TiedOutput(self.wte)
        self.loss = CrossEntropy(cfg.vocab_size)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, inputs, targets=None):
        """inputs: token ids (B, T) — or, on a later pipeline stage, the previous
        stage's activations, which the embedding steps (pass-throughs there) leave
        as they are. Returns (logits, loss); loss is None without targets."""
        if not inputs.is_floating_point():  # ids, not activations: the rule every model keeps
            check_token_ids(inputs, self.cfg.vocab_size, "input id")
        x = self.dropout(self.wpe(self.wte(inputs)))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))  # (B, T, V)
        loss = None if targets is None else self.loss(logits, targets)
        return logits, loss

    def num_parameters(self) -> int:
        """Every parameter once (the tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())
