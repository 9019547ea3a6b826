"""Latent attention under tensor parallelism (`GPTConfig.mla`, `minitp.tensor_parallel.plan`)
equals one device in float64: the loss of every step and every parameter after 2 steps,
at dp 2 × tp 2 (AdamW) and tp 4 with sequence parallelism (SGD). The down-projections,
their norms and the shared rotary key's W^KR are replicated, the up-projections split by
heads, W^O row-parallel; the replicas' gradients are partial on each rank and summed.

The trap, on purpose (torchtitan PR #1373's review): W^KR's gradient left un-summed. After
one step W^KR alone departs from one device (every other parameter still equal), and its
copies on the tp ranks differ from each other. Each rank holds the parameters
`mt.calc.params_per_rank` counts. All in ONE launch of 4 ranks."""

import torch
from helpers import random_batches, train_side_by_side

import minitp as mt

TOLERANCE = 1e-10
CFG = dict(vocab_size=32, seq_len=8, n_layer=2, n_head=4, d_model=16, q_lora_rank=8,
           kv_lora_rank=8, rope_dim=4)
SETTINGS = [  # (mesh sizes, sequence_parallel, optimizer)
    (dict(dp=2, tp=2), False, torch.optim.AdamW),
    (dict(tp=4), True, torch.optim.SGD),
]


def _train(sizes, sequence_parallel, optimizer_class, steps, spoil=False):
    mesh = mt.Mesh(**sizes)
    cfg = mt.GPTConfig.mla(**CFG)
    torch.manual_seed(0)
    ref = mt.GPT(cfg).double()
    model = mt.parallelize(ref, mesh, sequence_parallel=sequence_parallel)
    if spoil:  # the bug: W^KR treated as if its gradient were whole on each rank
        for name, p in model.named_parameters():
            if ".k_rope." in name:
                p.grad_partial_over_tp = False
    batches = random_batches(steps, cfg, 4)
    loss_error, worst, _ = train_side_by_side(ref, model, mesh, batches,
                                              optimizer_class=optimizer_class)
    k_rope = next(p for n, p in model.named_parameters() if n.endswith("k_rope.weight"))
    held = sum(p.numel() for p in model.parameters())  # the calculator's count, measured
    assert held == mt.calc.params_per_rank(cfg, tp=mesh.tp.size), (held, sizes)
    return loss_error, worst, k_rope.detach().clone()


def _worker():
    results = [_train(sizes, sp, opt, steps=2)[:2] for sizes, sp, opt in SETTINGS]
    trap = _train(dict(tp=4), False, torch.optim.SGD, steps=1, spoil=True)
    return results, trap


def test_latent_attention_over_tp_equals_one_device_and_the_unsummed_rotary_key_departs():
    run = mt.launch(_worker, 4, timeout=120)
    for rank, (results, _) in enumerate(run):
        for (sizes, sp, opt), (loss_error, (param_error, name)) in zip(SETTINGS, results,
                                                                       strict=True):
            where = f"rank {rank}, {sizes}, sequence_parallel={sp}, {opt.__name__}"
            assert loss_error < TOLERANCE, f"{where}: loss differs by {loss_error:.3g}"
            assert param_error < TOLERANCE, f"{where}: {name} differs by {param_error:.3g}"
    for rank, (_, (_, (param_error, name), _)) in enumerate(run):
        # one step: only W^KR got a wrong gradient, so it is the one that departs, by SGD's
        # lr·(the other ranks' terms): small at init (std 0.02), yet 1000× the tolerance
        assert param_error > 1000 * TOLERANCE and ".k_rope." in name, (rank, name, param_error)
    copies = [trap[2] for _, trap in run]
    assert all((copies[0] - c).abs().max() > 1000 * TOLERANCE for c in copies[1:]), "no drift"


def test_refusals_come_in_one_line():
    cfg = mt.GPTConfig.mla(**{**CFG, "n_head": 4})
    for sizes, words in ((dict(tp=3), "not divisible by tp=3"),
                         (dict(cp=2), "context parallelism does not split it")):
        try:
            mt.check_parallel_config(cfg, **sizes)
        except ValueError as error:
            assert words in str(error) and "\n" not in str(error), str(error)
        else:
            raise AssertionError(f"{sizes} was not refused")
