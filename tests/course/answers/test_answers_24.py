"""Lesson 24: blocks of scales. The last rank's block-atomic shard by laying the equal slots
out one block at a time; the gather's bytes counted shard by shard on a ring from the
formats' bits (a byte a value for MXFP8, half for NVFP4, a byte a block's scale, NVFP4's
float32 amax all-reduced); a block-scaled cast's group from which axes hold other pieces of
the tensor a scale hangs from, never by the question's own formula (or the rule's).

Not checked: none."""

from answers_common import MiB, asked, close

NOT_CHECKED: set[str] = set()
BLOCK = {"mxfp8": 32, "nvfp4": 16}
VALUE_BYTES = {"mxfp8": 1, "nvfp4": 0.5}  # e4m3: 8 bits; e2m1: 4 bits, two a byte


def test_23_last_shard_is_what_the_equal_slots_leave():
    for _, p, right in asked("24.last-shard"):
        numel, n, block = p["rows"] * p["cols"], p["n"], BLOCK[p["recipe"]]
        slot = block
        while slot * n < numel:  # the least whole number of blocks whose n slots cover it
            slot += block
        assert (n - 1) * slot < numel, p  # the last rank holds something
        assert right == numel - (n - 1) * slot, p


def test_23_gather_bytes_counts_the_shards_a_ring_forwards():
    for _, p, right in asked("24.gather-bytes"):
        h, n, recipe = p["h"], p["n"], p["recipe"]
        values = 4 * h * h // n
        shard = values * VALUE_BYTES[recipe] + values // BLOCK[recipe]  # codes, block scales
        amax = 2 * (n - 1) / n * 4 if recipe == "nvfp4" else 0  # float32, all-reduced
        assert close(right, ((n - 1) * shard + amax) / MiB), p


def _holds_other_pieces(layer, role):
    """The axes whose ranks hold other pieces of the tensor (no SP): dp other rows of every
    activation and gradient; tp the weights, and the features between the two layers."""
    if role == "weight":
        return {"tp"}
    between = (layer, role) in {("row", "input"), ("column", "grad")}
    return {"dp", "tp"} if between else {"dp"}


def test_23_which_reduce_is_none_for_mxfp8_and_the_tensors_pieces_for_nvfp4():
    letters = {frozenset(): "a", frozenset({"dp"}): "b", frozenset({"tp"}): "c",
               frozenset({"dp", "tp"}): "d"}
    rights = set()
    for _, p, right in asked("24.which-reduce"):
        axes = set() if p["recipe"] == "mxfp8" else _holds_other_pieces(p["layer"], p["role"])
        assert right == letters[frozenset(axes)], p
        rights.add(right)
    assert rights == {"a", "b", "c", "d"}  # the 50 seeds draw every kind of answer
