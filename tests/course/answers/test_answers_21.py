"""Lesson 21: eight bits across ranks. The e4m3 step is read off every value the format
has (its 256 bit patterns, through torch); the gather's bytes counted shard by shard on a
ring; the amax group found by asking which ranks hold different pieces of the tensor
(its dimensions, and which axis cuts each), never by the question's own formula.

Not checked: none."""

import torch
from answers_common import MiB, asked, close

NOT_CHECKED: set[str] = set()


def test_21_e4m3_step_is_the_gap_between_neighbouring_e4m3_values():
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    values = values[values.isfinite()].unique()
    for _, p, right in asked("21.e4m3-step"):
        above = values[values > p["v"]].min()
        below = values[values <= p["v"]].max()
        assert close(right, (above - below).item()), p


def test_21_gather_bytes_counts_the_shards_a_ring_forwards():
    for _, p, right in asked("21.gather-bytes"):
        h, n = p["h"], p["n"]
        shard = 4 * h * h // n + 4 * (4 * h // n)  # its values, and its rows' scales
        assert close(right, (n - 1) * shard / MiB), p


# The tensor each cast sees, its dimensions, and which axis cuts each (None: whole):
# rows of the batch differ per dp rank; tp cuts the features between the two layers, and
# under SP the sequence of the column layer's input, which is cast before the all-gather.
def _cut_by(layer, role, sp):
    batch, sequence = "dp", ("tp" if sp and (layer, role) == ("column", "input") else None)
    features = "tp" if (layer, role) in (("row", "input"), ("column", "grad")) else None
    return {batch, sequence, features} - {None}


def test_21_which_group_is_every_axis_that_cuts_the_tensor():
    letters = {frozenset(): "a", frozenset({"dp"}): "b", frozenset({"tp"}): "c",
               frozenset({"dp", "tp"}): "d"}
    for _, p, right in asked("21.which-group"):
        assert right == letters[frozenset(_cut_by(p["layer"], p["role"], p["sp"]))], p
    assert {right for _, _, right in asked("21.which-group")} == {"b", "d"}
