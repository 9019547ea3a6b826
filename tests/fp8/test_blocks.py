"""`minitp.fp8.blocks`, MXFP8's and NVFP4's casts, bit for bit against torch's own dtypes
(``float8_e8m0fnu``, ``float8_e4m3fn``, ``float4_e2m1fn_x2``) and, where it is installed,
torchao's reference casts; the edges: zeros, subnormals, the extremes, NaN and inf."""

import hashlib

import pytest
import torch

from minitp.fp8 import blocks
from minitp.fp8.formats import E4M3

F64 = torch.float64


def _e4m3_grid() -> torch.Tensor:
    """Every finite e4m3 value, the midpoints between neighbours, and a float32 ulp either
    side of each midpoint: every place round-to-nearest-even can go wrong."""
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    values = values[values.isfinite()].unique()
    mids = (values[1:] + values[:-1]) / 2
    return torch.cat([values, mids, mids.nextafter(mids + 1), mids.nextafter(mids - 1),
                      torch.tensor([500.0, 1e30, -1e30, float("inf"), -0.0, 2.0 ** -12])])


def test_rounding_to_a_format_is_torchs_e4m3_cast_bit_for_bit():
    """`round_to` (which also makes the e2m1 values) rounds to nearest, ties to even,
    subnormals, −0 and saturation (inf included, as torch 2.13 casts) as torch does."""
    x = _e4m3_grid()
    mine = blocks.round_to(x.to(F64), E4M3).to(torch.float8_e4m3fn)
    assert torch.equal(mine.view(torch.uint8), x.to(torch.float8_e4m3fn).view(torch.uint8))


def test_e8m0_scales_are_torchs_float8_e8m0fnu_codes():
    """MXFP8's scale 2^(floor(log2 amax) − 8), clamped to 2^±127: its code read by torch is
    the scale, and torch's own cast of the scale gives the code back."""
    amax = torch.cat([torch.exp2(torch.arange(-140.0, 140.0, dtype=F64)) * 1.5,
                      torch.tensor([0.0, 448.0, 511.99, 512.0, 2.0 ** -1074], dtype=F64)])
    x = torch.zeros(amax.numel(), 32, dtype=F64)
    x[:, 3] = -amax
    _, codes, scale = blocks.mx_encode(x)
    codes, scale = codes.reshape(-1), scale.reshape(-1)  # one block a row
    assert torch.equal(codes.view(torch.float8_e8m0fnu).to(F64), scale)
    assert torch.equal(scale.to(torch.float8_e8m0fnu).view(torch.uint8), codes)
    exponent = torch.frexp(amax)[1] - 1 - 8
    expected = torch.where(amax > 0, exponent.clamp(-127, 127), -127) + 127
    assert torch.equal(codes.long(), expected)


def test_e2m1_codes_are_the_specs_sixteen_values_packed_as_torchs_float4():
    """e2m1's 16 codes decode to OCP MX v1.0's table, encode back, and pack two a byte
    into torch.float4_e2m1fn_x2 (torch 2.13 stores it on a CPU, converts nothing)."""
    codes = torch.arange(16, dtype=torch.uint8)
    values = blocks.e2m1_values(codes)
    table = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert values.tolist() == table + [-v for v in table]
    assert torch.equal(blocks.e2m1_codes(values), codes)
    packed = blocks.pack_e2m1(codes)
    assert packed.dtype == torch.float4_e2m1fn_x2 and packed.view(torch.uint8)[1] == 0x32


def test_a_block_of_zeros_nan_or_inf_and_the_largest_values():
    x = torch.zeros(4, 32, dtype=F64)
    x[1, 0], x[2, 5], x[3, 9] = float("nan"), float("inf"), 2.0 ** 1000
    x[3, 10] = 2.0 ** 990
    for recipe in blocks.BLOCKS:
        q = blocks.block_quantize(x, recipe, x[[0, 3]].abs().max())
        assert torch.equal(q[0], x[0]), recipe  # zeros cast to zeros exactly
        block = blocks.BLOCKS[recipe]  # the block holding a NaN or inf: all NaN, never hidden
        assert q[1, :block].isnan().all() and q[2, :block].isnan().all(), recipe
        assert q[3].isfinite().all(), recipe
    # e8m0's largest scale is 2^127: a block at 2^1000 saturates to 448·2^127; NVFP4's
    # float32-free tensor scale (in the run's dtype) reaches it, and 2^990 underflows its
    # block to the least e4m3 block scale, 2^-6·s_t, so to 0
    assert blocks.block_quantize(x[3:], "mxfp8")[0, 9] == 448 * 2.0 ** 127
    nvfp4 = blocks.block_quantize(x[3:], "nvfp4")
    assert nvfp4[0, 9] == 2.0 ** 1000 and nvfp4[0, 10] == 0


