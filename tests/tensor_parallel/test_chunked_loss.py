"""The vocabulary-parallel loss, chunk by chunk over tokens, equals F.cross_entropy on the
gathered logits: value and every rank's gradient in float64, on tp 2 and 4, with a padded
vocabulary, ignored targets and chunks that do not divide the tokens; and in bf16 within
float32's rounding of the float32 loss."""

import pytest
import torch
import torch.nn.functional as F

import minitp as mt
from minitp.rules import IGNORE_INDEX, ceil_div
from minitp.tensor_parallel.loss import vocab_parallel_cross_entropy

N, V = 19, 30  # 30 = 2·15 = 4·7.5: padded to 32 on tp 4; 19 tokens, chunks of 4


def _errors(dtype_name):
    axis = mt.world()
    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(0)  # the same logits and targets on every rank
    dense = 3 * torch.randn(N, V, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (N,), generator=g)
    targets[:2] = IGNORE_INDEX
    width = ceil_div(V, axis.size)
    padded = torch.cat([dense, torch.zeros(N, width * axis.size - V, dtype=torch.float64)], 1)
    local = padded[:, axis.rank * width:(axis.rank + 1) * width].to(dtype).requires_grad_()
    loss = vocab_parallel_cross_entropy(local, targets, axis, vocab_size=V, chunk_rows=4)
    loss.backward()

    wide = padded[:, :V].to(dtype).double().requires_grad_()  # the same (rounded) values
    ref = F.cross_entropy(wide if dtype == torch.float64 else wide.float(), targets)
    ref.backward()
    ref_grad = torch.cat([wide.grad, torch.zeros(N, width * axis.size - V, dtype=torch.float64)],
                         1)[:, axis.rank * width:(axis.rank + 1) * width]
    expected = ref_grad.to(dtype).double()  # the reference gradient in the run's dtype
    off = (local.grad.double() - expected).abs() / expected.abs().clamp(min=1e-300)
    return {"loss": (loss.double() - ref.double()).abs().item() / ref.abs().item(),
            "grad": off.max().item()}  # relative, per element


@pytest.mark.parametrize("tp", [2, 4])
def test_chunked_vocab_parallel_loss_equals_the_reference_in_float64(tp):
    for rank, errors in enumerate(mt.launch(_errors, tp, "float64", timeout=60)):
        assert errors["loss"] < 1e-14 and errors["grad"] < 1e-12, (rank, errors)


def test_bf16_chunked_vocab_parallel_loss_is_within_float32_rounding():
    for rank, errors in enumerate(mt.launch(_errors, 2, "bfloat16", timeout=60)):
        # the loss: float32's rounding; the gradient: the float32 one rounded to bf16, give
        # or take one bf16 step (2^-7 relative) where two float32 sums round apart
        assert errors["loss"] < 1e-6 and errors["grad"] <= 2**-7, (rank, errors)
