"""Packed batches (x, y, positions) through `mt.parallelize` equal one device in float64,
on a sample of meshes (not every one): tp 2 with sequence parallelism, cp 2 with each of
the ring, the all-gather and Ulysses (a2a), cp 4 with the hybrid (a2a+ring), cp 2 beside
tp 2, a pipeline of 2, ZeRO-3 over dp 2 — GPT-2-style (learned positions) and Llama-style
(RoPE, GQA), the attention written out and sdpa's. Every step's loss, every gradient of
the first step (but under ZeRO-3, whose gradients are shards) and every parameter after 3
AdamW steps, to 1e-10.

The batches are packed documents of uneven lengths, their last row half padding: the cp
ranks hold different numbers of real targets (checked here, so the weighting is tested),
and the loss must weigh each rank by them."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
from helpers import train_side_by_side

import minitp as mt
from minitp.data.packing import pack
from minitp.rules import IGNORE_INDEX, cp_chunks

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

TOLERANCE = 1e-10
GPT2 = dict(vocab_size=10, seq_len=16, n_layer=2, n_head=4, d_model=16)
LLAMA = dict(GPT2, norm="rmsnorm", positions="rope", mlp="swiglu", bias=False, n_kv_head=2)


def packed_batches(steps: int, cfg, rows: int):
    """`steps` packed batches of `rows` rows: documents of 1 to 12 tokens, the last row
    padded from its middle on (so its late chunks hold no real target)."""
    generator = torch.Generator().manual_seed(2)
    batches = []
    for _ in range(steps):
        width, documents, total = cfg.seq_len + 1, [], 0
        while total < (rows - 1) * width + width // 2:
            n = int(torch.randint(1, 13, (1,), generator=generator))
            n = min(n, (rows - 1) * width + width // 2 - total)
            documents.append(torch.randint(0, cfg.vocab_size, (n,), generator=generator))
            total += n
        x, y, positions = pack(documents, cfg.seq_len)
        assert x.shape[0] == rows
        batches.append(tuple(t.to(mt.device()) for t in (x, y, positions)))
    return batches


def test_the_cp_ranks_hold_different_numbers_of_real_targets():
    """What makes the loss's weighting matter: at cp 2, rank 1 (chunks 1 and 2) and rank 0
    (chunks 0 and 3) count different targets — a mean of their means would be wrong."""
    _, y, _ = packed_batches(1, mt.GPTConfig(**GPT2), rows=2)[0]
    chunks = y.chunk(4, dim=1)
    counts = [sum(int((chunks[c] != IGNORE_INDEX).sum()) for c in cp_chunks(r, 2))
              for r in range(2)]
    assert counts[0] != counts[1], counts


def _compare(configs, steps=3):
    results = []
    for sizes, arch, kwargs, m in configs:
        mesh = mt.Mesh(**sizes)
        cfg = mt.GPTConfig(**arch)
        torch.manual_seed(0)
        ref = mt.GPT(cfg).to(device=mt.device(), dtype=torch.float64)
        model = mt.parallelize(ref, mesh, **kwargs)
        first = {"grad": None}  # ZeRO-3 keeps gradient shards: its parameters are compared
        zero = kwargs.get("zero_stage", 0)

        def record(step, events, first=first, ref=ref, model=model, zero=zero):
            if step == 0 and not zero:
                grads = model.full_grad_dict()
                first["grad"] = max(((grads[n] - p.grad).abs().max().item(), n)
                                    for n, p in ref.named_parameters())

        batches = packed_batches(steps, cfg, rows=2 * m * sizes.get("dp", 1))
        loss_error, param_error, _ = train_side_by_side(ref, model, mesh, batches,
                                                        microbatches=m, after_step=record)
        results.append((loss_error, first["grad"], param_error))
    return results


CONFIGS = {
    "cp2": [({"cp": 2}, GPT2, {"cp_comm": "ring"}, 1),
            ({"cp": 2}, {**LLAMA, "attention": "sdpa"}, {"cp_comm": "allgather"}, 1),
            ({"cp": 2}, LLAMA, {"cp_comm": "a2a", "recompute": "selective"}, 1),
            ({"cp": 2}, {**GPT2, "attention": "sdpa"}, {"cp_comm": "ring"}, 1)],
    "tp_pp_zero": [({"tp": 2}, GPT2, {"sequence_parallel": True}, 1),
                   ({"tp": 2}, {**LLAMA, "attention": "sdpa"}, {"sequence_parallel": True}, 1),
                   ({"pp": 2}, LLAMA, {"recompute": "full"}, 2),
                   ({"dp": 2}, GPT2, {"zero_stage": 3}, 1)],
    "cp4": [({"cp": 4}, LLAMA, {"cp_comm": "a2a+ring", "cp_a2a_size": 2}, 1),
            ({"cp": 2, "tp": 2}, GPT2, {"cp_comm": "ring", "sequence_parallel": True}, 1)],
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_packed_batches_equal_one_device(name):
    configs = CONFIGS[name]
    world = max(len(mt.layout(**c[0])["tp"]) * c[0].get("tp", 1) for c in configs)
    for rank, results in enumerate(mt.launch(_compare, world, configs, timeout=120)):
        for (sizes, _, kwargs, m), (loss_error, grad_error, param_error) in zip(
                configs, results, strict=True):
            where = f"rank {rank}, {sizes}, {kwargs}, microbatches={m}"
            assert loss_error < TOLERANCE, f"{where}: loss differs by {loss_error:.3g}"
            if grad_error is not None:
                assert grad_error[0] < TOLERANCE, f"{where}: grad of {grad_error[1]} differs"
            assert param_error[0] < TOLERANCE, f"{where}: {param_error[1]} differs"
