"""Context parallelism's other attentions — all-gather (its K/V kept, or gathered again in
backward: TransformerEngine's), Ulysses (a2a) and the hybrid (a2a+ring) — equal one
device, and send what their byte model says.

* the rules: what each refuses, in one line (no processes);
* the hybrid's chunk order (no processes): the U ranks' chunks, put in ring order, are the
  load-balanced split of a ring of cp/U ranks;
* each attention alone against the plain causal core, at cp 2 and 4, with as many K/V
  heads as query heads, fewer (split over the all-to-all) and fewer than the all-to-all's
  ranks (replicated): outputs and q/k/v gradients in float64, and the bytes its trace
  records for one forward and one backward beside a formula written here, and beside
  `minitp.rules.cp_attention_bytes` (the MODEL calc reads); the collectives' measured
  bytes beside it too;
* the whole GPT through `mt.parallelize(cp_comm=...)`, GPT-2-style and Llama-style (GQA,
  RoPE), against the plain GPT: every step's loss, every gradient of the first, every
  parameter after 3 AdamW steps, float64 to 1e-10 — with tp (and SP), with pp and with
  recomputation in the mix for some — and its trace's cp bytes, the formula's;
* what each attention core keeps for backward (the ledger, measured) beside a formula:
  the ring 1/cp of Q, K, V; the all-gather K and V whole (gathered again: its own Q, K, V
  alone); Ulysses 1/cp of the heads.
"""

from __future__ import annotations

import re
import sys

import cloudpickle
import pytest
import torch
from helpers import random_batches, train_side_by_side

import minitp as mt
from minitp import context_parallel as cpar
from minitp.context_parallel.ulysses import from_ring_order, to_ring_order
from minitp.model import AttentionCore
from minitp.rules import cp_attention_bytes, cp_chunks, ulysses_kv_layout
from minitp.runtime import io_counters

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

TOLERANCE = 1e-10
GPT2 = dict(vocab_size=10, seq_len=16, n_layer=2, n_head=4, d_model=16)
LLAMA = dict(GPT2, norm="rmsnorm", positions="rope", mlp="swiglu", bias=False, n_kv_head=2)


# --------------------------------------------------------------------------- the rules
def test_the_rules_refuse_what_an_all_to_all_cannot_split():
    cfg = mt.GPTConfig(**GPT2)
    with pytest.raises(ValueError, match="not divisible by the all-to-all's 8 ranks"):
        mt.check_parallel_config(cfg, cp=8, cp_comm="a2a")  # 4 heads over 8 ranks
    with pytest.raises(ValueError, match="leaves 2 heads per rank, not divisible .* 4 ranks"):
        mt.check_parallel_config(cfg, cp=4, tp=2, cp_comm="a2a")  # tp first: 2 heads left
    with pytest.raises(ValueError, match="cp_a2a_size=3 does not divide cp=4"):
        mt.check_parallel_config(cfg, cp=4, cp_comm="a2a+ring", cp_a2a_size=3)
    with pytest.raises(ValueError, match="needs cp_a2a_size"):
        mt.check_parallel_config(cfg, cp=4, cp_comm="a2a+ring")
    with pytest.raises(ValueError, match="is the all-to-all group of cp_comm='a2a\\+ring'"):
        mt.check_parallel_config(cfg, cp=4, cp_comm="a2a", cp_a2a_size=2)
    with pytest.raises(ValueError, match="cp_comm must be one of ring, allgather, a2a"):
        mt.check_parallel_config(cfg, cp=2, cp_comm="p2p")
    # the ring and the all-gather never split heads: 4 heads at cp 8 are fine
    mt.check_parallel_config(mt.GPTConfig(**{**GPT2, "seq_len": 32}), cp=8, cp_comm="allgather")


