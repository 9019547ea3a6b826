"""The chunked cross-entropy (`minitp.model.cross_entropy`) equals F.cross_entropy, and never
makes a whole-size float32 tensor.

One device, no processes: the vocabulary-parallel form is checked on tp ranks in
tests/tensor_parallel/test_chunked_loss.py."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from minitp.model import CrossEntropy, chunked_cross_entropy
from minitp.rules import IGNORE_INDEX, loss_chunk_rows

N, V = 23, 40  # 23 tokens: no chunk size below divides them


def _data(dtype, ignored=3):
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(N, V, generator=g, dtype=torch.float64)).to(dtype)
    targets = torch.randint(0, V, (N,), generator=g)
    targets[:ignored] = IGNORE_INDEX
    return logits.requires_grad_(), targets


def _reference(logits, targets):
    wide = logits.detach().double().requires_grad_()
    loss = F.cross_entropy(wide, targets, ignore_index=IGNORE_INDEX)
    loss.backward()
    return loss.detach(), wide.grad


@pytest.mark.parametrize("rows", [1, 4, 7, None])
def test_equals_f_cross_entropy_in_float64(rows):
    logits, targets = _data(torch.float64)
    loss = chunked_cross_entropy(logits, targets, chunk_rows=rows)
    loss.backward()
    ref_loss, ref_grad = _reference(logits, targets)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-13)
    torch.testing.assert_close(logits.grad, ref_grad, rtol=0, atol=1e-15)


def test_every_target_ignored_is_nan_with_zero_gradient_as_f_cross_entropy():
    logits, targets = _data(torch.float64, ignored=N)
    loss = chunked_cross_entropy(logits, targets, chunk_rows=5)
    loss.backward()
    assert torch.isnan(loss) and torch.isnan(_reference(logits, targets)[0])
    assert torch.count_nonzero(logits.grad) == 0


def test_bf16_logits_stay_within_float32_rounding_of_the_float32_loss():
    logits, targets = _data(torch.bfloat16)
    loss = chunked_cross_entropy(logits, targets, chunk_rows=6)
    loss.backward()
    # the reference: F.cross_entropy on the same bf16 values widened to float32
    wide = logits.detach().float().requires_grad_()
    ref = F.cross_entropy(wide, targets, ignore_index=IGNORE_INDEX)
    ref.backward()
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref.detach(), rtol=2e-7, atol=0)  # float32's rounding
    assert logits.grad.dtype == torch.bfloat16  # the float32 gradient, rounded once
    torch.testing.assert_close(logits.grad, wide.grad.bfloat16(), rtol=0, atol=0)


class _Largest(TorchDispatchMode):
    """The most elements of any float32 tensor an op made while it was on."""

    def __init__(self):
        super().__init__()
        self.float32 = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.float32 = max(self.float32, t.numel())
        return out


def test_the_model_loss_never_makes_a_whole_size_float32_tensor():
    d_model = 8  # V = 40 logits a token against 8 hidden values: 5 chunks of 5 rows
    rows = loss_chunk_rows(N, V, d_model)
    assert rows == 5
    logits, targets = _data(torch.bfloat16)
    with _Largest() as seen:
        CrossEntropy(V, d_model)(logits, targets).backward()
    assert seen.float32 == rows * V  # one chunk at a time, forward and backward
    with _Largest() as whole:  # what the unchunked loss makes: the whole logits, widened
        F.cross_entropy(logits.detach().float().requires_grad_(), targets).backward()
    assert whole.float32 == N * V
