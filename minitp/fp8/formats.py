"""The two FP8 formats and the scaled cast, emulated exactly in a wider dtype.

An FP8 number has 8 bits: a sign, e exponent bits and m mantissa bits (OCP FP8 spec,
as PyTorch's dtypes):

* ``e4m3`` (`torch.float8_e4m3fn`): 3 mantissa bits, largest finite value 448, no
  infinity. Forward tensors (activations and weights): precision matters most there; under
  torchao's rowwise recipe the gradients too (a scale per row keeps them in range).
* ``e5m2`` (`torch.float8_e5m2`): 2 mantissa bits, largest value 57344. Gradients under one
  scale a tensor: their values spread over more orders of magnitude (TransformerEngine's
  "HYBRID" format).

A tensor is cast with a *scale*: q = fp8(clamp(x·scale, ±max)), and read back as q/scale.
With scale = max/amax (amax the largest |x| the scale is meant for) the largest value lands
on the format's largest: TransformerEngine's ``scaling_factor = FP8_MAX / amax``
(docs: features/low_precision_training/fp8_delayed_scaling) and torchao's
``amax_to_scale`` (float8_max / amax) use the same convention.

`quantize` returns the dequantized tensor q/scale in x's own dtype: the numbers an FP8 GEMM
would multiply, so a matmul of them in float64 is the FP8 GEMM's, exactly, up to the
float64 rounding of its sums (a real GEMM accumulates in float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Format:
    name: str
    dtype: torch.dtype
    max: float       # the largest finite value
    mantissa_bits: int
    min_exp: int = 0  # the smallest normal number's exponent (below it: subnormals)


E4M3 = Format("e4m3", torch.float8_e4m3fn, 448.0, 3, -6)
E5M2 = Format("e5m2", torch.float8_e5m2, 57344.0, 2, -14)
FORMATS = {f.name: f for f in (E4M3, E5M2)}


# The smallest amax a scale is made from: torchao's EPS (torchao/float8/float8_utils.py,
# amax_to_scale). Without a floor, max/amax overflows float32 for amax below max/FLT_MAX
# (e4m3: 1.3e-36, e5m2: 1.7e-34): an infinite scale, and then 0·inf = NaN for every zero.
EPS = 1e-12


def scale_from_amax(amax: torch.Tensor, fmt: Format) -> torch.Tensor:
    """max/amax, elementwise, in amax's dtype: positive and finite for every finite amax.

    As torchao's ``amax_to_scale``: divided in float64, on amax clamped to at least `EPS`
    (so at most max/1e-12, which float32 holds). 1 where amax is 0 (an all-zero tensor: any
    scale casts it exactly), as TransformerEngine leaves a zero amax's scale. NaN where amax
    is inf or NaN: the tensor held a non-finite value, and its cast is then all NaN rather
    than a finite number that hides it (delayed scaling keeps its previous scale instead:
    `minitp.fp8.scaling`)."""
    wide = amax.to(torch.float64)
    scale = torch.where(wide > 0, fmt.max / wide.clamp_min(EPS), 1.0)
    scale = torch.where(wide.isfinite(), scale, torch.nan).to(amax.dtype)
    # Rounded down, the scale of an amax within an ulp of the dtype's largest value would
    # read the format's max back as inf (448/scale > DBL_MAX): one ulp up keeps it finite.
    return torch.where((fmt.max / scale).isinf(), torch.nextafter(scale, scale + 1), scale)


def round_down_to_power_of_2(scale: torch.Tensor, fmt: Format) -> torch.Tensor:
    """The largest power of two ≤ scale (torchao's ``_round_scale_down_to_power_of_2``,
    torchao/float8/float8_utils.py, which its rowwise recipe applies to every scale): a
    power-of-two scale multiplies and divides exactly, and maps equal values to equal codes
    whatever the tensor around them. torchao rounds its float32 scale; minitp the scale in
    the run's dtype (the two differ only where float32 rounds max/amax up to a power of two).
    Where that halving would read the format's max back as inf (an amax within a factor 2 of
    the dtype's largest value), the power above: the amax then saturates, as a cast does."""
    down = torch.exp2(torch.floor(torch.log2(scale)))
    return torch.where((fmt.max / down).isinf(), down * 2, down)


def to_fp8(x: torch.Tensor, scale: torch.Tensor, fmt: Format) -> torch.Tensor:
    """The 8-bit tensor: x·scale clamped to the format's range, rounded to nearest (even)."""
    return (x * scale).clamp(-fmt.max, fmt.max).to(fmt.dtype)


def from_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The values an 8-bit tensor stands for: q/scale, in `dtype`."""
    return q.to(dtype) / scale


def quantize(x: torch.Tensor, scale: torch.Tensor, fmt: Format) -> torch.Tensor:
    """x cast to `fmt` with `scale` and read back, in x's dtype (quantize-dequantize)."""
    return from_fp8(to_fp8(x, scale, fmt), scale, x.dtype)


def representable(fmt: Format, dtype=torch.float64) -> torch.Tensor:
    """Every finite value of `fmt`, sorted (the 8-bit patterns, NaNs left out)."""
    values = torch.arange(256, dtype=torch.uint8).view(fmt.dtype).to(dtype)
    return values[values.isfinite()].unique()
