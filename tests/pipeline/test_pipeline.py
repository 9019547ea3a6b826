"""Pipeline schedules: their order, their bubble on paper and measured from a trace,
the messages between stages, and the tied embedding's gradient sum.

Bubble (Narayanan et al. 2021): with every forward and backward of a stage
taking the same time, the idle time of each rank over its busy time is
(p−1)/m for GPipe and 1F1B and (p−1)/(v·m) for interleaved 1F1B. `simulate`
counts it in ticks; the measured test makes every chunk's forward and backward
take a fixed time (padded with sleep, so the CPU's speed hardly matters) and
reads the compute regions "F3" / "B3" of a real run's trace.
"""

import time

import pytest
import torch

import minitp as mt
from minitp import calc
from minitp.pipeline import SCHEDULES, simulate

CFG = dict(vocab_size=10, seq_len=12, n_layer=4, n_head=12, d_model=24)
# A chunk's forward (and its backward) in the measured test. Each hop between stages
# costs a fraction of a millisecond, and a loaded 2-core machine wakes a sleeping
# rank a few ms late: 0.1 s keeps those well under the 10% the test allows.
UNIT_SECONDS = 0.1


def _theory(schedule, p, m, v):
    # (p-1)/(v·m), Narayanan et al. 2021, as minitp.calc computes it: the measured
    # bubble below is also the calculator checked against our own trace.
    return float(calc.bubble(p, m, v))


# --------------------------------------------------------------------------- on paper
@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2),
                                         ("interleaved", 4)])
@pytest.mark.parametrize("p, m", [(2, 4), (4, 4), (4, 8), (4, 12)])
def test_simulated_bubble_is_the_formula(schedule, v, p, m):
    assert simulate(schedule, p, m, v)["bubble"] == pytest.approx(_theory(schedule, p, m, v))


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_every_unit_runs_once_in_a_valid_order(schedule, v):
    p, m = 4, 8
    for r in range(p):
        order = SCHEDULES[schedule](p, r, m, v)
        units = [(kind, k, i) for kind in "FB" for k in range(v) for i in range(m)]
        assert sorted(order) == sorted(units)
        seen = set()
        for kind, k, i in order:  # a chunk's backward of a microbatch after its forward
            assert kind == "F" or ("F", k, i) in seen
            seen.add((kind, k, i))


def test_1f1b_holds_fewer_activations_than_gpipe():
    """In flight = forwards whose backward has not run yet: m for GPipe, p−r for 1F1B."""
    p, m = 4, 8

    def peak(order):
        alive = most = 0
        for kind, _, _ in order:
            alive += 1 if kind == "F" else -1
            most = max(most, alive)
        return most

    for r in range(p):
        assert peak(SCHEDULES["gpipe"](p, r, m)) == m
        assert peak(SCHEDULES["1f1b"](p, r, m)) == p - r


def test_interleaved_needs_microbatches_divisible_by_pp():
    with pytest.raises(ValueError, match="divisible by pp"):
        SCHEDULES["interleaved"](4, 0, 6, 2)


@pytest.mark.parametrize("kwargs, message", [
    ({"pp": 1, "virtual_stages": 2}, "needs a pipeline"),
    ({"pp": 2, "virtual_stages": 2, "schedule": "1f1b"}, "does not fit virtual_stages=2"),
    ({"pp": 2, "schedule": "interleaved"}, "does not fit virtual_stages=1"),
    ({"pp": 2, "virtual_stages": 2, "microbatches": 3}, "divisible by pp"),
    ({"dp": 2, "microbatches": 3, "batch_size": 8}, "cannot be cut into dp=2"),
    ({"schedule": "zigzag"}, "schedule must be one of"),
    ({"microbatches": 0}, "microbatches must be a positive integer"),
])
def test_bad_pipeline_settings_raise_before_any_process(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mt.check_parallel_config(mt.GPTConfig(**CFG), **kwargs)


# --------------------------------------------------------------------------- measured
def _sleep_until(deadline):
    time.sleep(max(0.0, deadline - time.perf_counter()))


class _Mark(torch.autograd.Function):
    """Identity; its backward (the first thing a chunk's backward runs) notes the time."""

    @staticmethod
    def forward(ctx, x, clock):
        ctx.clock = clock
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.clock["backward"] = time.perf_counter()
        return grad, None


class _Pad(torch.autograd.Function):
    """Identity; its backward (the last of a chunk's) waits until the chunk's
    backward has taken exactly `seconds`."""

    @staticmethod
    def forward(ctx, x, clock, seconds):
        ctx.clock, ctx.seconds = clock, seconds
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _sleep_until(ctx.clock["backward"] + ctx.seconds)
        return grad, None, None


def _fixed_cost(chunk, seconds):
    """Make this chunk's forward and its backward each take exactly `seconds`
    (its real compute, well under that, is absorbed), so that every unit of the
    schedule costs the same — the assumption behind the bubble formulas."""
    clock = {}

    def start(_, inputs):
        clock["forward"] = time.perf_counter()
        if not chunk.first:  # backward ends at the chunk's input
            return (_Pad.apply(inputs[0], clock, seconds), *inputs[1:])

    def pad_embedding(_, __, out):  # the first chunk's input is token ids: pad after lookup
        return _Pad.apply(out, clock, seconds)

    def finish(_, __, output):
        out, loss = output
        _sleep_until(clock["forward"] + seconds)
        if loss is not None:  # the last stage: its backward starts from the loss
            return out, _Mark.apply(loss, clock)
        return _Mark.apply(out, clock), None

    chunk.register_forward_pre_hook(start)
    chunk.register_forward_hook(finish)
    if chunk.first:  # after the position lookup (a dropout at p = 0 is never called)
        chunk.wpe.register_forward_hook(pad_embedding)


def _timed_steps(schedule, pp, m, v, seconds, steps):
    mesh = mt.Mesh(pp=pp)
    cfg = mt.GPTConfig(**{**CFG, "n_layer": pp * v})
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(cfg), mesh, virtual_stages=v)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randint(0, cfg.vocab_size, (m, cfg.seq_len))
    mt.train_step(model, (x, x), mesh, opt, schedule=schedule, microbatches=m)  # warm-up
    for chunk in model.chunks:  # (after it: the warm-up needs no set costs)
        _fixed_cost(chunk, seconds / v)  # a rank's stage costs the same whatever v
    per_step = []
    for _ in range(steps):
        mt.trace.clear()
        mt.train_step(model, (x, x), mesh, opt, schedule=schedule, microbatches=m)
        per_step.append([e for e in mt.trace.events() if e.op == "compute"])
    return per_step


