"""The weight mapping between minitp's plain GPT and transformers' GPT-2 and Llama, both ways.

Each tensor is the same numbers in another order; what differs, and why minitp orders it
its way (a tensor-parallel split is then a contiguous slice: `minitp.model.gpt`):

* minitp's fused ``qkv`` (nn.Linear, weight (3C, C)) orders its output features
  (head, q/k/v, head_dim); GPT-2's ``c_attn`` orders them (q/k/v, head, head_dim), and is
  a Conv1D, ``y = x W + b``: its weight is (C, 3C), the transpose of a Linear's. Every
  GPT-2 Linear (``c_attn``, ``c_proj``, ``c_fc``) is therefore written transposed.
* minitp's ``kv`` orders (K/V head, k/v, head_dim); Llama has ``k_proj`` and ``v_proj``.
* minitp's SwiGLU ``fc`` interleaves its features (gate_0, up_0, gate_1, up_1, ...);
  Llama has ``gate_proj`` and ``up_proj``.
* the output head is the token embedding (tied): written once, as the embedding.

A GPT-2-style model without biases (``bias=False``) is written with zero biases: GPT-2's
classes always have them, and a zero bias adds nothing.
"""

from __future__ import annotations

import torch

GPT2_PREFIX, LLAMA_PREFIX = "transformer.", "model."


def _qkv_to_hf(t: torch.Tensor, n_head: int) -> torch.Tensor:
    """(head, q/k/v, head_dim, ...) -> (q/k/v, head, head_dim, ...) on the first dim."""
    rest = t.shape[1:]
    return t.reshape(n_head, 3, -1, *rest).transpose(0, 1).reshape(t.shape[0], *rest)


def _qkv_from_hf(t: torch.Tensor, n_head: int) -> torch.Tensor:
    rest = t.shape[1:]
    return t.reshape(3, n_head, -1, *rest).transpose(0, 1).reshape(t.shape[0], *rest)


