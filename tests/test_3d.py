"""The 3D-parallel GPT equals the plain GPT.

For (dp, pp, tp) with dp·pp·tp ≤ 8 that the model admits (tp must divide the
12 heads, pp the 4 layers: 28 meshes, worlds 1 to 8, a world of 6 among them;
the suite runs 12 that cover every axis size and every combination of
parallel axes, MINITP_FULL_MATRIX=1 all 28), a few settings (each sampled mesh runs the
plainest and half of the rest, alternating: `_rotated`) that between them
cover every schedule (gpipe, 1f1b, interleaved), sequence parallelism on and
off, ZeRO-1 on and off, recomputation, microbatches 1 and more than pp, and
the attention core written out or fused (``attention="sdpa"``, the parallel model
only: the reference stays "math", so the two paths are checked against each other):
after 3 AdamW steps in float64 the loss of every step and every parameter
(gathered back to the plain names with ``full_state_dict``) equal the
single-device model's to 1e-10.
One launch per world size runs all of that world's meshes and settings.

The batch has ignored targets, more of them in one data-parallel slice than in
another: a step that averaged per-slice or per-microbatch means would differ.
"""

import itertools
import os

import pytest
import torch
from helpers import random_batches, train_side_by_side

import minitp as mt

TOLERANCE = 1e-10
# float32 (see test_tensor_parallel): Adam amplifies rounding of near-zero gradients.
FLOAT32_LOSS, FLOAT32_PARAMS = 1e-5, 1e-4
CFG = dict(vocab_size=10, seq_len=12, n_layer=4, n_head=12, d_model=24)


def _admitted(dp, pp, tp, n_layer=CFG["n_layer"], virtual_stages=1):
    try:
        mt.check_parallel_config(mt.GPTConfig(**{**CFG, "n_layer": n_layer}), tp=tp, pp=pp,
                                 dp=dp, sequence_parallel=True, virtual_stages=virtual_stages)
    except ValueError:
        return False
    return True


SHAPES = [s for s in itertools.product(range(1, 9), repeat=3)
          if s[0] * s[1] * s[2] <= 8 and _admitted(*s)]  # (dp, pp, tp)
WORLDS = sorted({dp * pp * tp for dp, pp, tp in SHAPES})
FULL_MATRIX_ENV = "MINITP_FULL_MATRIX"  # set it to run every mesh, not the sample


def _pattern(shape) -> tuple[bool, ...]:
    return tuple(n > 1 for n in shape)  # which axes are parallel


def _covers(shape) -> set:
    """What running `shape` shows: each axis's size, and its combination of parallel axes."""
    return {("dp", shape[0]), ("pp", shape[1]), ("tp", shape[2]), _pattern(shape)}


def _sample() -> set[tuple[int, int, int]]:
    """A small set of meshes that covers every axis size and every combination of
    parallel axes (12 of the 28): greedily, the mesh that shows the most not yet shown,
    the most-parallel first, then the most balanced, then the smallest world."""
    picks, left = set(), set().union(*(_covers(s) for s in SHAPES))
    while left:
        best = max(SHAPES, key=lambda s: (len(_covers(s) & left), sum(_pattern(s)), -max(s),
                                          -s[0] * s[1] * s[2]))
        picks.add(best)
        left -= _covers(best)
    return picks


SAMPLE = _sample()


def sampled(world: int) -> list[tuple[int, int, int]]:
    """The meshes of `world` the suite runs (CI has two cores and fifteen minutes):
    `SAMPLE` covers every axis size and every combination of parallel axes that
    the model admits; with MINITP_FULL_MATRIX set, every mesh is run."""
    meshes = [s for s in SHAPES if s[0] * s[1] * s[2] == world]
    return meshes if os.environ.get(FULL_MATRIX_ENV) else sorted(set(meshes) & SAMPLE)


def _settings(dp, pp, tp):
    """(schedule, virtual_stages, microbatches, sequence_parallel, zero1, recompute, n_layer,
    attention)."""
    many = 2 * pp  # more than pp, and a multiple of it (interleaving needs that)
    sp = tp > 1
    if pp == 1:
        return [("1f1b", 1, 1, False, False, None, 4, "math"),
                ("gpipe", 1, many, sp, True, "selective", 4, "sdpa"),
                ("1f1b", 1, many, sp, False, "full", 4, "math")]
    interleaved_layers = 4 if _admitted(dp, pp, tp, 4, 2) else 8
    return [("gpipe", 1, 1, False, False, None, 4, "math"),
            ("gpipe", 1, many, sp, True, None, 4, "math"),
            ("1f1b", 1, many, sp, False, "selective", 4, "sdpa"),
            ("1f1b", 1, many, False, dp > 1, "full", 4, "math"),
            ("interleaved", 2, many, sp, dp > 1, None, interleaved_layers, "sdpa")]