@pytest.mark.parametrize("comm, size", [("a2a", None), ("allgather", None), ("a2a+ring", 1)])
def test_an_attention_other_than_the_ring_is_refused_at_cp_1(comm, size):
    """The library refuses what the CLI refuses (--cp-comm a2a without --cp), in the same
    words: at cp 1 no attention is split, so the request is a mistake, not a no-op."""
    with pytest.raises(ValueError, match=rf"^cp_comm='{re.escape(comm)}'.* needs cp > 1: without "
                                         "context parallelism no attention is split$"):
        mt.check_parallel_config(mt.GPTConfig(**GPT2), cp_comm=comm, cp_a2a_size=size)


def test_kv_heads_are_split_where_the_all_to_all_divides_them_else_replicated():
    wide = mt.GPTConfig(**{**LLAMA, "n_head": 12, "d_model": 24, "n_kv_head": 6})
    assert ulysses_kv_layout(wide, 1, 2) == "split"  # 6 K/V heads, 3 a rank
    assert ulysses_kv_layout(wide, 2, 3) == "split"  # tp first: 3 a tp rank, 1 a2a rank
    assert ulysses_kv_layout(mt.GPTConfig(**LLAMA), 1, 4) == "replicated"  # 2 heads, 4 ranks
    assert ulysses_kv_layout(mt.GPTConfig(**LLAMA), 2, 2) == "replicated"  # 1 a tp rank
    with pytest.raises(ValueError, match="leaves 6 K/V heads per rank: the all-to-all over 4"):
        mt.check_parallel_config(wide, cp=4, cp_comm="a2a")  # 12 heads split, 6 K/V not


# --------------------------------------------------------------------------- chunk order
@pytest.mark.parametrize("cp,u", [(2, 2), (4, 2), (4, 4), (8, 2), (8, 4)])
def test_a_groups_chunks_in_ring_order_are_the_split_of_a_ring_of_cp_over_u(cp, u):
    chunk = 3
    positions = torch.arange(2 * cp * chunk).reshape(1, 1, -1, 1)
    ring = cp // u
    for g in range(ring):  # an all-to-all group: its ranks' chunk pairs, in rank order
        arrived = torch.cat([positions[:, :, c * chunk:(c + 1) * chunk]
                             for r in range(g * u, (g + 1) * u) for c in cp_chunks(r, cp)], dim=2)
        ordered = to_ring_order(arrived, u)
        big = u * chunk  # the sequence cut into 2·ring big chunks: this group's two
        early, late = cp_chunks(g, ring)
        expected = torch.cat([positions[:, :, early * big:(early + 1) * big],
                              positions[:, :, late * big:(late + 1) * big]], dim=2)
        assert torch.equal(ordered, expected)
        assert torch.equal(from_ring_order(ordered, u), arrived)


# --------------------------------------------------------------------------- the byte model
def _bytes_by_hand(comm, rows, seq, heads, kv, dim, cp, u, w):
    """The formula, written here from the collectives each variant runs (per rank)."""
    per_head = rows * seq // cp * dim * w  # one head at this rank's s/cp positions
    if comm == "ring":
        m = kv * per_head
        return 2 * (cp - 1) * m, 2 * (cp - 1) * m + 2 * cp * m
    if comm == "allgather":  # all-gather K and V: each rank sends its share to cp−1 others
        return 2 * (cp - 1) * kv * per_head, 2 * (cp - 1) * kv * per_head  # bwd: reduce-scatter
    if comm == "allgather-regather":  # bwd: the all-gather again, then the reduce-scatter
        return 2 * (cp - 1) * kv * per_head, 4 * (cp - 1) * kv * per_head
    u = cp if comm == "a2a" else u
    sent_kv = kv if kv % u == 0 else u
    q_like = heads * per_head * (u - 1) // u  # Q (O, dO, dQ): all but 1/u of it leaves
    kv_like = sent_kv * per_head * (u - 1) // u
    fwd = bwd = 2 * q_like + 2 * kv_like
    ring = cp // u
    if ring > 1:  # each rank holds sent_kv/u heads at u·s/cp positions
        m = sent_kv // u * u * per_head
        fwd, bwd = fwd + 2 * (ring - 1) * m, bwd + 2 * (ring - 1) * m + 2 * ring * m
    return fwd, bwd


