"""A Muon run's dense checkpoint (`minitp.optim.state`: its momentum and AdamW's moments laid
out per parameter, as Adam's) saved at dp 2 under ZeRO-1 with the owner strategy resumes at
tp 2 with the tp strategy, and in one process, exactly: float64, every parameter after the
third step within 1e-10 of one device's Muon+AdamW trained straight through; and is refused
by Adam."""

import pytest
import torch
from helpers import random_batches

import minitp as mt
from minitp.optim import muon_with_adamw

CFG = mt.GPTConfig(vocab_size=10, seq_len=8, n_layer=2, n_head=2, d_model=8)
OPTIONS = dict(lr=0.02, weight_decay=0.1, adamw_lr=1e-2, adamw_weight_decay=0.01)


def _plain():
    torch.manual_seed(0)
    return mt.GPT(CFG).double()


def _save_then_resume(directory):
    batches = random_batches(3, CFG, 4)
    mesh = mt.Mesh(dp=2)
    model = mt.parallelize(_plain(), mesh, zero_stage=1)
    opt = mt.make_optimizer(model, mesh, "muon", strategy="owner", **OPTIONS)
    for batch in batches[:2]:
        mt.train_step(model, batch, mesh, opt)
    mt.checkpoint.save(model, directory, 2, opt)
    tp = mt.Mesh(tp=2)
    model, opt, _ = mt.checkpoint.load(directory, tp, muon=dict(strategy="tp", **OPTIONS))
    mt.train_step(model, batches[2], tp, opt)
    return {k: v.detach().cpu() for k, v in model.full_state_dict().items()}


def _step(ref, opt, batch):
    opt.zero_grad()
    ref(*batch)[1].backward()
    opt.step()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(the checkpoint, rank 0's parameters after resuming it at tp 2 for one step)."""
    directory = str(tmp_path_factory.mktemp("muon") / "ckpt")
    return directory, mt.launch(_save_then_resume, 2, directory)[0]


def test_saved_at_dp_2_zero_1_resumes_at_tp_2_and_in_one_process(saved):
    directory, resumed = saved
    batches = random_batches(3, CFG, 4)
    straight = _plain()
    opt = muon_with_adamw(straight, **OPTIONS)
    for batch in batches:
        _step(straight, opt, batch)
    one, _, dense = mt.checkpoint.load_dense(directory)
    one_opt = muon_with_adamw(one, **OPTIONS)
    mt.checkpoint.load_dense_optimizer(one, one_opt, dense)
    _step(one, one_opt, batches[2])
    for name, want in straight.state_dict().items():
        for where, got in (("tp 2", resumed[name]), ("one process", one.state_dict()[name])):
            assert (got - want).abs().max() < 1e-10, f"{where}: {name}"


def test_muons_state_is_not_loaded_into_adam(saved):
    """Each kind holds zeros where the other optimizer steps an element: refused, never a
    silent restart of the moments."""
    one, _, dense = mt.checkpoint.load_dense(saved[0])
    with pytest.raises(ValueError, match="its optimizer state is Muon's, not Adam's"):
        mt.checkpoint.load_dense_optimizer(one, torch.optim.Adam(one.parameters()), dense)
