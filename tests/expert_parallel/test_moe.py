"""The mixture-of-experts layer on one device (`minitp.model.moe`, `minitp.model.routing`): the
reference expert parallelism must equal, checked against the loop a textbook writes, and
each routing rule against a worked example."""

import math

import pytest
import torch
import torch.nn.functional as F

import minitp as mt
from minitp.model.moe import MoE, update_expert_bias
from minitp.model.routing import aux_loss_per_sequence, bias_step, capacity, capacity_keep

SMALL = dict(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=8, n_experts=4)


def _layer(**overrides) -> MoE:
    torch.manual_seed(0)
    model = mt.GPT(mt.GPTConfig(**{**SMALL, **overrides})).double()
    return model.blocks[0].mlp


def _loop_reference(layer: MoE, tokens):
    """Token by token, choice by choice: Σ_j gate_j · expert_{e_j}(x)."""
    experts, gates, _ = layer.router(tokens)
    w = layer.experts
    out = torch.zeros_like(tokens)
    for n in range(tokens.shape[0]):
        for j in range(experts.shape[1]):
            e = experts[n, j]
            h = F.gelu(tokens[n] @ w.fc_weight[e] + w.fc_bias[e])
            out[n] += gates[n, j] * (h @ w.proj_weight[e] + w.proj_bias[e])
    return out


@pytest.mark.parametrize("router,top_k", [("softmax", 1), ("softmax", 2), ("sigmoid", 2)])
def test_the_layer_equals_the_loop_over_tokens(router, top_k):
    layer = _layer(router=router, top_k=top_k, balance="none")
    tokens = torch.randn(2 * 8, 8, dtype=torch.float64)
    out = layer(tokens.view(2, 8, 8)).view(-1, 8)
    torch.testing.assert_close(out, _loop_reference(layer, tokens), rtol=0, atol=1e-14)


def test_the_experts_backward_equals_plain_autograds():
    """`minitp.model.expert_mlps` writes its own backward: every gradient (the rows', each
    expert's weights and biases) equals the one autograd derives from the plain loop."""
    torch.manual_seed(0)
    layer = _layer().experts
    x = torch.randn(11, 8, dtype=torch.float64, requires_grad=True)
    counts = [3, 0, 6, 2]  # an expert with no rows too
    grad_out = torch.randn(11, 8, dtype=torch.float64)
    layer(x, counts).backward(grad_out)
    mine = [x.grad] + [p.grad for p in layer.parameters()]
    x.grad = None
    layer.zero_grad()
    outs = [F.gelu(rows @ layer.fc_weight[e] + layer.fc_bias[e]) @ layer.proj_weight[e]
            + layer.proj_bias[e] for e, rows in enumerate(x.split(counts))]
    torch.cat(outs).backward(grad_out)
    plain = [x.grad] + [p.grad for p in layer.parameters()]
    for a, b in zip(mine, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15)


def test_gates_are_renormalised_over_the_chosen_experts_except_softmax_top1():
    tokens = torch.randn(5, 8, dtype=torch.float64)
    _, gates, scores = _layer(top_k=2).router(tokens)
    torch.testing.assert_close(gates.sum(-1), torch.ones(5, dtype=torch.float64))
    experts, gates, scores = _layer(top_k=1).router(tokens)
    torch.testing.assert_close(gates[:, 0], scores.gather(1, experts)[:, 0])  # Switch: raw p


def test_the_expert_bias_steers_the_choice_but_not_the_gate():
    layer = _layer(top_k=1)
    tokens = torch.randn(6, 8, dtype=torch.float64)
    layer.router.expert_bias[:] = torch.tensor([0.0, 0.0, 10.0, 0.0])
    experts, gates, scores = layer.router(tokens)
    assert (experts == 2).all()
    torch.testing.assert_close(gates[:, 0], scores[:, 2])


def test_the_capacity_queue_is_slot_major_then_position():
    # one sequence of 4 tokens, k = 2, 3 experts, capacity 2 per expert
    choices = torch.tensor([[[0, 1], [0, 2], [0, 1], [1, 0]]])
    keep = capacity_keep(choices, 3, 2)
    # queue: first choices 0,0,0,1 then second choices 1,2,1,0.
    # expert 0 keeps tokens 0 and 1's first choices; token 2's first choice and token 3's
    # second choice are dropped; expert 1 keeps token 3's first and token 0's second
    # choice, and drops token 2's second choice; expert 2 keeps token 1's second.
    assert keep.tolist() == [[[True, True], [True, True], [False, False], [True, False]]]
    assert capacity(1.0, seq_len=4, top_k=2, n_experts=3) == math.ceil(8 / 3)


def test_dropped_assignments_contribute_nothing_and_are_counted():
    layer = _layer(top_k=2, capacity_factor=0.25, balance="none")
    tokens = torch.randn(1, 8, 8, dtype=torch.float64)
    out = layer(tokens)
    experts, gates, _ = layer.router(tokens.view(-1, 8))
    keep = capacity_keep(experts.view(1, 8, 2), 4, capacity(0.25, 8, 2, 4)).view(-1, 2)
    assert layer.dropped == int((~keep).sum()) > 0
    w = layer.experts
    want = torch.zeros(8, 8, dtype=torch.float64)
    for n in range(8):
        for j in range(2):
            if keep[n, j]:
                e = experts[n, j]
                h = F.gelu(tokens[0, n] @ w.fc_weight[e] + w.fc_bias[e])
                want[n] += gates[n, j] * (h @ w.proj_weight[e] + w.proj_bias[e])
    torch.testing.assert_close(out[0], want, rtol=0, atol=1e-14)


