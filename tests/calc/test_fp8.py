"""`calc.fp8_*`, FP8's bytes beside bf16's (a MODEL): a tensor's bytes against real
torch.float8 tensors and their float32 scales, the all-gather's against the ring's
arithmetic done by hand, the kept linear inputs against the values counted layer by layer.
No processes: the lesson (21) measures an FP8 all-gather's bytes in the trace beside it."""

import pytest
import torch

import minitp as mt
import minitp.calc as calc


def _scales(t: torch.Tensor, scaling: str, block: int = 128) -> torch.Tensor:
    """The float32 scales a real cast of `t` would carry (448 / amax), one per group."""
    a = t.abs()
    if scaling == "rowwise":
        amax = a.amax(dim=1)
    elif scaling == "blockwise":
        rows, cols = t.shape
        padded = torch.nn.functional.pad(a, (0, -cols % block, 0, -rows % block))
        amax = padded.unfold(0, block, block).unfold(1, block, block).amax(dim=(-1, -2))
    else:
        amax = a.amax().reshape(1)
    return (448.0 / amax).float()


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise", "blockwise"])
@pytest.mark.parametrize("shape", [(256, 384), (200, 130)])
def test_a_tensors_bytes_are_a_real_float8_tensor_and_its_scales(scaling, shape):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(0), device=mt.device())
    scales = _scales(t, scaling)
    values = t.clamp(-448, 448).to(torch.float8_e4m3fn)  # one byte a value, whatever the scale
    model = calc.fp8_tensor_bytes(*shape, scaling)
    assert model["values"] == values.nbytes and model["scales"] == scales.nbytes
    assert model["bf16"] == t.to(torch.bfloat16).nbytes


def test_delayed_scaling_adds_its_amax_history():
    one = calc.fp8_tensor_bytes(64, 64, "tensorwise")
    delayed = calc.fp8_tensor_bytes(64, 64, "delayed", history=16)
    assert delayed["fp8"] - one["fp8"] == 16 * 4


def test_an_fp8_all_gather_sends_half_of_bf16_plus_the_scales_by_hand():
    # 8 x 16 over n = 4: each rank sends 3 of the 4 shards, 96 one-byte values
    tensorwise = calc.fp8_all_gather_bytes(8, 16, 4)
    assert (tensorwise["values"], tensorwise["scales"], tensorwise["bf16"]) == (96, 0, 192)
    assert tensorwise["amax"] == 6  # one float32 all-reduced: 2 * 3/4 * 4 bytes
    rowwise = calc.fp8_all_gather_bytes(8, 16, 4, "rowwise")
    assert (rowwise["scales"], rowwise["amax"]) == (24, 0)  # 6 rows' scales travel along
    big = calc.fp8_all_gather_bytes(4096, 4096, 8)
    assert 0.5 < big["ratio"] < 0.5 + 1e-6
    assert calc.fp8_all_gather_bytes(8, 16, 1)["fp8"] == 0  # one rank sends nothing


def test_block_formats_all_gather_bytes_by_hand():
    """8 x 64 over n = 4, each rank sending 3 of 4 shards (384 values): MXFP8 one byte a value
    and one e8m0 byte a block of 32; NVFP4 half a byte and one e4m3 byte a block of 16, and
    its tensor scale's float32 amax all-reduce (2 · 3/4 · 4 bytes)."""
    mx = calc.fp8_all_gather_bytes(8, 64, 4, "mxfp8")
    assert (mx["values"], mx["scales"], mx["amax"]) == (384, 12, 0)
    nv = calc.fp8_all_gather_bytes(8, 64, 4, "nvfp4")
    assert (nv["values"], nv["scales"], nv["amax"]) == (192, 24, 6)
    big = {s: calc.fp8_all_gather_bytes(4096, 4096, 8, s)["ratio"] for s in ("mxfp8", "nvfp4")}
    assert big["mxfp8"] == (8 + 8 / 32) / 16 and abs(big["nvfp4"] - (4 + 8 / 16) / 16) < 1e-6
    held = calc.fp8_tensor_bytes(8, 64, "nvfp4")  # a tensor held: its tensor scale too
    assert (held["values"], held["scales"]) == (256, 32 + 4)
    with pytest.raises(ValueError, match="not whole blocks of 32"):
        calc.fp8_all_gather_bytes(8, 48, 4, "mxfp8")


@pytest.mark.parametrize("sp", [False, True])
def test_the_kept_linear_inputs_are_the_values_counted_layer_by_layer(sp):
    cfg = mt.GPTConfig(vocab_size=64, seq_len=32, n_layer=1, n_head=4, d_model=64)
    b, t = 2, 4
    bsh = b * cfg.seq_len * cfg.d_model
    values = 7 * bsh // t if sp else 2 * bsh + 5 * bsh // t
    kept = calc.fp8_linear_inputs_bytes(cfg, b, tp=t, sp=sp)
    assert kept["bf16"] == 2 * values
    assert kept["fp8"] == values + 4 * 4  # four tensors, one scale each
    # rowwise keeps x in high precision: its backward casts it again along the other axis
    rowwise = calc.fp8_linear_inputs_bytes(cfg, b, tp=t, sp=sp, scaling="rowwise")
    assert rowwise["fp8"] == rowwise["bf16"] == 2 * values and rowwise["ratio"] == 1.0


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="scaling must be one of"):
        calc.fp8_tensor_bytes(4, 4, "columnwise")
    with pytest.raises(ValueError, match="do not split over n=3"):
        calc.fp8_all_gather_bytes(8, 4, 3)
