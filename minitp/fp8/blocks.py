"""Blackwell's block-scaled formats, emulated exactly: MXFP8 and NVFP4.

Hopper's FP8 scales a tensor (or a row) at a time (`minitp.fp8.formats`). These scale
*blocks* of consecutive values along the GEMM's reduction dimension, so a block's scale is
computed from that block alone:

* **MXFP8** (OCP Microscaling Formats (MX) Specification v1.0, §5 and §6.3; torchao's
  ``to_mx``, torchao/prototype/mx_formats/mx_tensor.py): blocks of 32 e4m3 values, each
  block with one e8m0 scale (8 bits: a power of two, 2^-127 … 2^127, and NaN). §6.3's
  conversion: X = 2^(floor(log2(amax)) − emax_elem), emax_elem the exponent of the element
  format's largest normal (e4m3: 8, as 448 = 1.75·2^8; e2m1: 2, as 6 = 1.5·2^2); then each
  value V/X rounded to nearest (ties to even) onto the element format, and a value above its
  largest normal (V/X reaches up to 2^(emax+1)) clamped to it: saturating. The exponent is
  clamped to e8m0's range (as torchao clamps it).
* **NVFP4** (NVIDIA's two-level scaling as torchao's ``nvfp4_quantize`` and
  ``per_tensor_amax_to_scale`` implement it, torchao/prototype/mx_formats/nvfp4_tensor.py):
  blocks of 16 e2m1 values (4 bits: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}), each block with an e4m3
  scale, all under one float32 scale for the whole tensor, s_t = amax/(448·6): a block's
  scale is its amax/6 in units of s_t, clamped to [2^-6, 448] and rounded to e4m3; then each
  value x/(s_b·s_t), clamped to ±6, rounded to nearest-even e2m1.

Zeros, NaN and inf: a block of zeros takes the smallest scale (e8m0 2^-127; e4m3 2^-6) and
casts to zeros exactly; a tensor of zeros takes s_t = 1. A block holding NaN or ±inf casts
to NaN whole (scale code NaN: e8m0 0xFF, e4m3 0x7F): minitp's rule everywhere
(`formats.scale_from_amax`), never a finite number that hides it. (torchao does the same for
NaN; an inf it saturates to the block's largest value.)

Every function returns the values the GEMM multiplies, in x's dtype (quantize-dequantize),
or with ``encode`` the codes: uint8 element codes (e4m3 bytes, e2m1 nibbles) and the block
scales' codes (e8m0 or e4m3 bytes), which decode to exactly those values.
"""

from __future__ import annotations

import torch

from .formats import E4M3, Format

E2M1 = Format("e2m1", torch.float4_e2m1fn_x2, 6.0, 1, 0)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0…7; bit 3 is the sign
E8M0_BIAS, E8M0_NAN = 127, 255
E4M3_TINY = 2.0 ** -6  # torchao's E4M3_EPS: the smallest normal e4m3, NVFP4's least scale
BLOCKS = {"mxfp8": 32, "nvfp4": 16}  # values a scale (OCP MX v1.0 §5; NVIDIA NVFP4)
ELEMENTS = {"mxfp8": E4M3, "nvfp4": E2M1}


def emax(fmt: Format) -> int:
    """The exponent of `fmt`'s largest normal value: floor(log2(max))."""
    return int(torch.frexp(torch.tensor(fmt.max, dtype=torch.float64))[1]) - 1


def round_to(v: torch.Tensor, fmt: Format) -> torch.Tensor:
    """v rounded to nearest, ties to even, onto `fmt`'s values, saturating at ±max (NaN
    stays NaN, −0 stays −0): the spacing is 2^(e−m) in the binade [2^e, 2^(e+1)), and
    2^(min_exp−m) below the normals (the subnormals). torch.round rounds halves to even,
    and an even multiple of the spacing is an even mantissa."""
    a = v.abs().clamp(max=fmt.max)
    exponent = torch.frexp(a)[1] - 1  # floor(log2 a), exact (0 for a = 0)
    spacing = torch.ldexp(torch.ones_like(a), exponent.clamp(min=fmt.min_exp)
                          - fmt.mantissa_bits)
    return (torch.round(a / spacing) * spacing).copysign(v)


def e2m1_codes(q: torch.Tensor) -> torch.Tensor:
    """The 4-bit codes (in uint8) of values already on the e2m1 grid."""
    table = torch.tensor(E2M1_VALUES, dtype=q.dtype, device=q.device)
    index = torch.searchsorted(table, q.abs().nan_to_num(0.0).contiguous())
    return (index | (q.signbit().to(torch.long) << 3)).to(torch.uint8)


