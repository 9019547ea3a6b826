"""`parallelize` on a mesh of one rank runs the plain model's kernels: the profile of one
forward and backward counts the same aten ops as the plain GPT's, give or take the
embedding's own check of the token ids (a handful of ops on the ids, none on activations).

Issue 37's H200 profile found the wrapper at world 1 masking and dividing the full logits
and adding the row-parallel biases apart from their GEMMs (mm instead of addmm)."""

import collections

import torch
from torch.profiler import ProfilerActivity, profile

import minitp as mt

# One more `check_token_ids` (VocabParallelEmbedding checks its ids, as a layer used alone
# must; GPT.forward has checked them already): comparisons, an any(), and reading it.
ID_CHECK = {"aten::ge", "aten::lt", "aten::__or__", "aten::bitwise_or", "aten::any",
            "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense"}
VIEW_AND_FILL = {"aten::as_strided", "aten::fill_"}  # a view and a zero-fill of a few elements
A_FEW = 10


def _aten_ops(model, x, y) -> collections.Counter:
    model(x, y)[1].backward()  # first call: lazily built state
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(x, y)[1].backward()
    return collections.Counter({e.key: e.count for e in prof.key_averages()
                                if e.key.startswith("aten::")})


def _plain_and_wrapped_ops():
    cfg = mt.GPTConfig(vocab_size=256, seq_len=32, n_layer=2, n_head=2, d_model=32)
    torch.manual_seed(0)
    plain = mt.GPT(cfg).to(mt.device())
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), device=mt.device())
    y = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), device=mt.device())
    wrapped = mt.parallelize(plain, mt.Mesh(tp=1))
    return _aten_ops(plain, x, y), _aten_ops(wrapped, x, y)


def test_parallelize_at_world_one_runs_the_plain_models_ops():
    plain, wrapped = mt.launch(_plain_and_wrapped_ops, 1, timeout=120)[0]
    extra = wrapped - plain  # what the wrapper adds (Counter subtraction keeps the excess)
    assert set(extra) <= ID_CHECK | VIEW_AND_FILL, extra
    assert sum(extra.values()) <= A_FEW, extra
    for op in ("aten::addmm", "aten::mm", "aten::bmm", "aten::div", "aten::mul", "aten::exp",
               "aten::masked_fill", "aten::masked_fill_", "aten::where"):
        assert wrapped[op] == plain[op], (op, plain[op], wrapped[op])
    assert plain["aten::addmm"] > 0  # the biases fused into their GEMMs, in both
