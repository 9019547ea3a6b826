"""What FP8 leaves in the run's dtype: everything but the blocks' linear GEMMs (one process)."""

import copy

import torch
import torch.nn as nn

import minitp as mt

CFG = mt.GPTConfig(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=16)


def _models():
    torch.manual_seed(0)
    plain = mt.GPT(CFG).double()
    return plain, mt.fp8.convert(copy.deepcopy(plain), "tensorwise")


def test_only_the_blocks_linear_layers_are_fp8():
    _, fp8 = _models()
    names = {f"blocks.{i}.{n}" for i in range(2) for n in ("attn.qkv", "attn.proj", "mlp.fc",
                                                           "mlp.proj")}
    assert set(mt.fp8.fp8_layers(fp8)) == names


def test_without_its_casts_the_fp8_model_is_the_plain_one():
    """Nothing else changed: embeddings, norms, softmax, head and loss are the plain model's."""
    plain, fp8 = _models()
    for module in mt.fp8.fp8_layers(fp8):
        fp8.get_submodule(module).__class__ = nn.Linear
    x = torch.randint(0, 16, (3, 8))
    assert torch.equal(fp8(x, x)[0], plain(x, x)[0])


def test_the_output_layer_reads_the_final_norm_in_float64():
    _, fp8 = _models()
    seen = {}
    fp8.ln_f.register_forward_hook(lambda m, i, out: seen.update(h=out))
    logits, _ = fp8(torch.randint(0, 16, (3, 8)))
    assert torch.equal(logits, seen["h"] @ fp8.wte.weight.T)  # no cast on the way


def test_master_weights_and_optimizer_state_stay_float64():
    _, fp8 = _models()
    optimizer = torch.optim.AdamW(fp8.parameters(), lr=1e-2)
    x = torch.randint(0, 16, (4, 8))
    mt.fp8.reference_step(fp8, (x, x), optimizer)
    assert {p.dtype for p in fp8.parameters()} == {torch.float64}
    moments = [t for s in optimizer.state.values() for k, t in s.items() if k != "step"]
    assert moments and {t.dtype for t in moments} == {torch.float64}
