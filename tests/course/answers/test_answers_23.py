"""Lesson 23: eight bits across ranks. The e4m3 step is read off every value the format
has (its 256 bit patterns, through torch), and so are the steps its usual mistakes name
(e5m2's 256 patterns, bfloat16's 65,536); the gather's bytes counted shard by shard on a
ring; a rowwise cast's amax group found by asking which axis cuts the dimension one of its
scales runs along, never by the question's own formula (or the rule's).

Not checked: none."""

import bisect

import pytest
import torch
from answers_common import MiB, asked, close

NOT_CHECKED: set[str] = set()


def _grid(dtype, bits=8):
    """Every finite value of `dtype`, sorted (a list): its bit patterns, read by torch."""
    patterns = torch.arange(2**bits, dtype=torch.int32).to(torch.uint8 if bits == 8
                                                           else torch.int16)
    values = patterns.view(dtype).double()
    return values[values.isfinite()].unique().tolist()


def _around(grid, v):
    """The largest value of `grid` below v and the smallest above it."""
    return grid[bisect.bisect_left(grid, v) - 1], grid[bisect.bisect_right(grid, v)]


E4M3 = _grid(torch.float8_e4m3fn)


def test_21_e4m3_step_draws_an_x_that_is_not_an_e4m3_value():
    """Issue 48: 5.0 was drawn, itself e4m3, so "the two values on either side" were
    4.5 and 5.5, two steps apart."""
    for _, p, _ in asked("23.e4m3-step"):
        assert p["v"] not in E4M3, p


def test_21_e4m3_step_is_the_gap_between_the_e4m3_values_around_x():
    for _, p, right in asked("23.e4m3-step"):
        below, above = _around(E4M3, p["v"])
        assert close(right, above - below), p


def test_21_e4m3_step_a_cast_rounds_x_to_one_of_the_two_values_around_it():
    for _, p, _ in asked("23.e4m3-step"):
        cast = torch.tensor(p["v"], dtype=torch.float64).to(torch.float8_e4m3fn).item()
        assert cast in _around(E4M3, p["v"]), p


@pytest.mark.parametrize("name, grid", [("e5m2", _grid(torch.float8_e5m2)),
                                        ("bfloat16", _grid(torch.bfloat16, bits=16))])
def test_21_e4m3_step_a_mistake_said_to_be_a_formats_step_is_that_formats_step(name, grid):
    for q, p, _ in asked("23.e4m3-step"):
        mistake = next(w for w in q.wrong if w.says.startswith(f"that is {name}'s step"))
        below, above = _around(grid, p["v"])
        assert close(mistake.value(p), above - below), p


def test_21_gather_bytes_counts_the_shards_a_ring_forwards():
    for _, p, right in asked("23.gather-bytes"):
        h, n = p["h"], p["n"]
        shard = 4 * h * h // n + 4 * (4 * h // n)  # its values, and its rows' scales
        assert close(right, (n - 1) * shard / MiB), p


# Rowwise: the dimension one scale's amax runs along (the GEMM's sum), and which axis cuts
# that dimension as the cast sees it (None: whole on every rank). Tokens: the batch's rows
# differ per dp rank; under rowwise the column layer's input is gathered before its casts and
# the row layer's gradient is gathered before its, so SP cuts nothing a cast sees. Features
# between the two layers are cut by tp; so are the column weight's rows (its outputs) and
# the row weight's columns (its inputs).
ALONG = {"input": "features", "grad": "features", "weight": "w_inputs",
         "weight_dgrad": "w_outputs", "input_wgrad": "tokens", "grad_wgrad": "tokens"}


def _cut(layer, role):
    between = (layer, role) in {("row", "input"), ("column", "grad")}  # the hidden features
    cuts = {"tokens": "dp", "features": "tp" if between else None,
            "w_inputs": "tp" if layer == "row" else None,
            "w_outputs": "tp" if layer == "column" else None}
    return {cuts[ALONG[role]]} - {None}


def test_21_which_group_is_every_axis_that_cuts_one_scales_slice():
    letters = {frozenset(): "a", frozenset({"dp"}): "b", frozenset({"tp"}): "c",
               frozenset({"dp", "tp"}): "d"}
    rights = set()
    for _, p, right in asked("23.which-group"):
        assert right == letters[frozenset(_cut(p["layer"], p["role"]))], p
        rights.add(right)
    assert rights == {"a", "b", "c"}  # the 50 seeds draw every kind of answer


def test_21_which_group_worked_answer_follows_the_answer():
    # the worked answer says each axis cuts (or not) as the answer has it, and ends with the
    # answer's letter; SP's all-gather is named only in the runs that have one
    for q, p, right in asked("23.which-group"):
        worked, text = q.worked(p), q.text(p)
        assert f"answer {right}." in worked, worked
        assert ("dp cuts each slice" in worked) == (right in "bd"), worked
        assert ("tp cuts each slice" in worked) == (right in "cd"), worked
        if not p["sp"]:
            assert "all-gather" not in text and "SP" not in text, text