def measured_bubble(events):
    """Mean over ranks of (idle / busy), idle counted within the span of all
    ranks' compute events."""
    start, end = min(e.start for e in events), max(e.end for e in events)
    ranks = sorted({e.rank for e in events})
    ratios = []
    for r in ranks:
        busy = sum(e.duration for e in events if e.rank == r)
        ratios.append((end - start - busy) / busy)
    return sum(ratios) / len(ratios)


# Each hop between stages adds latency (~0.3 ms idle, a few ms on a loaded 2-core
# machine) that the formula ignores, and the hops on the critical path grow with m:
# small m keeps them within the 10%. Other processes only ever add delay, so the
# best of a few steps is the measurement.
# each schedule once (GPipe on the smallest pipeline: its bubble's formula is 1F1B's)
@pytest.mark.parametrize("schedule, pp, m, v", [("1f1b", 4, 4, 1), ("interleaved", 4, 4, 2),
                                                ("gpipe", 2, 2, 1)])
def test_measured_bubble_matches_theory(schedule, pp, m, v):
    steps = 3
    # every chunk's forward and backward take UNIT_SECONDS (a stage's, v times that)
    run = mt.launch(_timed_steps, pp, schedule, pp, m, v, UNIT_SECONDS * v, steps, timeout=120)
    bubbles = []
    for step in range(steps):
        compute = [e for per_rank in run for e in per_rank[step]]
        assert len(compute) == 2 * m * v * pp
        assert {e.label[0] for e in compute} == {"F", "B"}
        assert {e.phase for e in compute if e.label[0] == "B"} == {"bwd"}
        bubbles.append(measured_bubble(compute))
    bubble, theory = min(bubbles), _theory(schedule, pp, m, v)
    print(f"{schedule} p={pp} m={m} v={v}: measured bubble {bubble:.4f} "
          f"(steps: {', '.join(f'{b:.4f}' for b in bubbles)}), theory {theory:.4f}")
    assert abs(bubble - theory) <= 0.1 * theory, f"{schedule}: bubble {bubble:.4f} vs {theory:.4f}"


# --------------------------------------------------------------------------- messages
def _one_step_events(pp, tp, sp):
    mesh = mt.Mesh(pp=pp, tp=tp)
    cfg = mt.GPTConfig(**CFG)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(cfg).double(), mesh, sequence_parallel=sp)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len))
    mt.trace.clear()
    mt.train_step(model, (x, x), mesh, opt, schedule="1f1b", microbatches=2)
    return mt.trace.events()


@pytest.mark.parametrize("sp", [False, True])
def test_messages_between_stages(sp):
    pp, tp, m = 2, 2, 2
    run = mt.launch(_one_step_events, pp * tp, pp, tp, sp, timeout=60)
    seq = CFG["seq_len"] // tp if sp else CFG["seq_len"]
    activation = 2 * seq * CFG["d_model"] * 8  # a microbatch of 2 rows, float64
    for rank, events in enumerate(run):
        stage = rank // tp
        p2p = [e for e in events if e.axis == "p2p"]
        sends = [e for e in p2p if e.op == "send"]
        recvs = [e for e in p2p if e.op == "recv"]
        # stage 0 sends m activations and receives m gradients; stage 1 the reverse
        assert len(sends) == len(recvs) == m
        assert all(e.nbytes == activation and e.label == "pipeline" for e in p2p)
        # activations travel forward, gradients backward
        forward = "send" if stage == 0 else "recv"
        assert {e.phase for e in p2p if e.op == forward} == {"fwd"}
        assert {e.phase for e in p2p if e.op != forward} == {"bwd"}
        peer = rank + tp if stage == 0 else rank - tp  # the same tp rank of the other stage
        assert {e.peer for e in p2p} == {peer}
        embedding = [e for e in events if e.label == "embedding grads"]
        assert [e.op for e in embedding] == ["all_reduce"]  # first and last stage both
        assert embedding[0].group_ranks == (rank % tp, rank % tp + tp)
