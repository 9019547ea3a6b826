"""Column/row-parallel linears, the vocab-parallel embedding and the vocab-parallel
cross-entropy equal their dense versions, forward and backward, in float64.

A small network uses all four: embedding -> column -> GELU -> row (+ residual) ->
tied output projection -> loss, with a vocabulary the TP size does not divide
and some ignored targets, with and without sequence parallelism.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minitp as mt
from minitp.sharding.tags import tag
from minitp.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from minitp.tensor_parallel.loss import vocab_parallel_cross_entropy

VOCAB, HIDDEN, BATCH = 10, 12, 2  # 10 is not a multiple of 3 or 4: the vocabulary is padded
TOLERANCE = 1e-12


def _tiny_network_errors(sequence_parallel):
    axis = mt.world()
    t = axis.size
    torch.manual_seed(0)  # the same dense weights and data on every rank
    seq = 4 * t
    emb = nn.Embedding(VOCAB, HIDDEN).double()
    fc, proj = nn.Linear(HIDDEN, 4 * HIDDEN).double(), nn.Linear(4 * HIDDEN, HIDDEN).double()
    ids = torch.randint(0, VOCAB, (BATCH, seq))
    targets = torch.randint(0, VOCAB, (BATCH, seq))
    targets[0, :3] = -100

    x = emb(ids)
    h = proj(F.gelu(fc(x))) + x
    dense_loss = F.cross_entropy((h @ emb.weight.T).reshape(-1, VOCAB), targets.reshape(-1))
    dense_loss.backward()

    p_emb = VocabParallelEmbedding.from_dense(emb, axis)
    p_fc = ColumnParallelLinear.from_dense(fc, axis, sequence_parallel=sequence_parallel)
    p_proj = RowParallelLinear.from_dense(proj, axis, sequence_parallel=sequence_parallel)
    x = p_emb(ids)
    if sequence_parallel:
        x = mt.mappings.scatter_to_sequence(x, axis)  # (B, T/t, C)
    h = p_proj(F.gelu(p_fc(x))) + x
    if sequence_parallel:
        h = mt.mappings.gather_from_sequence(h, axis, grad_is_partial=False)  # f sums below
    logits = mt.mappings.copy_to_parallel(h, axis) @ p_emb.weight.T  # (B, T, V'/t)
    loss = vocab_parallel_cross_entropy(logits, targets, axis, vocab_size=VOCAB)
    loss.backward()

    bias_grad = p_proj.bias.grad
    if sequence_parallel:  # each rank saw only its sequence shard: sum the partial gradients
        assert tag(p_proj.bias, "grad_partial_over_tp")
        bias_grad = mt.comm.all_reduce(bias_grad, axis)
    real, start = p_emb.real_rows, p_emb.vocab_start
    return {
        "loss": abs(loss.item() - dense_loss.item()),
        "embedding grad": (p_emb.weight.grad[:real] - emb.weight.grad[start:start + real])
        .abs().max().item(),
        "padding rows grad": p_emb.weight.grad[real:].abs().max().item() if real < len(
            p_emb.weight) else 0.0,
        "column weight grad": (p_fc.weight.grad - fc.weight.grad.chunk(t)[axis.rank])
        .abs().max().item(),
        "column bias grad": (p_fc.bias.grad - fc.bias.grad.chunk(t)[axis.rank]).abs().max().item(),
        "row weight grad": (p_proj.weight.grad - proj.weight.grad.chunk(t, 1)[axis.rank])
        .abs().max().item(),
        "row bias grad": (bias_grad - proj.bias.grad).abs().max().item(),
        "padded": p_emb.padded_vocab,
    }


@pytest.mark.parametrize("tp", [1, 2, 3, 4])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_parallel_layers_equal_dense(tp, sequence_parallel):
    run = mt.launch(_tiny_network_errors, tp, sequence_parallel, timeout=60)
    for rank, errors in enumerate(run):
        assert errors.pop("padded") == -(-VOCAB // tp) * tp
        for name, error in errors.items():
            assert error < TOLERANCE, f"rank {rank}: {name} differs by {error:.3g}"


def _loss_without_padding_info():
    axis = mt.world()
    logits = torch.zeros(2, 3, dtype=torch.float64)
    targets = torch.zeros(2, 2, dtype=torch.long)
    vocab_parallel_cross_entropy(logits, targets, axis)


def test_loss_rejects_mismatched_shapes():
    with pytest.raises(mt.LaunchError, match="targets must have the logits' shape"):
        mt.launch(_loss_without_padding_info, 2, timeout=30)


def _indivisible_column():
    ColumnParallelLinear(8, 10, mt.world())


def test_indivisible_features_raise_a_clear_error():
    with pytest.raises(mt.LaunchError, match="d_out=10 is not divisible by the world size 4"):
        mt.launch(_indivisible_column, 4, timeout=30)
