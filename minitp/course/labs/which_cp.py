"""Lab: which context parallelism — the ring, the all-gather (its K and V kept, or gathered
again in backward as TransformerEngine does), Ulysses' all-to-all and the hybrid, side by
side on one sequence (lesson 10).

`side_by_side`: one launch of 4 ranks, ``Mesh(cp=4)``. For each variant the same plain GPT
(float64) is made context-parallel with `mt.parallelize(cp_comm=...)` and takes one training
step on the same batch, beside the plain GPT on every rank:

* equal to one device: the step's loss and every gradient against the plain GPT's
  (MEASURED differences);
* the attention's collectives, read from the step's trace (the events whose label is one
  of the attention's: `ATTENTION_LABELS`): per rank and phase, the bytes the trace's ring
  model gives each (``model_bytes``) and, for the all-gather, reduce-scatter and
  all-to-all, the bytes the kernel counted this process writing (``sent_bytes``,
  MEASURED; ``None`` for the ring's sends, which overlap one another and the compute:
  no window holds one alone);
* what the attention core of layer 0 keeps for backward, MEASURED by the
  `ActivationLedger` during a separate forward of the same batch;
* the most bytes that core holds at once through its forward and backward, MEASURED by
  the allocator (`mt.memory.peak_allocated`), run again on the inputs it was given.

`kept_model` is the formula for the kept bytes and `minitp.calc.cp_core_bytes` for both
(MODELS, written from what each core saves and works with;
`tests/context_parallel/test_cp_variants.py` asserts the kept bytes too), and
`minitp.rules.cp_attention_bytes` the byte model the measured bytes stand beside.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# TransformerEngine's all-gather ("allgather-regather") last: the first four keep their places
VARIANTS = (("ring", None), ("allgather", None), ("a2a", None), ("a2a+ring", 2),
            ("allgather-regather", None))
# The labels the attention variants give their collectives (minitp.context_parallel)
ATTENTION_LABELS = ("ring K/V", "ring dK/dV", "allgather K/V", "a2a Q/K/V", "a2a O")
MEASURABLE = ("all_gather", "reduce_scatter", "all_to_all")  # not overlapped: counted alone


@dataclass
class VariantRun:
    """One variant on one rank."""

    name: str  # "ring", "allgather", "a2a", "a2a+ring (U=2)", "allgather-regather"
    loss_error: float  # |loss - the plain GPT's|, MEASURED
    grad_error: float  # the largest difference of any gradient, MEASURED
    model_bytes: dict  # phase -> bytes, the trace's model of each collective, summed
    sent_bytes: dict  # phase -> bytes the kernel counted for the `MEASURABLE` ops (None: not
    #                   measurable: NCCL moves them), and `measurable_model`, their model
    measurable_model: dict
    ops: dict  # (phase, label, op) -> how many
    kept: int  # bytes the attention core of layer 0 keeps for backward (ledger)
    peak: int  # the most bytes that core held at once, forward and backward (allocator)
    events: list = field(default_factory=list)  # the attention's trace events


def name_of(comm: str, u: int | None) -> str:
    return comm if u is None else f"{comm} (U={u})"


def is_attention(event) -> bool:
    return any(event.label.endswith(label) for label in ATTENTION_LABELS)


def _in_rank(cfg, rows: int, seed: int):
    from ... import context_parallel as cpar
    from ...data_parallel import make_optimizer
    from ...memory.activations import ActivationLedger
    from ...model import GPT
    from ...parallelize import parallelize
    from ...runtime import trace
    from ...runtime._device import device
    from ...runtime.mesh import Mesh, world
    from ...step import train_step

    mesh = Mesh(cp=world().size)
    torch.manual_seed(seed)
    ref = GPT(cfg).to(device=device(), dtype=torch.float64)
    g = torch.Generator().manual_seed(seed + 1)
    x, y = (torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len), generator=g).to(device())
            for _ in range(2))
    ref.zero_grad()
    _, ref_loss = ref(x, y)
    ref_loss.backward()
    out = []
    for comm, u in VARIANTS:
        model = parallelize(ref, mesh, cp_comm=comm, cp_a2a_size=u)
        opt = make_optimizer(model, mesh, torch.optim.SGD, lr=0.0)
        before = len(trace.events())
        loss = train_step(model, (x, y), mesh, opt)
        events = [e for e in trace.events()[before:] if is_attention(e)]
        grads = model.full_grad_dict()
        grad_error = max((grads[n] - p.grad).abs().max().item()
                         for n, p in ref.named_parameters())
        mine = cpar.split_sequence(x, mesh.cp)
        core = next(m for n, m in model.named_modules() if n.endswith("0.attn.core"))
        given = {}
        hook = core.register_forward_hook(  # the inputs the core is given, for its peak
            lambda module, args, out, given=given: given.update(qkv=[a.detach() for a in args[:3]]))
        with ActivationLedger(model) as ledger:
            model(mine, cpar.split_sequence(y, mesh.cp))
        hook.remove()
        kept = sum(e.nbytes for e in ledger.layer("layer0") if ".attn.core" in e.module)
        peak = _core_peak(core, given["qkv"], seed)
        model_bytes, ops = {"fwd": 0, "bwd": 0}, {}
        sent, measurable = {"fwd": 0, "bwd": 0}, {"fwd": 0, "bwd": 0}
        for e in events:
            model_bytes[e.phase] += e.model_bytes
            if e.op in MEASURABLE:
                measurable[e.phase] += e.model_bytes
                if e.sent_bytes is None or sent[e.phase] is None:
                    sent[e.phase] = None
                else:
                    sent[e.phase] += e.sent_bytes
            key = (e.phase, e.label.split(".")[-1], e.op)
            ops[key] = ops.get(key, 0) + 1
        out.append(VariantRun(name_of(comm, u), abs(loss - ref_loss.item()), grad_error,
                              model_bytes, sent, measurable, ops, kept, peak, events))
    return out


def _core_peak(core, qkv, seed: int) -> int:
    """The allocator's peak (bytes above what was allocated before) through the core's
    forward and backward on these inputs, with a fixed gradient for its output."""
    from ...memory.peak_allocated import peak_allocated

    q, k, v = (t.clone().requires_grad_() for t in qkv)
    g = torch.Generator(device=q.device).manual_seed(seed + 2)
    grad = torch.randn(q.shape, generator=g, dtype=q.dtype, device=q.device)
    return peak_allocated(lambda: core(q, k, v).backward(grad), q.device)[1]


def side_by_side(cfg, rows: int = 2, world_size: int = 4, seed: int = 0,
                 timeout: float = 120.0) -> list[list[VariantRun]]:
    """Every variant (`VARIANTS`) on ``Mesh(cp=world_size)``: per rank, one `VariantRun`
    each, in the order of `VARIANTS` (see the module)."""
    from ...runtime.launch import launch

    return list(launch(_in_rank, world_size, cfg, rows, seed, timeout=timeout))


def kept_model(comm: str, *, rows: int, seq_len: int, heads: int, head_dim: int, cp: int,
               bytes_per_value: int = 8) -> int:
    """MODEL: the bytes the written-out attention core of one layer keeps for backward on
    one cp rank (one K/V head per query head): `minitp.calc.cp_core_bytes`'s ``kept``,
    every term of it named there. One device (cp = 1, "a2a") keeps Q, K, V (the
    projection's one output), the s×s probabilities, the s×s causal mask (a byte each) and
    the scale; the hybrid keeps what the ring keeps (its ring runs on 1/U of the heads at
    U times the positions)."""
    from ...calc.footprint.cp_core_memory import cp_core_bytes

    u = 2 if comm == "a2a+ring" else None
    return cp_core_bytes(comm, rows=rows, seq_len=seq_len, heads=heads, head_dim=head_dim,
                         cp=cp, cp_a2a_size=u, bytes_per_value=bytes_per_value).kept