def test_the_byte_model_is_the_formula_and_the_ring_is_calcs():
    for comm, cp, u in (("ring", 4, None), ("allgather", 4, None), ("a2a", 4, None),
                        ("allgather-regather", 4, None),
                        ("a2a+ring", 4, 2), ("a2a+ring", 8, 2), ("a2a", 2, None)):
        for kv in (4, 2, 1):
            model = cp_attention_bytes(comm, rows=2, seq_len=64, heads=4, kv_heads=kv,
                                       head_dim=8, cp=cp, cp_a2a_size=u, bytes_per_value=8)
            assert (model["fwd"], model["bwd"]) == _bytes_by_hand(comm, 2, 64, 4, kv, 8, cp,
                                                                   u, 8), (comm, cp, u, kv)
    # the ring's is the calculator's (GPT-2: a K/V head per query head, one layer)
    cfg = mt.GPTConfig(**GPT2)
    ring = cp_attention_bytes("ring", rows=2, seq_len=16, heads=4, kv_heads=4, head_dim=4,
                              cp=4, bytes_per_value=8)
    assert ring["fwd"] + ring["bwd"] == mt.calc.cp_comm_bytes(cfg, 2, 4, bytes_per_value=8)
    # the hybrid's ends: an all-to-all over all of cp is a2a, over one rank the ring
    for kv in (4, 2, 1):
        kw = dict(rows=1, seq_len=64, heads=4, kv_heads=kv, head_dim=8, cp=4)
        assert cp_attention_bytes("a2a+ring", cp_a2a_size=4, **kw) == cp_attention_bytes(
            "a2a", **kw)
        assert cp_attention_bytes("a2a+ring", cp_a2a_size=1, **kw) == cp_attention_bytes(
            "ring", **kw)


# --------------------------------------------------------------------------- attention alone
# the hybrid at its ends too: an all-to-all over one rank (the ring) and over all of cp (a2a)
VARIANTS = [("ring", None), ("allgather", None), ("a2a", None), ("a2a+ring", 1),
            ("a2a+ring", 2), ("a2a+ring", 4), ("allgather-regather", None)]
B, H, T, D = 2, 4, 128, 32  # one all-to-all row at cp 4: 2·1·32·32 float64 values, 16 KiB


def _attention_alone():
    """On 4 ranks: cp 2 (dp 2) and cp 4, every variant (the hybrid's all-to-all over 1, 2
    and, at cp 4, 4 ranks), with 4, 2 and 1 K/V heads. Per case: the largest error of the
    output and of q, k, v's gradients against the plain core, and the trace's bytes per
    phase (model, measured)."""
    out = {}
    for sizes in ({"dp": 2, "cp": 2}, {"cp": 4}):
        mesh = mt.Mesh(**sizes)
        cp = mesh.cp
        for comm, u in VARIANTS:
            if u is not None and u > cp.size:
                continue
            axes = cpar.attention_axes(mesh, comm, u)
            for kv in (4, 2, 1):
                torch.manual_seed(kv)
                q, g = (torch.randn(B, H, T, D, dtype=torch.float64, device=mt.device())
                        for _ in range(2))
                k, v = (torch.randn(B, kv, T, D, dtype=torch.float64, device=mt.device())
                        for _ in range(2))
                ref = [t.clone().requires_grad_() for t in (q, k, v)]
                AttentionCore(0.0)(*ref).backward(g)
                mine = [cpar.split_sequence(t, cp, dim=2).requires_grad_() for t in (q, k, v)]
                before = len(mt.trace.events())
                if comm == "ring":
                    y = cpar.ring_attention(*mine, cp)
                elif comm.startswith("allgather"):
                    y = cpar.allgather_attention(*mine, cp, regather=comm != "allgather")
                else:
                    y = cpar.UlyssesAttention(axes[0], AttentionCore(0.0), axes[1])(*mine)
                y.backward(cpar.split_sequence(g, cp, dim=2))
                sent = {"fwd": [0, 0], "bwd": [0, 0]}
                for e in mt.trace.events()[before:]:
                    assert e.axis == "cp", e  # every byte of it is context parallelism's
                    sent[e.phase][0] += e.model_bytes
                    if e.op in ("all_gather", "reduce_scatter", "all_to_all"):  # unshared
                        measured = sent[e.phase][1]  # None: not counted (NCCL moves it)
                        sent[e.phase][1] = (None if None in (measured, e.sent_bytes)
                                            else measured + e.sent_bytes)
                errors = [(cpar.gather_sequence(y.detach(), cp, dim=2)
                           - AttentionCore(0.0)(q, k, v)).abs().max().item()]
                errors += [(cpar.gather_sequence(m.grad, cp, dim=2) - r.grad).abs().max().item()
                           for m, r in zip(mine, ref, strict=True)]
                out[(cp.size, comm, u, kv)] = (max(errors), sent)
    return out