def _pairs(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows interleaved (a_0, b_0, a_1, b_1, ...) -> (a rows, b rows)."""
    a, b = t.reshape(-1, 2, *t.shape[1:]).unbind(1)
    return a.contiguous(), b.contiguous()


def _interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.stack([a, b], 1).reshape(-1, *a.shape[1:])


def _kv_heads(t: torch.Tensor, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """minitp's kv rows (K/V head, k/v, head_dim) -> (k rows, v rows), each (head, dim)."""
    rest = t.shape[1:]
    k, v = t.reshape(kv_heads, 2, -1, *rest).unbind(1)
    return k.reshape(-1, *rest).contiguous(), v.reshape(-1, *rest).contiguous()


def _kv_from_heads(k: torch.Tensor, v: torch.Tensor, kv_heads: int) -> torch.Tensor:
    rest = k.shape[1:]
    both = torch.stack([k.reshape(kv_heads, -1, *rest), v.reshape(kv_heads, -1, *rest)], 1)
    return both.reshape(-1, *rest)


def gpt2_to_hf(cfg, sd: dict) -> dict:
    """minitp's GPT-2-style state dict -> GPT2LMHeadModel's (its tied lm_head left out)."""
    def bias(name, width):
        return sd[name] if name in sd else torch.zeros(width, dtype=sd["wte.weight"].dtype)

    C, out = cfg.d_model, {}
    out["wte.weight"], out["wpe.weight"] = sd["wte.weight"], sd["wpe.weight"]
    for i in range(cfg.n_layer):
        m, h = f"blocks.{i}.", f"h.{i}."
        for mt_norm, hf_norm in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[h + hf_norm + ".weight"] = sd[m + mt_norm + ".weight"]
            out[h + hf_norm + ".bias"] = bias(m + mt_norm + ".bias", C)
        out[h + "attn.c_attn.weight"] = _qkv_to_hf(sd[m + "attn.qkv.weight"], cfg.n_head).T
        out[h + "attn.c_attn.bias"] = _qkv_to_hf(bias(m + "attn.qkv.bias", 3 * C), cfg.n_head)
        out[h + "attn.c_proj.weight"] = sd[m + "attn.proj.weight"].T
        out[h + "attn.c_proj.bias"] = bias(m + "attn.proj.bias", C)
        out[h + "mlp.c_fc.weight"] = sd[m + "mlp.fc.weight"].T
        out[h + "mlp.c_fc.bias"] = bias(m + "mlp.fc.bias", cfg.ffn_width)
        out[h + "mlp.c_proj.weight"] = sd[m + "mlp.proj.weight"].T
        out[h + "mlp.c_proj.bias"] = bias(m + "mlp.proj.bias", C)
    out["ln_f.weight"], out["ln_f.bias"] = sd["ln_f.weight"], bias("ln_f.bias", C)
    return {GPT2_PREFIX + k: v.contiguous() for k, v in out.items()}


def gpt2_from_hf(cfg, hf: dict) -> dict:
    """GPT2LMHeadModel's tensors (with or without the ``transformer.`` prefix) -> minitp's."""
    hf = {k.removeprefix(GPT2_PREFIX): v for k, v in hf.items()}
    out = {"wte.weight": hf["wte.weight"], "wpe.weight": hf["wpe.weight"],
           "ln_f.weight": hf["ln_f.weight"], "ln_f.bias": hf["ln_f.bias"]}
    for i in range(cfg.n_layer):
        m, h = f"blocks.{i}.", f"h.{i}."
        for mt_norm, hf_norm in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[m + mt_norm + ".weight"] = hf[h + hf_norm + ".weight"]
            out[m + mt_norm + ".bias"] = hf[h + hf_norm + ".bias"]
        out[m + "attn.qkv.weight"] = _qkv_from_hf(hf[h + "attn.c_attn.weight"].T, cfg.n_head)
        out[m + "attn.qkv.bias"] = _qkv_from_hf(hf[h + "attn.c_attn.bias"], cfg.n_head)
        out[m + "attn.proj.weight"] = hf[h + "attn.c_proj.weight"].T
        out[m + "attn.proj.bias"] = hf[h + "attn.c_proj.bias"]
        out[m + "mlp.fc.weight"] = hf[h + "mlp.c_fc.weight"].T
        out[m + "mlp.fc.bias"] = hf[h + "mlp.c_fc.bias"]
        out[m + "mlp.proj.weight"] = hf[h + "mlp.c_proj.weight"].T
        out[m + "mlp.proj.bias"] = hf[h + "mlp.c_proj.bias"]
    return {k: v.contiguous() for k, v in out.items()}


def llama_to_hf(cfg, sd: dict) -> dict:
    """minitp's Llama-style state dict -> LlamaForCausalLM's (its tied lm_head left out)."""
    out = {"embed_tokens.weight": sd["wte.weight"], "norm.weight": sd["ln_f.weight"]}
    kinds = ("weight", "bias") if cfg.bias else ("weight",)
    for i in range(cfg.n_layer):
        m, h = f"blocks.{i}.", f"layers.{i}."
        out[h + "input_layernorm.weight"] = sd[m + "ln1.weight"]
        out[h + "post_attention_layernorm.weight"] = sd[m + "ln2.weight"]
        for kind in kinds:
            out[h + f"self_attn.q_proj.{kind}"] = sd[m + f"attn.q.{kind}"]
            k, v = _kv_heads(sd[m + f"attn.kv.{kind}"], cfg.kv_heads)
            out[h + f"self_attn.k_proj.{kind}"], out[h + f"self_attn.v_proj.{kind}"] = k, v
            out[h + f"self_attn.o_proj.{kind}"] = sd[m + f"attn.proj.{kind}"]
            gate, up = _pairs(sd[m + f"mlp.fc.{kind}"])
            out[h + f"mlp.gate_proj.{kind}"], out[h + f"mlp.up_proj.{kind}"] = gate, up
            out[h + f"mlp.down_proj.{kind}"] = sd[m + f"mlp.proj.{kind}"]
    return {LLAMA_PREFIX + k: v.contiguous() for k, v in out.items()}


def llama_from_hf(cfg, hf: dict) -> dict:
    """LlamaForCausalLM's tensors -> minitp's (the lm_head, if any, checked by the caller)."""
    hf = {k.removeprefix(LLAMA_PREFIX): v for k, v in hf.items()}
    out = {"wte.weight": hf["embed_tokens.weight"], "ln_f.weight": hf["norm.weight"]}
    kinds = ("weight", "bias") if cfg.bias else ("weight",)
    for i in range(cfg.n_layer):
        m, h = f"blocks.{i}.", f"layers.{i}."
        out[m + "ln1.weight"] = hf[h + "input_layernorm.weight"]
        out[m + "ln2.weight"] = hf[h + "post_attention_layernorm.weight"]
        for kind in kinds:
            out[m + f"attn.q.{kind}"] = hf[h + f"self_attn.q_proj.{kind}"]
            out[m + f"attn.kv.{kind}"] = _kv_from_heads(hf[h + f"self_attn.k_proj.{kind}"],
                                                        hf[h + f"self_attn.v_proj.{kind}"],
                                                        cfg.kv_heads)
            out[m + f"attn.proj.{kind}"] = hf[h + f"self_attn.o_proj.{kind}"]
            out[m + f"mlp.fc.{kind}"] = _interleave(hf[h + f"mlp.gate_proj.{kind}"],
                                                    hf[h + f"mlp.up_proj.{kind}"])
            out[m + f"mlp.proj.{kind}"] = hf[h + f"mlp.down_proj.{kind}"]
    return {k: v.contiguous() for k, v in out.items()}


TO_HF = {"gpt2": gpt2_to_hf, "llama": llama_to_hf}
FROM_HF = {"gpt2": gpt2_from_hf, "llama": llama_from_hf}