def _batches(steps, cfg, batch):
    # ignored targets, unevenly spread over the dp slices
    return random_batches(steps, cfg, batch, ignored=((0, slice(0, 5)), (-1, slice(0, 2))))


def _rotated(settings, j):
    """The settings the j-th sampled mesh of a world runs: the first (the plainest) and
    every other one of the rest, alternating from mesh to mesh, so each setting still runs
    in every world of two meshes or more, at about two thirds of the cost (CI's budget);
    MINITP_FULL_MATRIX runs them all."""
    if os.environ.get(FULL_MATRIX_ENV):
        return settings
    return [s for i, s in enumerate(settings) if i == 0 or (i + j) % 2 == 0]


def _compare(world, dtype, shapes=None, steps=3):
    """On every rank: for each mesh of this world and each of its settings, train the
    plain GPT and the parallel one side by side; the worst loss and parameter errors."""
    results = {}
    for j, (dp, pp, tp) in enumerate(shapes or sampled(world)):
        mesh = mt.Mesh(dp=dp, pp=pp, tp=tp)
        for setting in _rotated(_settings(dp, pp, tp), j):
            schedule, v, m, sp, zero, recompute, n_layer, attention = setting
            cfg = mt.GPTConfig(**{**CFG, "n_layer": n_layer})
            torch.manual_seed(0)
            ref = mt.GPT(cfg).to(dtype)
            source = mt.GPT(mt.GPTConfig(**{**CFG, "n_layer": n_layer, "attention": attention}))
            source.to(dtype).load_state_dict(ref.state_dict())
            model = mt.parallelize(source, mesh, sequence_parallel=sp, recompute=recompute,
                                   virtual_stages=v, zero_stage=1 if zero else 0)
            results[((dp, pp, tp), setting)] = train_side_by_side(
                ref, model, mesh, _batches(steps, cfg, batch=dp * 2 * pp), microbatches=m,
                schedule=schedule)
    return results


def _check(run, loss_tol, param_tol):
    assert run[0], "no configuration ran"
    for rank, results in enumerate(run):
        for (shape, setting), (loss_error, (param_error, name), losses) in results.items():
            where = f"rank {rank}, (dp, pp, tp)={shape}, setting={setting}"
            assert loss_error < loss_tol, f"{where}: loss differs by {loss_error:.3g}"
            assert param_error < param_tol, f"{where}: {name} differs by {param_error:.3g}"
            # the returned loss is the same float on every rank, not merely close
            assert losses == run[0][(shape, setting)][2], f"{where}: loss differs from rank 0's"


def test_the_meshes_enumerated():
    assert len(SHAPES) == 28
    assert 6 in WORLDS and (1, 1, 6) in SHAPES and (3, 2, 1) in SHAPES
    assert all(pp in (1, 2, 4) and tp in (1, 2, 3, 4, 6) for _, pp, tp in SHAPES)


def test_the_sample_covers_every_axis_size_and_every_combination_of_axes(monkeypatch):
    monkeypatch.delenv(FULL_MATRIX_ENV, raising=False)
    run = [s for world in WORLDS for s in sampled(world)]
    for axis in range(3):
        assert {s[axis] for s in run} == {s[axis] for s in SHAPES}
    assert {_pattern(s) for s in run} == {_pattern(s) for s in SHAPES}
    assert len(run) == 12 < len(SHAPES)


def test_every_setting_still_runs_on_a_mesh_of_every_kind(monkeypatch):
    """The rotation leaves out half of each mesh's settings, never a setting altogether:
    each of the pipelined and of the unpipelined settings runs on some sampled mesh."""
    monkeypatch.delenv(FULL_MATRIX_ENV, raising=False)
    ran, every = set(), set()
    for world in WORLDS:
        for j, shape in enumerate(sampled(world)):
            settings = _settings(*shape)
            kept = _rotated(settings, j)
            every |= {(shape[1] > 1, i) for i in range(len(settings))}
            ran |= {(shape[1] > 1, i) for i, s in enumerate(settings) if s in kept}
    assert ran == every


@pytest.mark.parametrize("world", [w for w in WORLDS if sampled(w)])
def test_equals_plain_gpt_float64(world):
    run = mt.launch(_compare, world, world, torch.float64, timeout=300)
    _check(run, TOLERANCE, TOLERANCE)


def test_equals_plain_gpt_float32():
    run = mt.launch(_compare, 8, 8, torch.float32, shapes=[(2, 2, 2)], timeout=300)
    _check(run, FLOAT32_LOSS, FLOAT32_PARAMS)
