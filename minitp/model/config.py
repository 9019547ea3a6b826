"""The plain GPT's configuration: its sizes, and which parts each layer is made of.

The defaults are GPT-2's (LayerNorm, learned positions, a GELU MLP, one K/V head per
query head, biases); `GPTConfig.llama` sets the Llama-style parts together
(`minitp.model.llama_layers`). Every rule a configuration must keep is checked here, once.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..rules import check_positive_int, default_vision_patches
from ..rules.experts import check_moe_config
from ..rules.mla import check_mla_config
from .attention_core import ATTENTIONS

# What makes a configuration Llama-style (`GPTConfig.llama`, the CLI's --arch llama)
LLAMA_PARTS = dict(norm="rmsnorm", positions="rope", mlp="swiglu", bias=False)
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")
MLPS = ("gelu", "swiglu")
# The GELU MLP's activation: "gelu" exact (erf), "gelu_tanh" GPT-2's tanh form (HF's gelu_new)
ACTIVATIONS = ("gelu", "gelu_tanh")


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
    # Mixture of experts (`minitp.model.moe`, `minitp.model.routing`); n_experts=0: every MLP dense.
    n_experts: int = 0  # E expert MLPs in each MoE layer
    top_k: int = 2  # experts per token
    moe_every: int = 1  # layers moe_every-1, 2·moe_every-1, … are MoE (1: all; 2: every other)
    capacity_factor: float | None = None  # None: dropless; f: ⌈f·T·k/E⌉ per expert per sequence
    router: str = "softmax"  # "softmax" (Switch, Mixtral) or "sigmoid" (DeepSeek-V3)
    balance: str = "aux"  # "aux" (Switch's loss), "bias" (DeepSeek-V3's, loss-free), "none"
    aux_loss_coef: float = 0.01  # the aux loss's weight (Switch Transformer's α)
    bias_update_rate: float = 0.001  # the bias's step per optimizer step (DeepSeek-V3's γ)
    shared_expert: bool = False  # one dense MLP every token also goes through (DeepSeek-V3)
    # The Llama-style parts (`GPTConfig.llama` sets them together); the defaults are GPT-2's.
    norm: str = "layernorm"  # or "rmsnorm": x / rms(x) · g, no mean, no shift
    positions: str = "learned"  # or "rope": q and k rotated by their position in attention
    mlp: str = "gelu"  # or "swiglu": proj(silu(gate x) ⊙ up x)
    activation: str = "gelu"  # the GELU MLP's: exact (erf), or "gelu_tanh" (GPT-2's, imported)
    n_kv_head: int | None = None  # None: fused qkv, a K/V head per query head (GPT-2);
    # K (dividing n_head): separate q and kv projections, K/V heads shared by groups of
    # n_head/K query heads (grouped-query attention; K = 1: multi-query)
    ffn_hidden: int | None = None  # the MLP's width; None: 4h (gelu), 8h/3 up to a 16 (swiglu)
    rope_theta: float = 10000.0  # the rotary embedding's base (RoFormer, Llama 2)
    # Multi-head latent attention (`GPTConfig.mla`, `minitp.model.mla`); kv_lora_rank 0: none.
    kv_lora_rank: int = 0  # d_c: the K/V latent a token (what the cache holds)
    q_lora_rank: int = 0  # d_c': the query's latent; 0: queries straight from the input
    rope_dim: int = 0  # d_h^R: the decoupled rotary part of each query and the shared key
    causal: bool = True  # False: every position attends to every other (a vision encoder)
    # A vision-language model (`minitp.model.vision`): each sequence starts with an image's
    # vision_patches patches (one byte each: `minitp.data.images`), read by a small encoder
    # of vision_layers GPT-2 blocks vision_width wide; 0 patches: a text model.
    vision_patches: int = 0
    vision_layers: int = 2
    vision_width: int = 32
    vision_heads: int = 2

    @classmethod
    def llama(cls, **fields) -> GPTConfig:
        """A Llama-style configuration (Touvron et al. 2023; Llama 3's layer): RMSNorm,
        rotary positions, a SwiGLU MLP, no biases, and separate q and kv projections
        (``n_kv_head`` defaults to ``n_head``: give fewer for grouped-query attention)."""
        fields = {**LLAMA_PARTS, **fields}
        fields.setdefault("n_kv_head", fields.get("n_head", cls.n_head))
        return cls(**fields)

    @classmethod
    def vlm(cls, **fields) -> GPTConfig:
        """A vision-language model: a Llama-style decoder (`GPTConfig.llama`) whose sequences
        start with an image of ``vision_patches`` patches (default: half the sequence, whole
        characters of `minitp.data.images`'s font, 4 patches each)."""
        seq_len = fields.get("seq_len", cls.seq_len)
        fields.setdefault("vision_patches", default_vision_patches(seq_len))
        if not fields["vision_patches"]:
            raise ValueError(f"seq_len={seq_len} holds no image: a vision-language model needs "
                             f"vision_patches > 0 (by default half of seq_len >= 8)")
        return cls.llama(**fields)

    @classmethod
    def mla(cls, **fields) -> GPTConfig:
        """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 §2.1.2–2.1.3) in a
        Llama-style layer: K/V up-projected from a ``kv_lora_rank`` latent, queries through
        a ``q_lora_rank`` one (0: none), a ``rope_dim`` rotary key shared by the heads.
        Defaults are V2's ratios (§3.1.2: d_c 512 = 4·d_h, d_h^R 64 = d_h/2 at d_h 128),
        d_h^R made even."""
        fields = {**LLAMA_PARTS, **fields}
        head = fields.get("d_model", cls.d_model) // fields.get("n_head", cls.n_head)
        fields.setdefault("kv_lora_rank", 4 * head)
        fields.setdefault("rope_dim", max(2, head // 4 * 2))
        fields.setdefault("n_kv_head", fields.get("n_head", cls.n_head))  # a K, V per head
        if not fields["kv_lora_rank"]:
            raise ValueError("GPTConfig.mla needs kv_lora_rank > 0: the latent is the point")
        return cls(**fields)

    @property
    def vision_config(self) -> GPTConfig:
        """The vision encoder's blocks: GPT-2's parts (a ViT's), attention not causal."""
        return GPTConfig(vocab_size=self.vocab_size, seq_len=self.vision_patches,
                         n_layer=self.vision_layers, n_head=self.vision_heads,
                         d_model=self.vision_width, dropout=self.dropout,
                         attention=self.attention, causal=False)

    @property
    def arch(self) -> str:
        """"mla" for `GPTConfig.mla`'s, "vlm" with an image, "llama" for `GPTConfig.llama`'s
        parts, "gpt2" for the defaults, else "custom"."""
        parts = (self.norm, self.positions, self.mlp, self.n_kv_head is not None)
        if self.kv_lora_rank:
            return "mla" if parts[:3] == ("rmsnorm", "rope", "swiglu") else "custom"
        if self.vision_patches:
            return "vlm" if parts == ("rmsnorm", "rope", "swiglu", True) else "custom"
        if parts == ("rmsnorm", "rope", "swiglu", True):
            return "llama"
        return "gpt2" if parts == ("layernorm", "learned", "gelu", False) else "custom"

    @property
    def kv_heads(self) -> int:
        """K/V heads: n_kv_head, or one per query head."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def ffn_width(self) -> int:
        """The MLP's hidden width (``ffn_hidden``, or its default for the MLP kind)."""
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        if self.mlp == "swiglu":  # Llama's 2/3 of 4h: a SwiGLU's three matrices, two's FLOPs
            return -(-8 * self.d_model // 3 // 16) * 16
        return 4 * self.d_model

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
        for name, value, allowed in (("norm", self.norm, NORMS),
                                     ("positions", self.positions, POSITIONS),
                                     ("mlp", self.mlp, MLPS),
                                     ("activation", self.activation, ACTIVATIONS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.n_kv_head is not None:
            check_positive_int("GPTConfig.n_kv_head", self.n_kv_head)
            if self.n_head % self.n_kv_head:
                raise ValueError(f"n_head={self.n_head} is not divisible by n_kv_head="
                                 f"{self.n_kv_head}: each K/V head serves a whole group of "
                                 "query heads")
        if self.ffn_hidden is not None:
            check_positive_int("GPTConfig.ffn_hidden", self.ffn_hidden)
        if self.positions == "rope" and self.n_kv_head is None:
            raise ValueError("positions='rope' rotates q and k in the attention with separate q "
                             "and kv projections: give n_kv_head (n_head for one K/V head per "
                             "query head), as GPTConfig.llama does")
        if self.positions == "rope" and not self.kv_lora_rank and self.head_dim % 2:
            raise ValueError(f"positions='rope' rotates pairs of features: head_dim="
                             f"{self.head_dim} (d_model/n_head) must be even")
        if self.activation != "gelu" and (self.mlp != "gelu" or self.n_experts):
            raise ValueError(f"activation={self.activation!r} applies to the dense GELU MLP "
                             f"only: mlp={self.mlp!r}, n_experts={self.n_experts} (the experts "
                             "run the exact GELU: minitp.model.expert_mlps); use 'gelu'")
        if self.n_experts and self.mlp != "gelu":
            raise ValueError(f"mlp={self.mlp!r} with n_experts={self.n_experts}: the experts "
                             "are GELU MLPs (minitp.model.expert_mlps); use mlp='gelu'")
        if self.n_experts and self.ffn_hidden is not None:
            raise ValueError(f"ffn_hidden={self.ffn_hidden} with n_experts={self.n_experts}: the "
                             "experts (and a shared expert) are 4·d_model wide (minitp.model.moe); "
                             "leave ffn_hidden None")
        if self.kv_lora_rank or self.q_lora_rank or self.rope_dim:
            check_mla_config(self)
        if self.vision_patches:
            self._check_vision()
        if self.n_experts:
            for name in ("n_experts", "top_k", "moe_every"):
                check_positive_int(f"GPTConfig.{name}", getattr(self, name))
            check_moe_config(self)

    def _check_vision(self):
        check_positive_int("GPTConfig.vision_patches", self.vision_patches)
        if self.vision_patches >= self.seq_len:
            raise ValueError(f"vision_patches={self.vision_patches} leaves no text in a sequence "
                             f"of seq_len={self.seq_len}: give fewer patches or longer sequences")
        if self.vocab_size < 256:
            raise ValueError(f"vocab_size={self.vocab_size}: an image's patches are byte ids "
                             "(0..255), so a vision-language model needs vocab_size >= 256")
        if self.n_experts or self.dropout:
            raise ValueError("a vision-language model is built dense and without dropout: "
                             f"got n_experts={self.n_experts}, dropout={self.dropout}")
        _ = self.vision_config  # its own checks: width divisible by heads, positive sizes

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer `index` holds a mixture of experts rather than a dense MLP."""
        return self.n_experts > 0 and index % self.moe_every == self.moe_every - 1

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head
