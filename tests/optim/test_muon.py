"""`mt.optim.Muon` is torch.optim.Muon (PyTorch 2.13) step for step: with Newton–Schulz in
bfloat16, as torch runs it, the weights are equal bit for bit; and Muon + AdamW over a GPT
equals torch's Muon over the same matrices with torch's AdamW over the rest."""

import pytest
import torch

import minitp as mt
from minitp.optim import Muon, muon_with_adamw, split_parameters
from minitp.optim.distributed import check_muon


def _pair(shape, generator):
    w = torch.randn(*shape, generator=generator, dtype=torch.float64)
    return torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())


@pytest.mark.parametrize("options", [dict(lr=0.02), dict(lr=0.05, nesterov=False, momentum=0.9),
                                     dict(lr=0.02, weight_decay=0.3,
                                          adjust_lr_fn="match_rms_adamw")])
def test_muon_equals_torch_muon_bit_for_bit(options):
    generator = torch.Generator().manual_seed(0)
    pairs = [_pair(shape, generator) for shape in [(8, 8), (24, 8), (8, 32)]]
    theirs = torch.optim.Muon([a for a, _ in pairs], **options)
    ours = Muon([b for _, b in pairs], ns_dtype=torch.bfloat16, **options)
    for _ in range(3):
        for a, b in pairs:
            a.grad = torch.randn(a.shape, generator=generator, dtype=torch.float64)
            b.grad = a.grad.clone()
        theirs.step()
        ours.step()
    assert all(torch.equal(a, b) for a, b in pairs)


def _gpt():
    torch.manual_seed(0)
    return mt.GPT(mt.GPTConfig(vocab_size=10, seq_len=8, n_layer=2, n_head=2, d_model=8)).double()


def test_muon_with_adamw_equals_torchs_muon_and_adamw_on_a_gpt():
    ref, model = _gpt(), _gpt()
    matrices, rest = split_parameters(ref)
    theirs = [torch.optim.Muon(matrices, lr=0.02), torch.optim.AdamW(rest, lr=1e-2)]
    ours = muon_with_adamw(model, lr=0.02, adamw_lr=1e-2, ns_dtype=torch.bfloat16)
    x = torch.randint(0, 10, (2, 8), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        for net, optimizers in ((ref, theirs), (model, ours.optimizers)):
            for o in optimizers:
                o.zero_grad()
            net(x, x)[1].backward()
            for o in optimizers:
                o.step()
    for (name, a), b in zip(ref.named_parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_muon_takes_the_linear_weights_and_adamw_the_rest():
    model = _gpt()
    names = {id(p): n for n, p in model.named_parameters()}
    matrices, rest = split_parameters(model)
    assert sorted(names[id(p)].split(".", 2)[-1] for p in matrices) == sorted(
        ["attn.qkv.weight", "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight"] * 2)
    assert {"wte.weight", "wpe.weight", "ln_f.weight"} <= {names[id(p)] for p in rest}


def test_what_muon_cannot_do_is_refused_in_one_line():
    class Axis:
        size = 1

    class Mesh:
        tp = Axis()

    with pytest.raises(ValueError, match="one of"):
        check_muon(_gpt(), Mesh(), "zero")
    with pytest.raises(ValueError, match="tp > 1"):
        check_muon(_gpt(), Mesh(), "tp")
    with pytest.raises(TypeError, match="unknown option"):
        Muon([torch.nn.Parameter(torch.ones(2, 2))], betas=(0.9, 0.95))


def test_the_per_head_split_orthogonalises_each_heads_rows_alone():
    """qkv_split="heads" (DeepSpeed's Muon blog, GLM's "Muon Split"): qkv's rows run head by
    head, and each head's block is orthogonalised alone. Not whole-matrix Muon's update; fewer
    FLOPs; and under tp each rank holds whole heads, so nothing travels over tp for it
    (tests/optim/test_distributed.py measures that)."""
    from minitp.calc.footprint.muon import ns_flops
    from minitp.optim.newton_schulz import newton_schulz, newton_schulz_blocks

    g = torch.randn(24, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    heads = newton_schulz_blocks(g, 4)  # head_dim 4: six blocks (2 heads × q, k, v)
    assert torch.equal(heads[4:8], newton_schulz(g[4:8]))
    assert (heads - newton_schulz(g)).abs().max() > 1e-2
    assert 6 * ns_flops(4, 8) < ns_flops(24, 8)
    with pytest.raises(ValueError, match="qkv_split"):
        muon_with_adamw(_gpt(), qkv_split="rows")
