"""`calc.loss_bytes`, the loss's MODELLED bytes, against the peak the allocator measures
(`minitp.memory.peak_allocated`), unchunked (F.cross_entropy on float32) and chunked
(`minitp.model.CrossEntropy`), in float32 and bf16."""

import pytest
import torch
import torch.nn.functional as F

import minitp.calc as calc
from minitp.memory import peak_allocated
from minitp.model import CrossEntropy

N, V, D = 512, 2048, 64  # 32 chunks of 16 tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunked", [False, True])
def test_the_model_is_the_measured_peak(dtype, chunked):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(N, V, generator=g).to(dtype).requires_grad_()
    targets = torch.randint(0, V, (N,), generator=g)
    # the logits made inside the measured work (a clone), as the output layer makes them
    if chunked:
        def step():
            CrossEntropy(V, D)(logits.clone(), targets).backward()
    else:
        def step():
            F.cross_entropy(logits.clone().float(), targets).backward()
    _, peak = peak_allocated(step)
    model = calc.loss_bytes(N, V, D, logits_bytes=logits.element_size(), chunked=chunked)
    # the model leaves out the per-token vectors: a few bytes a token
    assert model["peak"] <= peak <= model["peak"] + 64 * N, (peak, model)


def test_chunked_keeps_the_bf16_logits_where_the_unchunked_loss_keeps_a_float32_softmax():
    assert calc.loss_bytes(N, V, D, chunked=False)["kept"] == 4 * N * V
    assert calc.loss_bytes(N, V, D)["kept"] == 2 * N * V + 4 * N
