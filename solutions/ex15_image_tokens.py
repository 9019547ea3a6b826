"""Exercise 15: a vision-language model's image tokens on a sequence-parallel rank, and
whose gradient the encoder's copies must sum.

A vision-language model's sequence (lesson 15) is P image tokens — the encoder's P
outputs, projected to the decoder's width C — followed by the text's token
embeddings: T positions in all, the first P the image's. Under sequence parallelism
each of the t tensor-parallel ranks holds one contiguous slice of the T positions:
rank r holds positions [r·T/t, (r+1)·T/t). So rank r places only the image tokens
whose positions fall inside its slice, and keeps its own token embeddings for the
rest. Depending on P, one rank's slice may be all image, the next half image and half
text, the last ones no image at all: your function must be right for each of them.

The encoder has two layouts over tp (`minitp.tensor_parallel.vision`):

* "replicated": every rank holds the whole encoder and runs it on the whole image;
* "tensor": the encoder's blocks split over tp as the decoder's are, its image
  tokens' gradient all-reduced over tp before the encoder's backward.

Write, with plain tensor indexing and logic (no collectives: the grader calls them
in this process):

* `place_image_tokens(image, x_local, rank, tp)`: image (B, P, C), the encoder's
  output, the same on every rank; x_local (B, T/t, C), this rank's slice of the
  token embeddings. Return this rank's slice of the joined sequence, (B, T/t, C):
  the image tokens inside its slice, then its own embeddings. The encoder learns
  through this function: the gradient must reach the image tokens it placed.
* `encoder_grads_are_partial(layout, sequence_parallel)`: True when each tp rank's
  gradients of the encoder's parameters are only one term of the true gradient,
  so they must be summed over tp (left unsummed, the ranks' copies of the encoder
  drift apart); False when every rank's are already whole. Raise ValueError for a
  layout that is neither "replicated" nor "tensor".

Grade it with `mt.grade("ex15")` in a notebook or `python -m minitp.course.grade ex15`:
the placement against minitp's own (`SequenceShardedPlace`) for images shorter than a
slice, spanning two slices, and filling whole slices, on every rank; its gradient; and
the four (layout, sequence parallelism) settings against what `parallelize` builds.
"""

import torch


def place_image_tokens(image: torch.Tensor, x_local: torch.Tensor, rank: int,
                       tp: int) -> torch.Tensor:
    """This rank's slice (B, T/t, C) of [image tokens, text embeddings]."""
    # BEGIN SOLUTION
    # hint: T/t is x_local.shape[1]. At which global position does this rank's slice start,
    # hint: and how many of the image's P positions lie inside it? (Can that count be below
    # hint: zero, or above T/t?) Those image tokens come first, then the rest of x_local.
    local = x_local.shape[1]
    start = rank * local
    mine = max(0, min(image.shape[1] - start, local))
    return torch.cat([image[:, start:start + mine], x_local[:, mine:]], dim=1)
    # END SOLUTION


def encoder_grads_are_partial(layout: str, sequence_parallel: bool) -> bool:
    """Whether each tp rank's encoder gradients are one term of a sum over tp."""
    # BEGIN SOLUTION
    # hint: a rank's encoder gradient is partial when the gradient that reached its image
    # hint: tokens was partial. Without sequence parallelism, which image tokens does each
    # hint: rank place? With it, under "tensor", what happens to their gradient before the
    # hint: encoder's backward?
    if layout not in ("replicated", "tensor"):
        raise ValueError(f"layout must be 'replicated' or 'tensor', got {layout!r}")
    return layout == "replicated" and sequence_parallel
    # END SOLUTION