def test_a_reduction_dimension_not_whole_blocks_is_refused():
    with pytest.raises(ValueError, match="not a whole number of blocks"):
        blocks.block_quantize(torch.ones(2, 48, dtype=F64), "mxfp8")


def _values() -> torch.Tensor:
    """64 × 128 float32 values built from integers only (the same bits on every machine):
    a hashed 24-bit mantissa in (−1, 1), a row's power of two from 2^-20 to 2^19, a block
    of zeros, a block whose largest value reaches 448·2^8, a block holding NaN."""
    k = torch.arange(64 * 128, dtype=torch.int64)
    mantissa = ((k * 2654435761) % (1 << 24) - (1 << 23)).float() / (1 << 23)
    x = (mantissa * torch.exp2(((k // 128) % 40 - 20).float())).reshape(64, 128)
    x[0, :32], x[1, 5], x[3, 7] = 0.0, 448 * 2.0 ** 8, float("nan")
    return x


def _digest(*tensors) -> str:
    return hashlib.sha256(b"".join(t.contiguous().view(torch.uint8).numpy().tobytes()
                                   for t in tensors)).hexdigest()[:16]


def _nan_blocks_blanked(scales, codes):
    """MXFP8 codes with those of a block whose scale is NaN (e8m0 0xFF) set to 0: such a
    block reads NaN whatever its codes (the MX spec's NaN scale), and torchao leaves x/inf there
    where minitp writes NaN codes."""
    codes = codes.view(torch.uint8).reshape(*scales.shape, -1).clone()
    codes[scales.view(torch.uint8) == 255] = 0
    return scales.view(torch.uint8), codes.reshape(scales.shape[0], -1)


def _minitp_codes(x):
    """MXFP8 (scales, codes) of x, and NVFP4's of its finite rows 4…, in torchao's layout."""
    mx_codes, mx_scales, _ = blocks.mx_encode(x.to(F64))
    y = x[4:].to(F64)
    nv_codes, nv_scales, _ = blocks.nvfp4_encode(y, y.abs().max())
    return (*_nan_blocks_blanked(mx_scales, mx_codes), nv_scales,
            blocks.pack_e2m1(nv_codes).view(torch.uint8))


# torchao 0.18.0's to_mx(x, float8_e4m3fn, 32) and nvfp4_quantize(x[4:], 16,
# per_tensor_amax_to_scale(amax)) of `_values()`, hashed (the live test below recomputes it)
TORCHAO_DIGEST = "22853042f26f61bf"


def test_the_casts_are_torchaos_recorded_codes():
    assert _digest(*_minitp_codes(_values())) == TORCHAO_DIGEST


def test_the_casts_are_torchaos_reference_casts_bit_for_bit():
    """torchao's ``to_mx`` and ``nvfp4_quantize`` (float32 in) against minitp's casts of the
    same values in float64: every element code and block-scale code (where torchao is
    installed: it is not one of minitp's dependencies)."""
    pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    from torchao.prototype.mx_formats.mx_tensor import to_mx
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

    x = _values()
    mx_scales, mx_codes = to_mx(x, torch.float8_e4m3fn, 32)
    y = x[4:]
    nv_scales, nv_codes = nvfp4_quantize(y, 16, per_tensor_amax_to_scale(y.abs().max()))
    theirs = (*_nan_blocks_blanked(mx_scales, mx_codes), nv_scales, nv_codes)
    for mine, reference in zip(_minitp_codes(x), theirs, strict=True):
        assert torch.equal(mine.view(torch.uint8), reference.view(torch.uint8).reshape(
            mine.shape))
    assert _digest(*theirs) == TORCHAO_DIGEST
