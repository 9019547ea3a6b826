"""The three scalings: where a tensor's scale comes from.

* ``tensorwise`` — one scale for the whole tensor, from its amax *now* (TransformerEngine's
  ``Float8CurrentScaling``, torchao's tensorwise): the cast reads the tensor twice, once for
  the amax, once to cast.
* ``delayed`` — one scale for the whole tensor, from the largest amax of the last
  ``history_len`` casts of that tensor, *before* this one (TransformerEngine's
  ``DelayedScaling(amax_history_len=…, amax_compute_algo="max")``); this cast's amax is then
  recorded. The very first cast has no history: minitp scales it by its own amax
  (TransformerEngine starts from scale 1 instead). A window whose largest amax is inf, NaN
  or 0 keeps the previous scale, as TransformerEngine's ``_default_sf_compute`` does.
* ``rowwise`` — one scale per row of the operand as its GEMM reads it, the amax along the
  GEMM's reduction dimension (torchao's ``ROWWISE`` recipe, torchtitan's
  ``--float8.recipe_name rowwise``), every scale rounded down to a power of two as torchao's
  ``round_scales_to_power_of_2`` does. ``along="row"``: the amax over the last dimension
  (a token's features, a weight's inputs); ``along="column"``: over every other dimension
  (a feature's tokens, a weight column's outputs), for the backward's re-casts
  (`minitp.fp8.casts`).

* ``mxfp8``, ``nvfp4`` — Blackwell's block scales (`minitp.fp8.blocks`), blocks along the
  GEMM's reduction dimension as rowwise's rows (``along`` the same); a block's scale needs
  no other rank (`minitp.rules.fp8_groups.check_fp8_blocks` keeps every block on one), so
  only NVFP4's one tensor scale reduces an amax.

Every amax is reduced with MAX over the axes that split the tensor (`minitp.rules.fp8_groups`)
before it makes a scale: then each rank's piece is cast with the scale of the whole tensor,
as one process would cast it.
"""

from __future__ import annotations

import torch

from ..rules.fp8_groups import BLOCK_SCALINGS, SCALINGS
from ..runtime import comm, trace
from .blocks import block_quantize
from .formats import Format, quantize, round_down_to_power_of_2, scale_from_amax

DEFAULT_HISTORY = 16  # TransformerEngine's default is 1024 (recipe.DelayedScaling); minitp's
# runs are a few hundred steps, so a shorter window lets the scale follow the tensor


ALONG = ("row", "column")


def local_amax(x: torch.Tensor, scaling: str, along: str = "row") -> torch.Tensor:
    """The largest |x| this rank sees: one number, or (rowwise) one a row, (…, 1), or one a
    column, (1, …, 1, n)."""
    if scaling != "rowwise":
        return x.detach().abs().max()
    dims = -1 if along == "row" else tuple(range(x.dim() - 1))
    return x.detach().abs().amax(dim=dims, keepdim=True)


class TensorScale:
    """The scale of one tensor role of one layer (its input, weight or output gradient):
    its scaling, the axes its amax is reduced over, and (delayed) its amax history.

    ``cast(x)`` is x quantized to `fmt` with the scale of the whole tensor x is a piece of."""

    def __init__(self, scaling: str, fmt: Format, axes=(), history_len: int = DEFAULT_HISTORY,
                 name: str = "", along: str = "row", power_of_2: bool = False):
        if scaling not in SCALINGS:
            raise ValueError(f"fp8 scaling must be one of {SCALINGS}, got {scaling!r}")
        if along not in ALONG:
            raise ValueError(f"a rowwise scale runs along one of {ALONG}, got {along!r}")
        self.scaling, self.fmt, self.axes = scaling, fmt, tuple(axes)
        self.along, self.power_of_2 = along, power_of_2
        self.history_len, self.name = history_len, name
        self.history: list[torch.Tensor] = []  # delayed: the last amaxes, oldest first
        self.last_scale: torch.Tensor | None = None  # what the latest cast used (to read)
        self.held: torch.Tensor | None = None  # delayed: the last recorded cast's scale

    def amax(self, x: torch.Tensor) -> torch.Tensor:
        """The amax of the whole tensor: this rank's, MAX-reduced over the axes."""
        amax = local_amax(x, self.scaling, self.along)
        with trace.label(f"fp8 amax {self.name}".strip()):
            for axis in self.axes:
                amax = comm.all_reduce(amax, axis, op="max")
        return amax

    def scale(self, x: torch.Tensor, record: bool = True) -> torch.Tensor:
        """x's scale; `record` (delayed): add this amax to the history (a training cast
        does, an evaluation forward only reads the history)."""
        amax = self.amax(x)
        if self.scaling == "delayed":
            return self._delayed(amax, record)
        scale = scale_from_amax(amax, self.fmt)
        return round_down_to_power_of_2(scale, self.fmt) if self.power_of_2 else scale

    def _delayed(self, amax: torch.Tensor, record: bool) -> torch.Tensor:
        """TransformerEngine's rule (``_default_sf_compute``, transformer_engine/pytorch/
        quantization.py): max/amax of the window's largest amax; where that is not finite,
        or is 0, the previous scale is kept (1 before any). The amax is recorded as it is,
        inf and NaN too (torch.max carries a NaN), so one non-finite amax holds the scale for
        the `history_len` casts it stays in the window, and each of them is still cast."""
        past = torch.stack(self.history).max() if self.history else amax
        held = self.held if self.held is not None else torch.ones_like(amax)
        scale = torch.where(past.isfinite() & (past > 0), scale_from_amax(past, self.fmt), held)
        if record:
            self.history = (self.history + [amax])[-self.history_len:]
            self.held = scale
        return scale

    def cast(self, x: torch.Tensor, record: bool = True) -> torch.Tensor:
        if self.scaling in BLOCK_SCALINGS:  # NVFP4's tensor scale: the whole tensor's amax
            self.last_scale = self.amax(x) if self.scaling == "nvfp4" else None
            return block_quantize(x, self.scaling, self.last_scale, self.along)
        self.last_scale = self.scale(x, record)
        return quantize(x, self.last_scale, self.fmt)

    def __repr__(self) -> str:
        axes = ", ".join(f"{a.name}={a.size}" for a in self.axes) or "none"
        how = (f"{self.scaling} along each {self.along}"
               if self.scaling == "rowwise" or self.scaling in BLOCK_SCALINGS else self.scaling)
        how += ", powers of 2" if self.power_of_2 else ""
        return f"TensorScale({self.name}: {how}, {self.fmt.name}, amax over {axes})"