def e2m1_values(codes: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """What 4-bit e2m1 codes stand for (OCP MX v1.0 §5.3.3's table)."""
    table = torch.tensor(E2M1_VALUES, dtype=dtype, device=codes.device)
    value = table[(codes & 7).long()]
    return torch.where((codes & 8) > 0, -value, value)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes a byte, the first in the low nibble (torchao's ``pack_uint4``), as
    torch's own ``float4_e2m1fn_x2`` (which on a CPU stores them and converts nothing)."""
    flat = codes.reshape(-1)
    return (flat[0::2] | (flat[1::2] << 4)).view(torch.float4_e2m1fn_x2)


def _blocks(x: torch.Tensor, block: int, what: str) -> torch.Tensor:
    k = x.shape[-1]
    if k % block:
        raise ValueError(f"{what}: blocks of {block} run along the GEMM's reduction dimension, "
                         f"and this rank's is {k} long, not a whole number of blocks")
    return x.reshape(*x.shape[:-1], k // block, block)


def mx_encode(x: torch.Tensor, fmt: Format = E4M3, block: int = 32):
    """(element codes, e8m0 scale codes, scales) of x in blocks along its last dimension."""
    blocks = _blocks(x, block, f"mx{fmt.name}")
    amax = blocks.abs().amax(-1, keepdim=True)
    shared = (torch.frexp(amax)[1] - 1 - emax(fmt)).clamp(-E8M0_BIAS, E8M0_BIAS)
    shared = torch.where(amax > 0, shared, -E8M0_BIAS)  # zeros: the least scale
    finite = amax.isfinite()
    scale = torch.where(finite, torch.ldexp(torch.ones_like(amax), shared), torch.nan)
    scale_codes = torch.where(finite, shared + E8M0_BIAS, E8M0_NAN).to(torch.uint8)
    scaled = blocks / scale  # exact: a power of two
    if fmt is E4M3:  # torch's own cast: round to nearest even (saturating after the clamp)
        codes = scaled.clamp(-fmt.max, fmt.max).to(fmt.dtype).view(torch.uint8)
    else:
        codes = e2m1_codes(round_to(scaled, fmt))
    return codes.reshape(x.shape), scale_codes.squeeze(-1), scale.squeeze(-1)


def nvfp4_tensor_scale(tensor_amax: torch.Tensor) -> torch.Tensor:
    """s_t = amax/(448·6) (torchao's ``per_tensor_amax_to_scale``); 1 for an all-zero tensor,
    NaN for a non-finite amax."""
    wide = tensor_amax.to(torch.float64)
    s = torch.where(wide > 0, wide / (E4M3.max * E2M1.max), 1.0)
    return torch.where(wide.isfinite(), s, torch.nan).to(tensor_amax.dtype)


def nvfp4_encode(x: torch.Tensor, tensor_amax: torch.Tensor, block: int = 16):
    """(e2m1 codes, e4m3 block-scale codes, block scales·s_t) of x along its last dimension,
    under the tensor's amax (the whole tensor's, however many ranks hold pieces of it)."""
    blocks = _blocks(x, block, "nvfp4")
    s_t = nvfp4_tensor_scale(tensor_amax)
    amax = blocks.abs().amax(-1, keepdim=True)
    s_b = (amax / E2M1.max / s_t).clamp(E4M3_TINY, E4M3.max)
    s_b = torch.where(amax.isfinite(), s_b, torch.nan).to(E4M3.dtype)  # NaN: e4m3's 0x7F
    scale = s_b.to(x.dtype) * s_t
    codes = e2m1_codes(round_to(blocks / scale, E2M1))
    return codes.reshape(x.shape), s_b.view(torch.uint8).squeeze(-1), scale.squeeze(-1)


def decode(codes: torch.Tensor, scale: torch.Tensor, fmt: Format, block: int,
           dtype=torch.float64) -> torch.Tensor:
    """Element codes times their block's scale, in `dtype`."""
    values = (codes.view(fmt.dtype).to(dtype) if fmt is E4M3 else e2m1_values(codes, dtype))
    blocks = values.reshape(*values.shape[:-1], -1, block)
    return (blocks * scale.unsqueeze(-1).to(dtype)).reshape(codes.shape)


def block_quantize(x: torch.Tensor, recipe: str, tensor_amax: torch.Tensor | None = None,
                   along: str = "row") -> torch.Tensor:
    """x cast by `recipe` ("mxfp8" or "nvfp4") and read back, in x's dtype. ``along="row"``:
    blocks along the last dimension; ``"column"``: along the flattened leading ones (a
    token dimension, a weight's output rows), for the GEMMs that sum over those."""
    rows = x.reshape(-1, x.shape[-1])
    rows = rows.t() if along == "column" else rows
    block, fmt = BLOCKS[recipe], ELEMENTS[recipe]
    if recipe == "mxfp8":
        codes, _, scale = mx_encode(rows, fmt, block)
    else:
        amax = rows.abs().max() if tensor_amax is None else tensor_amax
        codes, _, scale = nvfp4_encode(rows, amax, block)
    q = decode(codes, scale, fmt, block, x.dtype)
    return (q.t() if along == "column" else q).reshape(x.shape)
