"""Checks for ex15: a vision-language model's image tokens on a sequence-parallel rank, and
when the encoder's gradients are partial over tp.

The reference is what minitp builds, not a second copy of the arithmetic: the placement
is `minitp.tensor_parallel.vision.SequenceShardedPlace` (the module `parallelize` puts in
a vision-language model under sequence parallelism), called here with this grader's own
axis, no collective; whether the encoder's gradients are partial is read from the tags
`apply_vision_parallel` sets on a small vision-language GPT's encoder
(``grad_partial_over_tp``: summed over tp with the other partial gradients).

In this process, float64, on `mt.device()`:

* `place_image_tokens` at every rank of (P, T, t) = (2, 12, 3) (the image shorter than
  one slice), (6, 16, 4) (one slice all image, the next half), (8, 12, 3) (two whole
  slices), (5, 8, 2). A wrong result is matched against what each usual slip gives,
  judged by every wrong case: the image's first tokens at every rank's start (local
  positions), a rank past the image's end with a negative count (no ``max(0, …)``), a
  rank's image tokens not capped at its slice (overflowing), and the whole image on rank
  0 only;
* its gradient, once the values are right: image[:, start:start + mine] gets the upstream
  gradient of the rank's first `mine` positions and every other image position none; its
  embeddings the rest. An image cut off the graph is named;
* `encoder_grads_are_partial` for both layouts with and without sequence parallelism,
  and a ValueError for a layout minitp does not have. The first wrong setting alone is
  named (with why): the others are neither shown nor counted, so one wrong attempt does
  not give away the whole table.
"""

from __future__ import annotations

from functools import cache

import torch

from ...model import GPT, GPTConfig
from ...runtime._device import device
from ...runtime.mesh import Axis
from ...sharding.tags import tag
from ...tensor_parallel.vision import SequenceShardedPlace, apply_vision_parallel
from .base import Check, crashed, not_written

B, C = 2, 3  # batch, the decoder's width
CASES = ((2, 12, 3), (6, 16, 4), (8, 12, 3), (5, 8, 2))  # (P image tokens, T positions, t)
SETTINGS = (("replicated", True), ("tensor", True), ("replicated", False), ("tensor", False))
UNKNOWN = "tensor_parallel"  # a layout minitp does not have (`minitp.rules.vision.VISION_LAYOUTS`)
TOLERANCE = 1e-12  # float64: a cat of slices is exact
VLM = dict(vocab_size=256, seq_len=8, n_layer=1, n_head=2, d_model=8,
           vision_patches=2, vision_layers=1, vision_width=8, vision_heads=2)
NAMES = ["place_image_tokens: each rank's slice of the joined sequence, every rank",
         "place_image_tokens: the gradient reaches exactly the image tokens the rank placed",
         "encoder_grads_are_partial: when the encoder's gradients must be summed over tp"]
PLACE_HINT = ("count the image positions inside this rank's slice — it starts at global "
              "position rank·T/t and holds T/t — never fewer than 0, never more than T/t; those "
              "image tokens first, then x_local's positions after them")

# The usual slips, each as the placement it gives, and what to say when a learner's answers
# are exactly that slip's (judged by every wrong case; tried in this order).


def _slips():
    def local(image, x, rank, tp):  # the rank's own count, from image position 0
        mine = _mine(image, x, rank)
        return torch.cat([image[:, :mine], x[:, mine:]], dim=1)

    def unclamped(image, x, rank, tp):  # no max(0, ...)
        start, local = rank * x.shape[1], x.shape[1]
        mine = min(image.shape[1] - start, local)
        return torch.cat([image[:, start:start + mine], x[:, mine:]], dim=1)

    def uncapped(image, x, rank, tp):  # no min(..., T/t)
        start = rank * x.shape[1]
        mine = max(0, image.shape[1] - start)
        return torch.cat([image[:, start:start + mine], x[:, mine:]], dim=1)

    def rank_zero(image, x, rank, tp):  # the one-device PlacePrefix, on rank 0 alone
        return torch.cat([image, x[:, image.shape[1]:]], dim=1) if rank == 0 else x

    return (
        (local, "the image at every rank's start: image[:, :mine] are image positions 0 .. "
         "mine - 1, rank 0's. Rank r's slice begins at global position start = r·T/t, so its "
         "image tokens are image[:, start:start + mine]; as written every rank repeats the "
         "image's first tokens and the rest of the image is never placed"),
        (unclamped, "a rank past the image's end got a negative count (P - start < 0), and "
         "x_local[:, mine:] then kept only its last |mine| embeddings: clamp it, mine = "
         "max(0, ...). Such a rank places no image token and keeps all its embeddings"),
        (uncapped, "overflowing: mine was not capped at T/t. A rank whose slice is all image "
         "still holds only T/t positions; the image tokens past its slice are the next "
         "rank's"),
        (rank_zero, "the whole image on rank 0 only, overflowing: rank 0 holds T/t positions, "
         "so the image tokens past them are not its own but the next ranks', each placing "
         "the ones inside its slice (and none on a rank past the image)"),
    )


