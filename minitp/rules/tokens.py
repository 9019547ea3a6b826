"""What a batch holds: token ids (their dtype and range), the ignored target, the sequence dim."""

from __future__ import annotations

IGNORE_INDEX = -100  # a target that contributes nothing to the loss (PyTorch's default)
SEQ_DIM = 1  # token ids are (batch, seq); activations (batch, seq, hidden)
TOKEN_ID_DTYPE = "int64"  # token ids are torch.long, in the plain GPT and every parallel model


def check_token_ids(ids, vocab_size: int, what: str = "token id", ignore_index=None) -> None:
    """Token ids are int64 (else a TypeError), and every id is in [0, vocab_size) (or
    equal to `ignore_index`), else a ValueError naming the first bad one.

    One dtype, refused alike everywhere: torch's own rules differ by op (an embedding
    takes int32 ids, cross-entropy refuses int32 targets), so without this an int32
    batch trained in a parallel model and raised in the plain GPT. An out-of-range id
    would otherwise index a padded vocabulary row (an `inf` loss) or, on another rank,
    nothing at all (a silent, finite, wrong loss). Works on any tensor without
    importing torch here."""
    dtype = str(ids.dtype).removeprefix("torch.")
    if dtype != TOKEN_ID_DTYPE:
        raise TypeError(f"{what}s must be {TOKEN_ID_DTYPE} (torch.long), got {dtype}: "
                        "convert them with .long()")
    bad = (ids < 0) | (ids >= vocab_size)
    if ignore_index is not None:
        bad = bad & (ids != ignore_index)
    if bad.any():
        first = int(ids[bad].reshape(-1)[0])
        allowed = f"[0, {vocab_size})" + ("" if ignore_index is None
                                         else f" or the ignore index {ignore_index}")
        raise ValueError(f"{what} {first} is outside the vocabulary: it must be in {allowed}")


def check_positions(positions, seq_len: int) -> None:
    """A packed batch's positions (each token's place in its document) lie in [0, seq_len),
    else a ValueError naming the first bad one. Without it a negative position indexes
    learned positions from the end (Python's rule: -1 is the last row) and trains on the
    wrong vectors without a word; one past the window is a raw IndexError, or a device
    assert on a GPU. One min and one max, read once per forward."""
    if not positions.numel():
        return
    low, high = int(positions.min()), int(positions.max())
    if low < 0 or high >= seq_len:
        raise ValueError(f"packed position {low if low < 0 else high} is outside the model's "
                         f"window: each token's position in its document must be in "
                         f"[0, seq_len={seq_len})")


def check_packing(vision_patches: int) -> None:
    """Packed documents need a model that can mask by document: a vision-language model's
    image prefix (`minitp.model.vision`) sits before the text with no document of its own,
    so packing is refused there."""
    if vision_patches:
        raise ValueError(f"packed documents with a vision-language model ({vision_patches} "
                         "image patches a row): its image prefix has no document to mask by, "
                         "so packing is refused")