@pytest.fixture(scope="module")
def alone():
    """Every rank's results of `_attention_alone`, one launch for the three tests below."""
    run = mt.launch(_attention_alone, 4, timeout=120)
    for result in run:
        assert len(result) == 6 * 3 + 7 * 3, sorted(result)  # hybrid over 4: cp 4 only
    return [(rank, key, *value) for rank, result in enumerate(run)
            for key, value in result.items()]


def _where(rank, cp, comm, u, kv):
    return f"rank {rank}, cp={cp}, {comm} (all-to-all over {u}), {kv} K/V heads"


def test_each_attention_equals_causal_attention(alone):
    for rank, key, error, _ in alone:
        assert error < TOLERANCE, f"{_where(rank, *key)}: differs by {error:.3g}"


def test_each_attention_sends_its_byte_model(alone):
    for rank, (cp, comm, u, kv), _, sent in alone:
        fwd, bwd = _bytes_by_hand(comm, B, T, H, kv, D, cp, u, 8)
        assert (sent["fwd"][0], sent["bwd"][0]) == (fwd, bwd), (_where(rank, cp, comm, u, kv),
                                                                 sent)
        model = cp_attention_bytes(comm, rows=B, seq_len=T, heads=H, kv_heads=kv,
                                   head_dim=D, cp=cp, cp_a2a_size=u, bytes_per_value=8)
        assert model == {"fwd": fwd, "bwd": bwd}, _where(rank, cp, comm, u, kv)


@pytest.mark.skipif(not io_counters.available(), reason="no /proc/self/io: nothing measured")
def test_the_collectives_measured_bytes_are_their_model(alone):
    """The all-gather's and the all-to-all's bytes as the kernel counted them (the ring's
    sends overlap, so no window of theirs is measured alone: `io_counters.Window`)."""
    for rank, (cp, comm, u, kv), _, sent in alone:
        if comm not in ("allgather", "allgather-regather", "a2a"):
            continue
        if None in (sent["fwd"][1], sent["bwd"][1]):
            pytest.skip("the ranks ran on GPUs: NCCL's bytes are not the process's writes")
        fwd, bwd = _bytes_by_hand(comm, B, T, H, kv, D, cp, u, 8)
        # gloo's reduce-scatter is no ring: it sends an all-reduce's bytes, twice the ring
        # model (tests/runtime/test_wire_bytes.py); NCCL's would send the model
        reduce_scatter = fwd if comm.startswith("allgather") else 0  # dK, dV: K, V's bytes
        on_gloo = bwd + reduce_scatter
        for phase, expected in (("fwd", fwd), ("bwd", on_gloo)):
            measured = sent[phase][1]  # gloo adds a few dozen header bytes a message
            assert expected <= measured <= 1.02 * expected, (
                _where(rank, cp, comm, u, kv), phase, measured, expected)


# --------------------------------------------------------------------------- the GPT
def _batches(steps, cfg, batch):
    """Ignored targets unevenly over the chunks, so unevenly over cp ranks."""
    return random_batches(steps, cfg, batch, ignored=((0, slice(0, 5)), (-1, slice(-3, None))),
                          device=mt.device())