def _mine(image, x, rank) -> int:
    local = x.shape[1]
    return max(0, min(image.shape[1] - rank * local, local))


def _reference(image, x, rank, tp):
    return SequenceShardedPlace(Axis("tp", tuple(range(tp)), rank), whole_grad=False)(image, x)


def _inputs(P, T, t, seed):
    g = torch.Generator().manual_seed(seed)
    image = torch.randn(B, P, C, generator=g, dtype=torch.float64).to(device())
    x = torch.randn(t, B, T // t, C, generator=g, dtype=torch.float64).to(device())
    grad = torch.randn(B, T // t, C, generator=g, dtype=torch.float64).to(device())
    return image, x, grad  # x[r]: rank r's slice of the token embeddings


def _same(got, want) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and (got.detach().double() - want).abs().max().item() <= TOLERANCE)


def _case(P, T, t, rank) -> str:
    local = T // t
    start, mine = rank * local, max(0, min(P - rank * local, local))
    image = f"image {start}..{start + mine - 1}" if mine else "no image"
    return f"P={P}, T={T}, t={t}, rank {rank} (positions {start}..{start + local - 1}: {image})"


def run(module) -> list[Check]:
    for function in ("place_image_tokens", "encoder_grads_are_partial"):
        if not hasattr(module, function):
            return [Check(n, False, f"the file has no {function}",
                          hint="keep the names of the exercise file") for n in NAMES]
    try:
        placed = _placement(module.place_image_tokens, NAMES[0])
    except NotImplementedError as exc:
        placed = not_written([NAMES[0]], "place_image_tokens", str(exc))[0]
    if placed.passed:
        try:
            gradient = _gradient(module.place_image_tokens, NAMES[1])
        except Exception as exc:  # noqa: BLE001  (the learner's code: say what it raised)
            gradient = crashed([NAMES[1]], "the backward", exc, "return a tensor built from "
                               "image and x_local by slicing and torch.cat")[0]
    else:
        why = ("place_image_tokens is not written yet" if "not written" in placed.detail
               else "the values above are wrong")
        gradient = Check(NAMES[1], False, f"not checked: {why}")
    try:
        partial = _partial(module.encoder_grads_are_partial, NAMES[2])
    except NotImplementedError as exc:
        partial = not_written([NAMES[2]], "encoder_grads_are_partial", str(exc))[0]
    except Exception as exc:  # noqa: BLE001
        partial = crashed([NAMES[2]], "encoder_grads_are_partial", exc,
                          "return True or False for each of the four settings")[0]
    return [placed, gradient, partial]


# --------------------------------------------------------------------------- the placement
def _placement(place, name) -> Check:
    wrong = []  # (case, rank, yours, minitp's, the inputs)
    for seed, (P, T, t) in enumerate(CASES):
        image, x, _ = _inputs(P, T, t, seed)
        for rank in range(t):
            try:
                got = place(image.clone(), x[rank].clone(), rank, t)
            except NotImplementedError:
                raise
            except Exception as exc:  # noqa: BLE001  (the learner's code: say what it raised)
                return crashed([name], _case(P, T, t, rank), exc,
                               f"work this case through by hand: {PLACE_HINT}")[0]
            want = _reference(image, x[rank], rank, t)
            if not _same(got, want):
                wrong.append(((P, T, t), rank, got, want, (image, x[rank])))
    if not wrong:
        return Check(name, True, f"{len(CASES)} (P, T, t) cases, every rank: the image shorter "
                     "than a slice, spanning two, filling two whole")
    hint = next((words for slip, words in _slips()
                 if all(_same(got, slip(*inputs, rank, case[2]))
                        for case, rank, got, _, inputs in wrong)), None)
    (P, T, t), rank, got, want, _ = max(wrong, key=lambda w: w[1])  # a rank above 0 if any
    if not isinstance(got, torch.Tensor):
        return Check(name, False, f"{_case(P, T, t, rank)}: returned {type(got).__name__}",
                     rank=rank, hint="return a tensor (B, T/t, C): " + PLACE_HINT)
    if got.shape != want.shape:
        return Check(name, False, f"{_case(P, T, t, rank)}: shape {tuple(got.shape)}, not "
                     f"{tuple(want.shape)}", rank=rank, hint=hint or "the result is this "
                     "rank's slice, T/t positions, no more, no fewer: " + PLACE_HINT)
    error = (got.detach().double() - want).abs().max().item()
    return Check(name, False, f"{_case(P, T, t, rank)}: largest error {error:.3g} from "
                 "minitp's SequenceShardedPlace", rank=rank, tensor="the result",
                 max_error=error, hint=hint or PLACE_HINT)


# --------------------------------------------------------------------------- the gradient
def _grads(place, image, x, rank, tp, grad):
    """d(<out, grad>)/d image and / d x, zeros where nothing reached them."""
    image, x = image.clone().requires_grad_(), x.clone().requires_grad_()
    out = place(image * 1, x * 1, rank, tp)  # not leaves, as the encoder's and embedding's are
    if not out.requires_grad:
        return torch.zeros_like(image), torch.zeros_like(x)
    found = torch.autograd.grad(out, (image, x), grad, allow_unused=True)
    return tuple(torch.zeros_like(v) if g is None else g.detach()
                 for g, v in zip(found, (image, x), strict=True))


def _gradient(place, name) -> Check:
    for seed, (P, T, t) in enumerate(CASES):
        image, x, grad = _inputs(P, T, t, seed)
        for rank in range(t):
            got = _grads(place, image, x[rank], rank, t, grad)
            want = _grads(_reference, image, x[rank], rank, t, grad)
            for tensor, g, w in zip(("image", "x_local"), got, want, strict=True):
                error = (g.double() - w).abs().max().item()
                if error <= TOLERANCE:
                    continue
                mine = _mine(image, x[rank], rank)
                if tensor == "image" and not g.any():
                    hint = ("no gradient reached the image tokens: the values are right, but "
                            "something cut them off the graph (a .detach(), .data, "
                            "torch.no_grad(), a copy through .tolist() or numpy), so the "
                            "encoder would never learn from the text after it")
                elif tensor == "image":
                    hint = ("image[:, start:start + mine] gets the upstream gradient of this "
                            "rank's first mine positions; every other image position none "
                            "(another rank's slice holds it)")
                else:
                    hint = ("the embeddings the image tokens replaced are not in the sequence: "
                            "no gradient for x_local[:, :mine], the upstream gradient for the "
                            "rest")
                return Check(name, False, f"{_case(P, T, t, rank)}: the gradient of {tensor} "
                             f"is off by {error:.3g} (mine = {mine})", rank=rank,
                             tensor=f"{tensor}.grad", max_error=error, hint=hint)
    return Check(name, True, f"{len(CASES)} (P, T, t) cases, every rank: image and x_local")


# --------------------------------------------------------------------------- partial grads
@cache
def _partial_reference(layout: str, sequence_parallel: bool) -> bool:
    """Whether `apply_vision_parallel` (what `parallelize` runs) tags the encoder's
    parameters as partial over tp: a small vision-language GPT, rank 0 of tp = 2."""
    model = GPT(GPTConfig(**VLM)).to(device())
    apply_vision_parallel(model, Axis("tp", (0, 1), 0), sequence_parallel, layout)
    return any(tag(p, "grad_partial_over_tp") for p in model.vision.parameters())


PARTIAL_HINTS = {
    ("replicated", True): (
        "the encoder's gradients not reduced over tp: under sequence parallelism each rank "
        "placed only the image tokens in its slice, so its encoder gradient is one term of "
        "the sum; without the all-reduce the copies drift apart with no error (lesson 15 "
        "runs it)"),
    ("tensor", True): (
        "the split encoder's image tokens have their gradient all-reduced before its "
        "backward, so each weight has its whole gradient"),
    ("replicated", False): (
        "without sequence parallelism every rank places all P image tokens and gets their "
        "whole gradient"),
}
PARTIAL_HINTS[("tensor", False)] = PARTIAL_HINTS[("replicated", False)]


def _partial(partial, name) -> Check:
    for layout, sp in SETTINGS:  # the first wrong setting only: a bool named is a bool told
        got, want = partial(layout, sp), _partial_reference(layout, sp)
        if isinstance(got, bool) and got == want:
            continue
        said = f"layout {layout!r}, sequence_parallel={sp}: you said {got!r}"
        if not isinstance(got, bool):
            return Check(name, False, said, hint="return a bool, True or False, for each "
                         "(layout, sequence_parallel)")
        return Check(name, False, f"{said}, minitp "
                     f"{'sums them over tp' if want else 'does not sum them'}",
                     hint=PARTIAL_HINTS[(layout, sp)])
    try:
        answer = partial(UNKNOWN, True)
    except ValueError:
        return Check(name, True, "both layouts, with and without sequence parallelism, and "
                     "an unknown layout refused")
    except Exception as exc:  # noqa: BLE001  (the learner's code: say what it raised)
        said = f"raised {type(exc).__name__}: {exc}"
    else:
        said = f"returned {answer!r}"
    return Check(name, False, f"the layout {UNKNOWN!r} (minitp has none such) {said}",
                 hint="raise ValueError for a layout that is neither 'replicated' nor "
                 "'tensor': a typo must stop the run, not train it with the wrong sum")
