"""2D (SUMMA) tensor parallelism: the layer equals the dense one, and its bytes on
the wire, measured, stand beside the formulas of `minitp.calc.network.two_d` and beside
1D (Megatron) tensor parallelism of the same layer.

Equivalence: at 4 ranks (a 2 × 2 grid), float64, a two-layer network (Linear2D,
GELU, Linear2D) against the dense layers on one process: the output and every
gradient (input, weights, biases), gathered back, for both ways of moving the
blocks (all-gathers, SUMMA's broadcasts).

Bytes: one launch per shape runs the layer four ways (1D row- and
column-parallel, 2D with all-gathers and with broadcasts) and counts what each
rank wrote to its sockets (`minitp.runtime.io_counters`, each event's ``sent_bytes``).
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest

import minitp as mt
from minitp.calc.network import two_d as model
from minitp.course.labs import two_d
from minitp.runtime import io_counters as _io_counters
from minitp.tensor_parallel.two_d import Grid, Linear2D, grid_layout

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

TOLERANCE = 1e-12  # float64
HEADERS = 4096  # bytes: gloo writes ~288 B of its own per message, and 8 messages at most here
FP64 = 8


def test_grid_layout_rows_are_adjacent_ranks():
    assert grid_layout(2) == {"row": [[0, 1], [2, 3]], "col": [[0, 2], [1, 3]]}
    assert grid_layout(3)["col"][1] == [1, 4, 7]
    with pytest.raises(ValueError):
        grid_layout(0)


@pytest.mark.parametrize("collective", ["all_gather", "broadcast", "regather"])
def test_linear_2d_equals_the_dense_layers(collective):
    run = mt.launch(two_d.equivalence_errors, 4, tokens=8, d=8, hidden=12,
                    collective=collective, timeout=60)
    names = {"output", "input grad", "fc.weight grad", "fc.bias grad", "proj.weight grad",
             "proj.bias grad"}
    for r in range(4):
        assert set(run[r]) == names
        for name, error in run[r].items():
            assert error < TOLERANCE, f"rank {r} {collective}: {name} differs by {error:.3g}"
    # the collectives it ran, per layer: 2 gathers (or 2q broadcasts) forward, 3 backward
    fwd = [e.op for e in run.trace if e.rank == 0 and e.is_comm and e.phase == "fwd"]
    bwd = [e.op for e in run.trace if e.rank == 0 and e.is_comm and e.phase == "bwd"]
    # (the re-gather variant: 2 all-gathers forward and again backward)
    forward = {"all_gather": ["all_gather"] * 2, "broadcast": ["broadcast"] * 4,
               "regather": ["all_gather"] * 2}[collective]
    assert fwd == 2 * forward
    again = 4 * ["all_gather"] if collective == "regather" else []
    assert sorted(bwd) == again + 2 * ["all_reduce"] + 4 * ["reduce_scatter"]


def _refusals():
    grid = Grid()
    refused = []
    for bad in (dict(d_in=3, d_out=4), dict(d_in=4, d_out=4, collective="ring")):
        try:
            Linear2D(grid=grid, **bad)
        except ValueError as error:
            refused.append(str(error))
    return refused, repr(grid)


def test_a_grid_needs_a_square_world_and_divisible_sizes():
    run = mt.launch(_refusals, 4, timeout=60)
    refused, grid = run[3]
    assert "d_in=3 is not divisible by the grid size q=2" in refused[0]
    assert "collective must be one of" in refused[1]
    assert grid == "Grid(2x2) on rank 3: (i, j) = (1, 1), row [2, 3], col [1, 3]"
    with pytest.raises(mt.LaunchError, match="needs a square number of ranks"):
        mt.launch(Grid, 2, timeout=60)


def test_the_models_formulas():
    # 1D: one all-reduce of the activation; 2D: (q-1) blocks per gather or scatter
    assert model.tp1d_linear_bytes(16, 8, 8, 4, bytes_per_value=1) == 2 * 3 * 16 * 8 // 4
    parts = model.tp2d_linear_parts(16, 8, 8, 2, bytes_per_value=1)
    assert parts["all_gather X (row)"] == 1 * (16 // 2) * (8 // 2)
    assert parts["all_gather W (col)"] == 1 * (8 // 2) * (8 // 2)
    assert parts["all_reduce db (col)"] == 2 * 1 * (8 // 2) / 2
    # the crossover, d = q·T: with no bias, 2D sends less exactly below it
    for tokens, d, q in ((8, 15, 2), (8, 16, 2), (8, 17, 2), (4, 11, 3), (4, 13, 3)):
        one = model.tp1d_linear_bytes(tokens, d, d, q * q)
        two = model.tp2d_linear_bytes(tokens, d, d, q, bias=False)
        assert (two < one) == (d < q * tokens) and (two == one) == (d == q * tokens)
    # the re-gather variant: 3 moves per tensor; its crossover is d = (2q - 1)·T/3
    again = model.tp2d_linear_parts(16, 8, 8, 2, bytes_per_value=1, regather=True)
    assert again["all_gather X again (row, bwd)"] == parts["all_gather X (row)"]
    assert len(again) == len(parts) + 2
    for tokens, d, q in ((6, 14, 3), (6, 15, 3), (6, 16, 3), (3, 6, 4), (3, 7, 4), (3, 8, 4)):
        one = model.tp1d_linear_bytes(tokens, d, d, q * q)
        two = model.tp2d_linear_bytes(tokens, d, d, q, bias=False, regather=True)
        assert (two < one) == (3 * d < (2 * q - 1) * tokens)
        assert (two == one) == (3 * d == (2 * q - 1) * tokens)
    # GPT-3 (d = 12288, one 2048-token sequence): q > 6 saved, q > 9.5 re-gathered
    assert model.crossover_q(2048, 12288) == 6 and model.crossover_q(2048, 12288, True) == 9.5
    assert model.first_winning_grid(2048, 12288) == 7
    assert model.first_winning_grid(2048, 12288, regather=True) == 10
    assert model.first_winning_grid(2048, 12288, regather=True, divides=(12288, 96)) == 12
    # sequence parallelism: an all-gather and a reduce-scatter, the all-reduce's bytes
    for kind in ("row", "column"):
        assert (model.tp1d_linear_bytes(16, 8, 8, 4, kind, sequence_parallel=True)
                == model.tp1d_linear_bytes(16, 8, 8, 4, kind))
    assert model.tp1d_linear_bytes(16, 8, 8, 4, sequence_parallel=True, gloo=True,
                                   bytes_per_value=1) == 3 * 3 * 16 * 8 // 4
    assert model.tp_linear_latency("1d", 9) == {"collectives": 1, "alpha": 16}
    assert model.tp_linear_latency("1d-sp", 9) == {"collectives": 2, "alpha": 16}
    assert model.tp_linear_latency("2d-regather", 9) == {"collectives": 7, "alpha": 16}
    assert model.saved_values("2d", 16, 8, 4, 4) == {"activation": 64, "weight": 16}
    assert model.saved_values("2d-regather", 16, 8, 4, 4) == {"activation": 32, "weight": 0}
    assert model.tp_linear_latency("2d", 9) == {"collectives": 5, "alpha": 12}
    assert model.tp_linear_latency("2d-broadcast", 9, bias=False) == {"collectives": 8,
                                                                     "alpha": 16}


def test_the_layernorms_model_counts_six_all_reduces():
    # Σx, Σx², Σg, Σg·x̂: T/q values each along the row; dγ, dβ: d/q values along the column
    parts = model.layernorm2d_parts(16, 8, 2, bytes_per_value=1)
    row = [v for k, v in parts.items() if k.endswith("(row)")]
    col = [v for k, v in parts.items() if k.endswith("(col)")]
    assert row == [2 * 1 * (16 // 2) / 2] * 4 and col == [2 * 1 * (8 // 2) / 2] * 2
    assert len(model.layernorm2d_parts(16, 8, 2, params=False)) == 4
    assert model.layernorm2d_latency(3) == {"collectives": 6, "alpha": 24}
    assert model.layernorm2d_latency(3, params=False) == {"collectives": 4, "alpha": 16}


def test_layernorm_2d_equals_the_dense_layernorm_with_its_own_all_reduces():
    run = mt.launch(two_d.layernorm_errors, 4, tokens=18, d=18, timeout=60)
    for r in range(4):
        assert set(run[r]) == {"output", "input grad", "weight grad", "bias grad"}
        for name, error in run[r].items():
            assert error < TOLERANCE, f"rank {r}: {name} differs by {error:.3g}"
    events = [e for e in run.trace if e.rank == 0 and e.is_comm and e.label != "gather back"]
    ops = [(e.phase, f"{e.op}@{e.axis}") for e in events]
    assert ops == [("fwd", "all_reduce@row")] * 2 + [("bwd", "all_reduce@row")] * 2 \
        + [("bwd", "all_reduce@col")] * 2
    parts = model.layernorm2d_parts(18, 18, 2, bytes_per_value=FP64)
    assert [e.model_bytes for e in events] == list(parts.values())


@pytest.fixture(scope="module", params=[(288, 72), (16, 144)], ids=["2d-wins", "1d-wins"])
def measured(request):
    tokens, d = request.param
    return tokens, d, two_d.wire_bytes(tokens, d, d, world=4, timeout=60)


def test_every_rank_runs_the_collectives_its_scheme_needs(measured):
    _, _, table = measured
    expected = {
        "1d-row": ("all_reduce@world",),
        "1d-column": ("all_reduce@world",),
        "1d-sp-row": ("reduce_scatter@world", "all_gather@world"),
        "1d-sp-column": ("all_gather@world", "reduce_scatter@world"),
        "2d": ("all_gather@row", "all_gather@col", "reduce_scatter@row", "reduce_scatter@col",
               "all_reduce@col"),
        "2d-broadcast": ("broadcast@row",) * 2 + ("broadcast@col",) * 2
        + ("reduce_scatter@row", "reduce_scatter@col", "all_reduce@col"),
        "2d-regather": ("all_gather@row", "all_gather@col") * 2
        + ("reduce_scatter@row", "reduce_scatter@col", "all_reduce@col"),
    }
    latency = {"1d-row": "1d", "1d-column": "1d", "1d-sp-row": "1d-sp", "1d-sp-column": "1d-sp"}
    for scheme, rows in table.items():
        for row in rows:
            assert row.collectives == expected[scheme], (scheme, row.rank)
            count = model.tp_linear_latency(latency.get(scheme, scheme), 4)
            assert len(row.collectives) == count["collectives"]


def _expected_bytes(scheme, tokens, d, gloo=False):
    if scheme.startswith("1d"):
        return model.tp1d_linear_bytes(tokens, d, d, 4, bytes_per_value=FP64, gloo=gloo,
                                       sequence_parallel="-sp-" in scheme)
    return model.tp2d_linear_bytes(tokens, d, d, 2, bytes_per_value=FP64, gloo=gloo,
                                   regather=scheme == "2d-regather")


def test_the_traces_model_is_the_formula(measured):
    tokens, d, table = measured
    for scheme, rows in table.items():
        for row in rows:
            assert row.model_bytes == _expected_bytes(scheme, tokens, d), (scheme, row.rank)


def test_what_each_scheme_keeps_for_backward_is_the_model(measured):
    # the ledger's bytes: Linear2D keeps q x its blocks, the re-gather variant its own X block
    tokens, d, table = measured
    for scheme, rows in table.items():
        kept = model.saved_values(scheme, tokens, d, d, 4)
        for row in rows:
            assert row.saved_bytes == FP64 * (kept["activation"] + kept["weight"]), scheme


@pytest.mark.skipif(not _io_counters.available(), reason="no /proc/self/io: nothing measured")
def test_measured_bytes_are_the_model_plus_headers_with_gloos_reduce_scatter(measured):
    # gloo's reduce-scatter sends an all-reduce's bytes (tests/runtime/test_wire_bytes.py), so
    # 2D's backward measures twice the ring model's; the rest is the model plus headers
    tokens, d, table = measured
    expected = {scheme: _expected_bytes(scheme, tokens, d, gloo=True) for scheme in table}
    for scheme, rows in table.items():
        for row in rows:
            assert expected[scheme] <= row.sent_bytes <= expected[scheme] + HEADERS, (
                f"{scheme} rank {row.rank}: measured {row.sent_bytes}, model {expected[scheme]}")


@pytest.mark.skipif(not _io_counters.available(), reason="no /proc/self/io: nothing measured")
def test_2d_sends_fewer_bytes_exactly_where_the_model_says(measured):
    # d < √N·T: 2D wins (288 tokens, d = 72); d > √N·T: 1D wins (16 tokens, d = 144)
    tokens, d, table = measured
    one = max(row.sent_bytes for row in table["1d-row"])
    two = max(row.sent_bytes for row in table["2d"])
    ring_wins = (model.tp2d_linear_bytes(tokens, d, d, 2, bytes_per_value=FP64)
                 < model.tp1d_linear_bytes(tokens, d, d, 4, bytes_per_value=FP64))
    assert ring_wins == (d < 2 * tokens)
    assert (two < one) == ring_wins, f"measured 1D {one}, 2D {two}"


def test_the_grid_picture_bolds_the_row_of_x_and_the_column_of_w():
    from minitp.course.viz.grid import summa_grid

    fig = summa_grid(q=3, rank=5)  # (i, j) = (1, 2)
    bold = {p.get_gid() for ax in fig.axes for p in ax.patches if p.get_linewidth() > 2}
    assert bold == {"X10", "X11", "X12", "W02", "W12", "W22", "Y12"}
    with pytest.raises(ValueError):
        summa_grid(q=2, rank=4)


def test_the_bytes_picture_marks_where_2d_starts_to_win():
    from minitp.course.viz.grid import bytes_vs_n

    # d/T = 2: 2D saved wins for q > 2, but q = 3 does not divide d = 4096: from N = 16;
    # re-gathered, for q > 3.5: N = 16 too. 1D stops at the 32 heads.
    fig = bytes_vs_n([(2048, 4096, 32)], ns=(4, 9, 16, 32, 64))
    circles = [line for line in fig.axes[0].lines if line.get_marker() == "o"]
    assert [tuple(c.get_xdata()) for c in circles] == [(16,), (16,)]
    one = fig.axes[0].lines[0]
    assert tuple(one.get_xdata()) == (4, 16, 32)  # 1D: N divides the heads
    assert len(fig.axes) == 3  # bytes, α terms, collectives: one quantity per axis
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert all("(model)" in label for label in labels)
