# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex27
# Made from solutions/ex27_mla_tp_plan.py by `python -m minitp.course.make_exercises`.
"""Exercise 27: multi-head latent attention's tensor-parallel plan — which projections are
split, which are whole on every rank, and whose gradients must be summed over tp.

The layer (lesson 27; DeepSeek-V2, arXiv 2405.04434, eqs. 9–19), for an input h of
d_model values and n_h heads of d_h:

    c_Q  = q_norm(q_down(h))        q_down: d_model -> q_lora_rank, then an RMSNorm
    q    = q_up(c_Q)                q_up: q_lora_rank -> n_h·(d_h + rope_dim): every
                                    head's q^C_i and q^R_i, head by head
    c_KV = kv_norm(kv_down(h))      kv_down: d_model -> kv_lora_rank (the cached latent)
    kv   = kv_up(c_KV)              kv_up: kv_lora_rank -> n_h·2·d_h: every head's K and V
    k^R  = RoPE(k_rope(h))          k_rope: d_model -> rope_dim, ONE key that every head
                                    concatenates to its own K
    out  = proj(heads' outputs)     proj: n_h·d_h -> d_model

Tensor parallelism splits the heads over tp ranks, as Megatron-LM splits qkv. The plan
maps the input h ONCE, before every projection reads it (f: identity forward, all-reduce
of its gradient backward; with sequence parallelism, the all-gather), and nothing else
until the output's g. A rank's modules are "column" (its block of the output features),
"row" (its block of the input features) or "replicated" (the whole module on every rank).
A gradient computed on a rank is *partial* when the rank's own heads supply only their
share of it: the step must then sum it over tp (`grad_partial_over_tp`, lessons 05 and 09).

* (a) `split_of()`: {module: "column", "row" or "replicated"} for every name in MODULES;
* (b) `summed_over_tp()`: the set of MODULES whose parameters' gradients must be summed
  over tp under this plan.

Grade it with `mt.grade("ex27")` in a notebook or `python -m minitp.course.grade ex27`: (a)
and (b) against the library's plan (`minitp.tensor_parallel.plan`), each usual mistake
named; then on 2 ranks your (b) decides which gradients the step sums, and one AdamW step
of a latent-attention GPT at tp = 2 must equal one device's in float64.
"""

MODULES = ("q_down", "q_norm", "q_up", "kv_down", "kv_norm", "kv_up", "k_rope", "proj")


def split_of() -> dict:
    """{module name: "column", "row" or "replicated"} for every name in MODULES."""
    # hint: what does tp split, and which modules' outputs belong to one head? A module
    # hint: whose output every head reads whole, or that normalises over all its
    # hint: features, cannot be cut by heads.
    raise NotImplementedError(
        "what does tp split, and which modules' outputs belong to one head? A module whose "
        'output every head reads whole, or that normalises over all its features, cannot be '
        'cut by heads.'
    )


def summed_over_tp() -> set:
    """The names of MODULES whose gradients are partial on each tp rank."""
    # hint: follow a replicated module's output forward: which heads read it, on which
    # hint: ranks? Where is the only f that could sum what comes back? A split module's
    # hint: gradient is its own block's, whole.
    raise NotImplementedError(
        "follow a replicated module's output forward: which heads read it, on which ranks? "
        "Where is the only f that could sum what comes back? A split module's gradient is its"
        " own block's, whole."
    )
