"""A GPTConfig as transformers' ``config.json`` (GPT2Config, LlamaConfig), and back; a
model either class cannot express is refused in one line that names what it lacks.

Fixed facts of minitp's model that the HF config must agree with: LayerNorm and RMSNorm
both use eps 1e-5 (`minitp.model.llama_layers.norm`), attention scales by 1/√head_dim,
the output head is the token embedding (tied), and RoPE is the plain (unscaled) one.
"""

from __future__ import annotations

from ..model import GPTConfig

NORM_EPS = 1e-5  # minitp's LayerNorm and RMSNorm (`minitp.model.llama_layers.norm`)
# minitp's activation <-> HF GPT-2's activation_function (HF's gelu_new is GPT-2's tanh form;
# gelu_pytorch_tanh the same formula in one kernel): read both, write gelu_new
HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new"}
FROM_HF_ACTIVATION = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}


def refuse(why: str):
    raise ValueError(f"minitp.export: {why}")


def check_exportable(cfg: GPTConfig) -> str:
    """The HF model type that holds `cfg` ("gpt2" or "llama"), or a one-line refusal."""
    for present, what in ((cfg.n_experts, f"a mixture of experts (n_experts={cfg.n_experts})"),
                          (cfg.kv_lora_rank, "multi-head latent attention (kv_lora_rank="
                                             f"{cfg.kv_lora_rank})"),
                          (cfg.vision_patches, "a vision-language model (vision_patches="
                                               f"{cfg.vision_patches})"),
                          (not cfg.causal, "attention that is not causal (causal=False)")):
        if present:
            refuse(f"the model has {what}, which transformers' GPT2LMHeadModel and "
                   "LlamaForCausalLM cannot express; only GPT-2-style and Llama-style export")
    if cfg.arch not in ARCHITECTURES:
        refuse(f"norm={cfg.norm!r}, positions={cfg.positions!r}, mlp={cfg.mlp!r}, n_kv_head="
               f"{cfg.n_kv_head} mix GPT-2's parts and Llama's: neither GPT2LMHeadModel nor "
               "LlamaForCausalLM has them")
    return cfg.arch


def to_hf_config(cfg: GPTConfig, dtype: str) -> dict:
    """config.json for `cfg` (exportable: `check_exportable`), its tensors of `dtype`."""
    kind = check_exportable(cfg)
    common = {"model_type": kind, "architectures": [ARCHITECTURES[kind]],
              "vocab_size": cfg.vocab_size, "tie_word_embeddings": True, "dtype": dtype,
              "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    if kind == "gpt2":
        return common | {
            "n_positions": cfg.seq_len, "n_embd": cfg.d_model, "n_layer": cfg.n_layer,
            "n_head": cfg.n_head, "n_inner": cfg.ffn_width,
            "activation_function": HF_ACTIVATION[cfg.activation],
            "layer_norm_epsilon": NORM_EPS, "resid_pdrop": cfg.dropout,
            "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.dropout, "scale_attn_weights": True}
    return common | {
        "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn_width,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.seq_len, "rms_norm_eps": NORM_EPS, "hidden_act": "silu",
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": cfg.bias, "mlp_bias": cfg.bias,
        # (HF's Llama drops out attention probabilities only: minitp's residual dropout
        # has no field there; logits, in eval, are the same)
        "attention_dropout": cfg.dropout}


def _need(hf: dict, key: str, expected, default=None):
    value = hf.get(key, default)
    if value != expected:
        refuse(f"{hf.get('model_type')} config's {key}={value!r}: minitp's model has "
               f"{expected!r} only")


def from_hf_config(hf: dict) -> GPTConfig:
    """The GPTConfig of a transformers GPT-2 or Llama config.json (a parsed dict)."""
    kind = hf.get("model_type")
    if kind not in ARCHITECTURES:
        refuse(f"model_type {kind!r} is not supported (mixture-of-experts, latent-attention, "
               f"vision and other models have no minitp counterpart here): "
               f"{sorted(ARCHITECTURES)} only")
    if kind == "gpt2":
        act = hf.get("activation_function", "gelu_new")
        if act not in FROM_HF_ACTIVATION:
            refuse(f"activation_function={act!r}: minitp's GPT-2 MLP runs one of "
                   f"{sorted(FROM_HF_ACTIVATION)}")
        _need(hf, "layer_norm_epsilon", NORM_EPS, 1e-5)
        for key, expected in (("scale_attn_weights", True), ("add_cross_attention", False),
                              ("scale_attn_by_inverse_layer_idx", False),
                              ("reorder_and_upcast_attn", False), ("tie_word_embeddings", True)):
            _need(hf, key, expected, expected)
        drops = {hf.get(k, 0.1) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
        if len(drops) != 1:
            refuse(f"resid_pdrop, embd_pdrop, attn_pdrop differ ({sorted(drops)}): minitp has "
                   "one dropout for all three")
        return GPTConfig(vocab_size=hf["vocab_size"], seq_len=hf["n_positions"],
                         n_layer=hf["n_layer"], n_head=hf["n_head"], d_model=hf["n_embd"],
                         ffn_hidden=hf.get("n_inner"), dropout=drops.pop(), bias=True,
                         activation=FROM_HF_ACTIVATION[act])
    return _llama(hf)


def _llama(hf: dict) -> GPTConfig:
    _need(hf, "hidden_act", "silu", "silu")
    _need(hf, "rms_norm_eps", NORM_EPS, 1e-6)  # (LlamaConfig's default is 1e-6)
    _need(hf, "pretraining_tp", 1, 1)
    _need(hf, "rope_scaling", None)
    rope = hf.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        refuse(f"rope_type={rope['rope_type']!r}: minitp's rotary embedding is the plain one")
    heads = hf["num_attention_heads"]
    _need(hf, "head_dim", hf["hidden_size"] // heads, hf["hidden_size"] // heads)
    if hf.get("attention_bias", False) != hf.get("mlp_bias", False):
        refuse("attention_bias and mlp_bias differ: minitp's bias is one switch for all")
    return GPTConfig.llama(
        vocab_size=hf["vocab_size"], seq_len=hf["max_position_embeddings"],
        n_layer=hf["num_hidden_layers"], n_head=heads, d_model=hf["hidden_size"],
        n_kv_head=hf.get("num_key_value_heads") or heads, ffn_hidden=hf["intermediate_size"],
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        bias=bool(hf.get("attention_bias", False)),
        dropout=float(hf.get("attention_dropout", 0.0)))