def _compare(configs, steps=3):
    """Per (mesh sizes, model, parallelize kwargs, microbatches): the plain GPT and the
    parallel one side by side; the errors, and the cp attention's bytes of the first step."""
    results = []
    for sizes, arch, kwargs, m in configs:
        mesh = mt.Mesh(**sizes)
        cfg = mt.GPTConfig(**arch)
        torch.manual_seed(0)
        ref = mt.GPT(cfg).to(device=mt.device(), dtype=torch.float64)
        model = mt.parallelize(ref, mesh, **kwargs)
        first = {"bytes": 0, "grad_error": None}

        def record(step, events, first=first, ref=ref, model=model):
            if step:
                return
            first["bytes"] = sum(e.model_bytes for e in events
                                 if e.axis == "cp" and not e.label.endswith("cp loss"))
            first["grad_error"] = _worst_grad(model, ref)

        loss_error, param_error, _ = train_side_by_side(
            ref, model, mesh, _batches(steps, cfg, batch=2 * sizes.get("dp", 1)),
            microbatches=m, after_step=record)
        results.append((loss_error, first["grad_error"], param_error, first["bytes"]))
    return results


def _worst_grad(model, ref):
    """(the largest difference of any gradient, its parameter's name)."""
    grads = model.full_grad_dict()
    return max(((grads[n] - p.grad).abs().max().item(), n) for n, p in ref.named_parameters())


def _check(run, configs):
    for rank, results in enumerate(run):
        for (sizes, arch, kwargs, m), (loss_error, grad_error, param_error, sent) in zip(
                configs, results, strict=True):
            where = f"rank {rank}, {sizes}, {kwargs}, microbatches={m}"
            assert loss_error < TOLERANCE, f"{where}: loss differs by {loss_error:.3g}"
            assert grad_error[0] < TOLERANCE, f"{where}: grad of {grad_error[1]} differs"
            assert param_error[0] < TOLERANCE, f"{where}: {param_error[1]} differs"
            cfg = mt.GPTConfig(**arch)
            tp, pp = sizes.get("tp", 1), sizes.get("pp", 1)
            kv = cfg.kv_heads // tp if cfg.kv_heads % tp == 0 else 1
            one = _bytes_by_hand(kwargs["cp_comm"], 2 // m, cfg.seq_len, cfg.n_head // tp, kv,
                                 cfg.head_dim, sizes["cp"], kwargs.get("cp_a2a_size"), 8)
            # recomputation runs the attention's forward again, in backward
            again = one[0] if kwargs.get("recompute") else 0
            layers = cfg.n_layer // pp  # each layer this rank holds, each microbatch
            assert sent == (sum(one) + again) * layers * m, (where, sent, one)