def test_the_aux_loss_is_one_when_balanced_and_e_when_collapsed():
    E, T, k = 4, 8, 1
    balanced = torch.full((1, E), T * k / E)
    collapsed = torch.tensor([[T * k, 0.0, 0.0, 0.0]])
    uniform = torch.full((1, E), T / E)
    assert aux_loss_per_sequence(balanced, uniform, T, k).item() == pytest.approx(1.0)
    all_on_0 = torch.tensor([[float(T), 0.0, 0.0, 0.0]])
    assert aux_loss_per_sequence(collapsed, all_on_0, T, k).item() == pytest.approx(E)


def test_the_aux_loss_gradient_is_that_of_coef_times_the_mean_over_sequences():
    """The aux loss enters backward through `attach_aux_loss`; its gradient must be
    exactly that of adding coef · mean_b aux_b to the loss."""
    layer = _layer(balance="aux", aux_loss_coef=0.5)
    x = torch.randn(3, 8, 8, dtype=torch.float64)
    layer(x).sum().backward()
    with_aux = layer.router.gate.weight.grad.clone()
    layer.zero_grad()
    layer.balance = "none"
    out = layer(x)
    experts, _, scores = layer.router(x.view(-1, 8))
    counts = torch.zeros(3, 4, dtype=torch.float64).scatter_add_(
        1, experts.view(3, -1), torch.ones(3, 16, dtype=torch.float64))
    aux = aux_loss_per_sequence(counts, scores.view(3, 8, 4).sum(1), 8, 2)
    (out.sum() + 0.5 * aux.mean()).backward()
    torch.testing.assert_close(with_aux, layer.router.gate.weight.grad, rtol=0, atol=1e-14)


def test_the_bias_moves_towards_the_mean_load():
    bias = torch.zeros(4)
    bias_step(bias, torch.tensor([10.0, 2.0, 4.0, 4.0]), rate=0.1)  # mean 5
    assert bias.tolist() == pytest.approx([-0.1, 0.1, 0.1, 0.1])
    torch.manual_seed(0)
    model = mt.GPT(mt.GPTConfig(**SMALL, balance="bias", bias_update_rate=0.01)).double()
    model(torch.randint(0, 16, (2, 8)))
    loads = [b.mlp.load.clone() for b in model.blocks]
    update_expert_bias(model)
    for block, load in zip(model.blocks, loads, strict=True):
        want = 0.01 * torch.sign(load.mean() - load)
        assert block.mlp.router.expert_bias.dtype == torch.float32  # whatever the model's dtype
        torch.testing.assert_close(block.mlp.router.expert_bias, want.float())
        assert block.mlp.load.sum() == 0
    # counts stay exact whatever the model's dtype (a bf16 count above 256 would round)
    assert model.to(torch.bfloat16).blocks[0].mlp.load.dtype == torch.float64


def test_moe_every_and_the_shared_expert_build_the_layers_asked_for():
    cfg = mt.GPTConfig(**{**SMALL, "n_layer": 4, "moe_every": 2, "shared_expert": True})
    kinds = [type(b.mlp).__name__ for b in mt.GPT(cfg).blocks]
    assert kinds == ["MLP", "MoE", "MLP", "MoE"]
    assert mt.GPT(cfg).blocks[1].mlp.shared is not None


@pytest.mark.parametrize("overrides,message", [
    (dict(top_k=5), "top_k=5 is more than n_experts=4"),
    (dict(capacity_factor=0.0), "capacity_factor must be > 0"),
    (dict(router="relu"), "router must be one of"),
    (dict(balance="loss"), "balance must be one of"),
    (dict(dropout=0.1), "have no dropout"),
    (dict(moe_every=0), "moe_every"),
    (dict(ffn_hidden=96), "ffn_hidden=96 with n_experts=4: the experts"),  # they are 4h wide
])
def test_bad_moe_configs_are_refused_in_one_line(overrides, message):
    with pytest.raises(ValueError, match=message):
        mt.GPTConfig(**{**SMALL, **overrides})


@pytest.mark.parametrize("sizes,message", [
    (dict(dp=4, ep=3), "n_experts=4 is not divisible by ep=3"),
    (dict(dp=2, ep=4), "ep=4 does not divide dp\\*cp=2"),
])
def test_bad_expert_parallel_meshes_are_refused_before_any_process_starts(sizes, message):
    with pytest.raises(ValueError, match=message):
        mt.check_parallel_config(mt.GPTConfig(**SMALL), **sizes)
    with pytest.raises(ValueError, match="needs a mixture of experts"):
        mt.check_parallel_config(mt.GPTConfig(**{**SMALL, "n_experts": 0}), dp=2, ep=2)
