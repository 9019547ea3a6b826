"""The tensor-parallel layers and loss refuse bad input clearly, and keep the
invariants that the equivalence tests take for granted.

* A target id outside [0, V) (other than the ignore index) is a ValueError that
  names it, raised on every rank alike, rather than an `inf` loss (an id in the
  padded columns) or a silent, finite, wrong one (an id past the padding). An
  input id outside [0, V) of the vocab-parallel embedding likewise.
* Local logits must be the equal padded shard: ceil(V/t) columns on every rank.
  The checks add no collective that the trace records.
* With every target ignored, the loss and the logits' gradient are what
  ``F.cross_entropy`` gives on one device: a NaN loss (0/0) and zero gradients.
* The direct constructors, under one seed, give each rank its slice of one dense
  initialisation (Megatron-LM's test_initialization invariant).
* The layers declare their parameters' tags through `minitp.sharding.tags`.

Proofs run on real processes against single-device float64 references.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import minitp as mt
from minitp.rules import IGNORE_INDEX
from minitp.runtime.mesh import Axis
from minitp.sharding import tags
from minitp.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from minitp.tensor_parallel.loss import vocab_parallel_cross_entropy

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

TOLERANCE = 1e-12
VOCAB = 5  # at t=2: columns 0..2 on rank 0, 3..5 on rank 1, of which 5 is padding


def _padded_width(vocab: int, t: int) -> int:
    return -(-vocab // t)


def _local_logits(vocab: int, rows: int, axis, seed: int = 0) -> torch.Tensor:
    """This rank's columns of (rows, V') float64 logits, the same full table on every rank."""
    width = _padded_width(vocab, axis.size)
    full = torch.randn(rows, width * axis.size, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64).to(mt.device())
    return full[:, axis.rank * width:(axis.rank + 1) * width].clone().requires_grad_()


# --------------------------------------------------------------------------- target ids
def _loss_of_targets(targets: list[int], vocab_size, catch: bool):
    """The loss of `targets` on every rank; with `catch`, the error each rank raised."""
    axis = mt.world()
    logits = _local_logits(VOCAB, len(targets), axis)
    ids = torch.tensor(targets, device=mt.device())
    if not catch:
        return vocab_parallel_cross_entropy(logits, ids, axis, vocab_size=vocab_size).item()
    try:
        vocab_parallel_cross_entropy(logits, ids, axis, vocab_size=vocab_size)
    except ValueError as error:
        return str(error)
    return None


# An id in the padded columns (5), one past them (6, 9), and a negative one that is
# not the ignore index (-1), each among ignored and valid targets.
@pytest.mark.parametrize("bad", [5, 6, 9, -1])
def test_a_target_outside_the_vocabulary_is_refused(bad):
    with pytest.raises(mt.LaunchError) as caught:
        mt.launch(_loss_of_targets, 2, [0, IGNORE_INDEX, bad, 4], VOCAB, False, timeout=60)
    message = str(caught.value)
    assert f"target id {bad} is outside the vocabulary" in message, message
    assert f"[0, {VOCAB}) or the ignore index {IGNORE_INDEX}" in message, message


def test_every_rank_refuses_the_same_target_alike():
    # Every rank sees the same targets, so every rank raises the same error before any
    # collective: none is left waiting in an all-reduce for a rank that gave up.
    run = mt.launch(_loss_of_targets, 4, [1, 7, 3], VOCAB, True, timeout=60)
    expected = f"target id 7 is outside the vocabulary: it must be in [0, {VOCAB}) " \
               f"or the ignore index {IGNORE_INDEX}"
    assert list(run) == [expected] * 4


def test_without_vocab_size_the_padded_width_is_the_vocabulary():
    # vocab_size=None: every column is real, V = width·t = 6; id 5 is a real target there,
    # and 6 is the first id outside.
    run = mt.launch(_loss_of_targets, 2, [5, 6], None, True, timeout=60)
    assert list(run) == ["target id 6 is outside the vocabulary: it must be in [0, 6) "
                         f"or the ignore index {IGNORE_INDEX}"] * 2
    run = mt.launch(_loss_of_targets, 2, [5, 0], None, False, timeout=60)
    logits = torch.randn(2, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    expected = F.cross_entropy(logits, torch.tensor([5, 0])).item()
    assert all(abs(loss - expected) < TOLERANCE for loss in run), (list(run), expected)


def _embedding_of_ids(ids: list[int], catch: bool):
    axis = mt.world()
    torch.manual_seed(0)
    embedding = VocabParallelEmbedding(VOCAB, 4, axis, dtype=torch.float64, device=mt.device())
    tokens = torch.tensor([ids], device=mt.device())
    if not catch:
        return embedding(tokens)
    try:
        embedding(tokens)
    except ValueError as error:
        return str(error)
    return None


@pytest.mark.parametrize("bad", [5, 9, -1, IGNORE_INDEX])
def test_an_input_id_outside_the_vocabulary_is_refused(bad):
    # 5 is a padding row (zeros): looked up, it would be a silent zero embedding.
    # The ignore index means nothing for inputs: it is refused like any other.
    with pytest.raises(mt.LaunchError) as caught:
        mt.launch(_embedding_of_ids, 2, [0, bad, 4], False, timeout=60)
    message = str(caught.value)
    assert f"input id {bad} is outside the vocabulary: it must be in [0, {VOCAB})" in message, \
        message
    run = mt.launch(_embedding_of_ids, 2, [3, bad], True, timeout=60)
    assert run[0] == run[1] and f"input id {bad} is outside the vocabulary" in run[0], list(run)


# --------------------------------------------------------------------------- logit widths
def _loss_of_widths(widths: list[int], vocab_size, catch: bool):
    """Logits `widths[rank]` wide on each rank, targets all 0."""
    axis = mt.world()
    logits = torch.zeros(3, widths[axis.rank], dtype=torch.float64, device=mt.device())
    targets = torch.zeros(3, dtype=torch.long, device=mt.device())
    if not catch:
        return vocab_parallel_cross_entropy(logits, targets, axis, vocab_size=vocab_size).item()
    try:
        vocab_parallel_cross_entropy(logits, targets, axis, vocab_size=vocab_size)
    except ValueError as error:
        return str(error)
    return None


def test_logits_narrower_than_the_padded_shard_are_refused():
    # vocab 250 at tp 4: every rank holds ceil(250/4) = 63 columns (252 in all). Rank 2
    # holding 61 would shift every later id by 2 columns; it must be refused.
    with pytest.raises(mt.LaunchError) as caught:
        mt.launch(_loss_of_widths, 4, [63, 63, 61, 63], 250, False, timeout=60)
    assert caught.value.rank == 2
    message = str(caught.value)
    assert "logits are 61 wide on rank 2 of world" in message, message
    assert "a vocabulary of 250 split over 4 ranks needs ceil(250/4) = 63 columns" in message, \
        message


def test_logits_of_one_wrong_width_everywhere_are_refused():
    # every rank equally wide, but not ceil(V/t): 6 wide at vocab 10 over 2 ranks (5 each)
    run = mt.launch(_loss_of_widths, 2, [6, 6], 10, True, timeout=60)
    for rank, message in enumerate(run):
        assert message is not None and f"logits are 6 wide on rank {rank} of world" in message
        assert "a vocabulary of 10 split over 2 ranks needs ceil(10/2) = 5 columns" in message


def test_logits_of_unequal_widths_without_vocab_size_are_refused_on_every_rank():
    run = mt.launch(_loss_of_widths, 4, [3, 3, 2, 3], None, True, timeout=60)
    expected = ("logits of unequal widths over world: between 2 and 3 columns; every rank must "
                "hold an equal share of the (padded) vocabulary")
    assert list(run) == [expected] * 4


def _loss_collectives(vocab_size):
    axis = mt.world()
    logits = _local_logits(VOCAB, 4, axis)
    targets = torch.tensor([0, 4, IGNORE_INDEX, 2], device=mt.device())
    if vocab_size is None:
        targets = targets.masked_fill(targets == 4, 5)  # every column is real
    mt.trace.clear()
    loss = vocab_parallel_cross_entropy(logits, targets, axis, vocab_size=vocab_size)
    forward = [(e.op, e.phase) for e in mt.trace.events() if e.is_comm]
    mt.trace.clear()
    loss.backward()
    backward = [(e.op, e.phase) for e in mt.trace.events() if e.is_comm]
    return forward, backward


@pytest.mark.parametrize("vocab_size", [VOCAB, None])
def test_the_checks_add_no_recorded_collective(vocab_size):
    # the loss still records exactly its three all-reduces (max, target logit, sum of
    # exp) forward and nothing backward: what the trace tests and exercise 04 count
    run = mt.launch(_loss_collectives, 2, vocab_size, timeout=60)
    for forward, backward in run:
        assert forward == [("all_reduce", "fwd")] * 3
        assert backward == []


# --------------------------------------------------------------------------- all ignored
def _all_ignored(t_rows: int):
    axis = mt.world()
    logits = _local_logits(VOCAB, t_rows, axis, seed=3)
    targets = torch.full((t_rows,), IGNORE_INDEX, device=mt.device())
    loss = vocab_parallel_cross_entropy(logits, targets, axis, vocab_size=VOCAB)
    loss.backward()
    return loss.item(), logits.grad.cpu()


def test_every_target_ignored_gives_what_cross_entropy_gives():
    run = mt.launch(_all_ignored, 2, 4, timeout=60)
    full = torch.randn(4, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    reference = full[:, :VOCAB].clone().requires_grad_()
    expected = F.cross_entropy(reference, torch.full((4,), IGNORE_INDEX), ignore_index=IGNORE_INDEX)
    expected.backward()
    assert math.isnan(expected.item())  # mean over no tokens: 0/0, on one device too
    grad = torch.cat([reference.grad, torch.zeros(4, 1, dtype=torch.float64)], dim=1)
    for rank, (loss, local_grad) in enumerate(run):
        assert math.isnan(loss), f"rank {rank}: loss {loss}, F.cross_entropy gives nan"
        assert torch.equal(local_grad, grad[:, 3 * rank:3 * (rank + 1)]), local_grad
        assert torch.equal(local_grad, torch.zeros_like(local_grad))


# --------------------------------------------------------------------------- initialisation
def _dense_init(*shape):
    """What the single-device layer starts from: N(0, 0.02²) (GPT-2 and Megatron-LM)."""
    return torch.nn.init.normal_(torch.empty(shape, dtype=torch.float64, device=mt.device()),
                                 std=0.02)


def _initial_shards(seed: int, vocab: int, d_in: int, d_out: int):
    axis = mt.world()
    gather = mt.comm.all_gather
    kw = dict(dtype=torch.float64, device=mt.device())
    found = {}

    torch.manual_seed(seed)
    column = ColumnParallelLinear(d_in, d_out, axis, **kw)
    after = torch.rand(1, dtype=torch.float64, device=mt.device())
    torch.manual_seed(seed)
    dense = _dense_init(d_out, d_in)
    found["column weight"] = torch.equal(gather(column.weight.detach(), axis, dim=0), dense)
    found["column bias"] = torch.equal(gather(column.bias.detach(), axis, dim=0),
                                       torch.zeros(d_out, **kw))
    found["column rng after"] = torch.equal(after, torch.rand(1, **kw))

    torch.manual_seed(seed)
    row = RowParallelLinear(d_out, d_in, axis, **kw)
    torch.manual_seed(seed)
    dense = _dense_init(d_in, d_out)
    found["row weight"] = torch.equal(gather(row.weight.detach(), axis, dim=1), dense)
    found["row bias"] = torch.equal(row.bias.detach(), torch.zeros(d_in, **kw))

    torch.manual_seed(seed)
    embedding = VocabParallelEmbedding(vocab, d_in, axis, **kw)
    torch.manual_seed(seed)
    dense = _dense_init(vocab, d_in)
    table = gather(embedding.weight.detach(), axis, dim=0)
    found["embedding weight"] = torch.equal(table[:vocab], dense)
    found["embedding padding"] = bool((table[vocab:] == 0).all())
    # the default generator stays replicated across the ranks (plain dropout relies on it)
    found["rng replicated"] = len(set(gather(torch.rand(1, **kw), axis).tolist())) == 1
    return found


@pytest.mark.parametrize("t", [2, 4])
def test_direct_constructors_shard_one_dense_initialisation(t):
    run = mt.launch(_initial_shards, t, 1234, 10, 6, 8, timeout=60)
    for rank, found in enumerate(run):
        assert all(found.values()), f"rank {rank}: {found}"


# --------------------------------------------------------------------------- tags
def _axis(rank: int = 1, size: int = 2) -> Axis:
    return Axis("tp", tuple(range(size)), rank)  # no process group: nothing communicates


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_layers_declare_their_tags(sequence_parallel):
    axis = _axis()
    column = ColumnParallelLinear(6, 8, axis, sequence_parallel=sequence_parallel)
    row = RowParallelLinear(8, 6, axis, sequence_parallel=sequence_parallel)
    embedding = VocabParallelEmbedding(VOCAB, 6, axis, sequence_parallel=sequence_parallel)
    expected = {
        column.weight: (0, None, False), column.bias: (0, None, False),
        row.weight: (1, None, False),
        # added to each rank's own sequence shard: each rank's gradient is one term
        row.bias: (None, None, sequence_parallel),
        embedding.weight: (0, VOCAB, False),
    }
    for param, (split_dim, true_size, partial) in expected.items():
        assert tags.tag(param, "tp_split_dim") == split_dim
        assert tags.tag(param, "tp_true_size") == true_size
        assert tags.tag(param, "grad_partial_over_tp") is partial
        assert not hasattr(param, "sequence_parallel")  # the old name is gone
    # declared through set_tags: a second declaration is refused
    with pytest.raises(RuntimeError, match="'tp_split_dim' is already set"):
        tags.set_tags(column.weight, tp_split_dim=1)


def test_from_dense_keeps_the_tags():
    axis = _axis()
    row = RowParallelLinear.from_dense(torch.nn.Linear(8, 6), axis, sequence_parallel=True)
    embedding = VocabParallelEmbedding.from_dense(torch.nn.Embedding(VOCAB, 6), axis)
    assert tags.tag(row.weight, "tp_split_dim") == 1
    assert tags.tag(row.bias, "grad_partial_over_tp") is True
    assert tags.tag(embedding.weight, "tp_true_size") == VOCAB


# --------------------------------------------------------------------------- the whole model
TINY = dict(vocab_size=10, seq_len=8, n_layer=2, n_head=2, d_model=8)


@pytest.mark.parametrize("bad", [10, 12, -1, -7])
def test_the_plain_gpt_refuses_a_target_outside_the_vocabulary(bad):
    model = mt.GPT(mt.GPTConfig(**TINY)).to(mt.device())
    x = torch.zeros(2, 8, dtype=torch.long, device=mt.device())
    y = torch.ones_like(x)
    y[1, 3] = bad
    with pytest.raises(ValueError, match=rf"target id {bad} is outside the vocabulary"):
        model(x, y)
    y[1, 3] = IGNORE_INDEX  # the ignore index is a valid target
    assert torch.isfinite(model(x, y)[1])


ID_DTYPES = [torch.int32, torch.int16, torch.uint8]


def _refusal(fn, *args, **kwargs) -> str:
    """What `fn(*args, **kwargs)` raised, as "TypeError: message" (or "none")."""
    try:
        fn(*args, **kwargs)
    except (TypeError, ValueError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"
    return "none"


def _id_dtype_refusals(pp: int, tp: int, sequence_parallel: bool) -> dict:
    """Every way a parallel model meets a batch of ids of another integer dtype."""
    mesh = mt.Mesh(pp=pp, tp=tp)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(mt.GPTConfig(**TINY)).to(mt.device()), mesh,
                           sequence_parallel=sequence_parallel)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = {}
    for dtype in ID_DTYPES:
        x = torch.ones(4, 8, dtype=torch.long, device=mt.device())
        seen[str(dtype)] = tuple(
            _refusal(mt.train_step, model, batch, mesh, optimizer, microbatches=2)
            for batch in ((x.to(dtype), x), (x, x.to(dtype))))
    return seen


def test_token_ids_of_another_integer_dtype_are_refused_alike_everywhere():
    """int32 used to train in a parallel model and raise in the plain GPT (torch's
    cross-entropy refuses int32 targets, its embedding takes int32 ids): one rule now,
    int64, the same TypeError in the plain GPT and in every parallel model."""
    model = mt.GPT(mt.GPTConfig(**TINY)).to(mt.device())
    x = torch.ones(2, 8, dtype=torch.long, device=mt.device())
    expected = {}
    for dtype in ID_DTYPES:
        name = str(dtype).removeprefix("torch.")
        inputs = _refusal(model, x.to(dtype), x)
        targets = _refusal(model, x, x.to(dtype))
        assert inputs == (f"TypeError: input ids must be int64 (torch.long), got {name}: "
                          "convert them with .long()")
        assert targets == inputs.replace("input ids", "target ids")
        assert _refusal(model, x.to(dtype)) == inputs  # no targets: refused alike
        expected[str(dtype)] = (inputs, targets)
    for pp, tp, sequence_parallel in [(1, 2, True), (2, 1, False)]:
        for rank, seen in enumerate(mt.launch(_id_dtype_refusals, pp * tp, pp, tp,
                                              sequence_parallel, timeout=60)):
            assert seen == expected, (pp, tp, rank)


def _step_with_target(bad: int, pp: int):
    mesh = mt.Mesh(pp=pp, tp=2 // pp)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(mt.GPTConfig(**TINY)).to(mt.device()), mesh)
    x = torch.zeros(4, 8, dtype=torch.long, device=mt.device())
    y = torch.ones_like(x)
    y[3, 7] = bad
    try:
        mt.train_step(model, (x, y), mesh, torch.optim.SGD(model.parameters(), lr=0.1),
                      microbatches=2)
    except ValueError as error:
        return str(error)
    return None


@pytest.mark.parametrize("pp", [1, 2])
def test_train_step_refuses_a_target_outside_the_vocabulary_on_every_rank(pp):
    """In a pipeline only the last stage computes the loss: every rank must refuse
    the batch itself, or the first stage would train on while the last one fails."""
    for bad in (10, -3):  # 10: the padded range is empty at vocab 10, tp 2; -3: negative
        messages = mt.launch(_step_with_target, 2, bad, pp, timeout=60)
        for message in messages:
            assert message == (f"target id {bad} is outside the vocabulary: it must be in "
                               f"[0, 10) or the ignore index {IGNORE_INDEX}")


def _too_long_input(pp, tp, sequence_parallel):
    cfg = mt.GPTConfig(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=8)
    mesh = mt.Mesh(pp=pp, tp=tp)
    model = mt.parallelize(mt.GPT(cfg).to(mt.device()), mesh,
                           sequence_parallel=sequence_parallel)
    tokens = torch.randint(0, 16, (2, 12), device=mt.device())  # 12 > seq_len 8
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mt.train_step(model, (tokens, tokens), mesh, optimizer)


@pytest.mark.parametrize("pp,tp,sequence_parallel", [(1, 2, True), (2, 1, False)],
                         ids=["tp2-sp", "pp2"])
def test_a_parallel_model_refuses_an_input_longer_than_seq_len(pp, tp, sequence_parallel):
    """As the plain GPT does: a ValueError naming both lengths, not an IndexError."""
    with pytest.raises(mt.LaunchError, match=r"ValueError: (a )?sequence of 12 tokens is "
                                             r"longer than seq_len=8"):
        mt.launch(_too_long_input, pp * tp, pp, tp, sequence_parallel, timeout=60)