CONFIGS = {
    "cp2": [({"cp": 2}, GPT2, {"cp_comm": "a2a"}, 1),
            ({"cp": 2}, LLAMA, {"cp_comm": "allgather", "recompute": "selective"}, 2),
            ({"cp": 2}, {**LLAMA, "n_kv_head": 1}, {"cp_comm": "a2a"}, 1),  # K/V replicated
            ({"cp": 2}, {**GPT2, "attention": "sdpa"}, {"cp_comm": "allgather"}, 1),
            ({"cp": 2}, {**LLAMA, "attention": "sdpa"}, {"cp_comm": "a2a"}, 1),
            ({"cp": 2}, LLAMA, {"cp_comm": "allgather-regather"}, 2)],
    "cp4": [({"cp": 4}, LLAMA, {"cp_comm": "a2a", "recompute": "full"}, 1),  # 2 K/V over 4
            ({"cp": 4}, GPT2, {"cp_comm": "allgather"}, 1),
            ({"cp": 4}, LLAMA, {"cp_comm": "a2a+ring", "cp_a2a_size": 2}, 1)],
    "cp_tp": [({"cp": 2, "tp": 2}, GPT2, {"cp_comm": "a2a", "sequence_parallel": True}, 1),
              ({"cp": 2, "tp": 2}, LLAMA, {"cp_comm": "allgather"}, 1),
              ({"cp": 2, "tp": 2}, GPT2, {"cp_comm": "allgather-regather",
                                          "sequence_parallel": True}, 1),
              # one K/V head a tp rank (split over tp), copied to both all-to-all ranks
              ({"cp": 2, "tp": 2}, LLAMA, {"cp_comm": "a2a"}, 1),
              # one K/V head in all: replicated over tp, then over the all-to-all
              ({"cp": 2, "tp": 2}, {**LLAMA, "n_kv_head": 1}, {"cp_comm": "a2a"}, 1)],
    "pp_cp": [({"pp": 2, "cp": 2}, LLAMA, {"cp_comm": "a2a"}, 2),
              ({"pp": 2, "cp": 2}, GPT2, {"cp_comm": "allgather"}, 2)],
    # 8 ranks: the hybrid beside tp (K/V: one a tp rank, copied to the all-to-all's two)
    # and in a pipeline
    "hybrid8": [({"cp": 4, "tp": 2}, LLAMA, {"cp_comm": "a2a+ring", "cp_a2a_size": 2,
                                           "sequence_parallel": True}, 1),
                ({"pp": 2, "cp": 4}, GPT2, {"cp_comm": "a2a+ring", "cp_a2a_size": 2}, 2)],
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_gpt_equals_plain_gpt(name):
    configs = CONFIGS[name]
    world = max(len(mt.layout(**c[0])["tp"]) * c[0].get("tp", 1) for c in configs)
    _check(mt.launch(_compare, world, configs, timeout=120), configs)


# --------------------------------------------------------------------------- memory
def _core_bytes():
    """The bytes the attention core of layer 0 keeps for backward on this rank (the
    ledger, measured), GPT-2 with the written-out core, for each variant at cp 1, 2, 4."""
    out = {}
    for sizes in ({"dp": 4}, {"dp": 2, "cp": 2}, {"cp": 4}):
        mesh = mt.Mesh(**sizes)
        for comm in ("ring", "allgather", "a2a", "allgather-regather"):
            torch.manual_seed(0)
            cfg = mt.GPTConfig(**{**GPT2, "seq_len": 32})
            model = mt.GPT(cfg).to(device=mt.device(), dtype=torch.float64)
            cpar.apply_context_parallel(model, mesh.cp, comm, cpar.attention_axes(mesh, comm))
            x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), device=mt.device())
            x = cpar.split_sequence(x, mesh.cp)
            with mt.memory.ActivationLedger(model) as ledger:
                model(x, x)
            out[(mesh.cp.size, comm)] = sum(e.nbytes for e in ledger.layer("layer0")
                                            if ".attn.core" in e.module)
    return out


def test_what_each_attention_keeps_for_backward():
    b, s, h, hs, w = 2, 32, GPT2["n_head"], GPT2["d_model"] // GPT2["n_head"], 8
    qkv, probs, mask = 3 * b * h * s * hs * w, b * h * s * s * w, s * s  # one device's
    for result in mt.launch(_core_bytes, 4, timeout=60):
        for comm in ("ring", "allgather", "a2a"):
            assert result[(1, comm)] == qkv + probs + mask + 8  # (8: the scale, a scalar)
        for cp in (2, 4):
            keeps = {
                # Q, K, V (the projection's one output), O and the log-sum-exp, at s/cp
                "ring": qkv // cp + qkv // 3 // cp + b * h * s // cp * w,
                # K and V whole; Q, the probabilities and the mask's rows at s/cp
                "allgather": qkv // 3 // cp + 2 * qkv // 3 + probs // cp + mask // cp + 8,
                # whole sequences of h/cp heads: 1/cp of everything but the s×s mask
                "a2a": (qkv + probs) // cp + mask + 8,
                # checkpointed: its inputs alone, Q, K, V at s/cp (one storage), and
                # the scale
                "allgather-regather": qkv // cp + 8,
            }
            for comm, expected in keeps.items():
                assert result[(cp, comm)] == expected, (cp, comm, result[(cp, comm)], expected)
