"""Zero-bubble schedules (`minitp.pipeline.schedules.zb_h1`, `zb_h2`, and on two chunks per
rank placed in a V, `zbv` and `dualpipev`): the backward split into B and W
(`minitp.tensor_parallel.weight_grad`), exact, and the bubbles and memory on paper.

On real ranks, in float64, each schedule trains equal to the single-device GPT (every
step's loss, every parameter after 3 AdamW steps) on meshes that between them cover pp 2
and 4, tp with sequence parallelism, dp with ZeRO 0 to 3, full recomputation, mixture
of experts, and microbatches at and above the minimum each schedule needs. On paper
(`simulate`, unit costs F = B = W): 1F1B idles (p−1)(F+B+W), ZB-H1 (p−1)(F+B−W) with
1F1B's peak of p microbatches on every stage, ZB-H2 never idles between a stage's first
and last unit, holding 2p−1.
"""

import pytest
import torch
from helpers import assert_every_mesh_matches, train_meshes

import minitp as mt
from minitp.pipeline.executor import check_split_order
from minitp.pipeline.on_paper import overlapped_pairs, simulate
from minitp.pipeline.schedules import SCHEDULES
from minitp.tensor_parallel.weight_grad import DeferredWeightGrads, linear

TOLERANCE = 1e-10
CFG = dict(vocab_size=16, seq_len=8, n_layer=4, n_head=2, d_model=8)
UNIT = dict(F=1, B=1, W=1)
V = dict(virtual_stages=2, placement="v")

# (mesh sizes, parallelize options, schedule, microbatches, config overrides)
SETTINGS = [
    (dict(pp=4), {}, "zb-h1", 4, {}),
    (dict(pp=4), {}, "zb-h2", 7, {}),  # 2p - 1: the fewest ZB-H2 takes
    (dict(pp=2, tp=2), dict(sequence_parallel=True, recompute="full"), "zb-h1", 3, {}),
    (dict(pp=2, dp=2), dict(zero_stage=1), "zb-h2", 4, {}),
    (dict(pp=2, dp=2), dict(zero_stage=2), "zb-h1", 4, {}),  # stage 1: B1 before W0
    # ZeRO-3: W reduces its weights' slots after B reduced the rest; under full recompute
    # the weights W fills are views of the values gathered again inside B
    (dict(pp=2, dp=2), dict(zero_stage=3, recompute="full"), "zb-h2", 3, {}),
    (dict(pp=2, dp=2), {}, "zb-h1", 2, dict(n_experts=4)),
    # the V: rank r runs stages r and 2p-1-r, the tied embedding's two copies on rank 0
    (dict(pp=4), V, "zbv", 7, dict(n_layer=8)),  # 2p - 1: the fewest ZBV takes
    (dict(pp=4), V, "dualpipev", 8, dict(n_layer=8)),  # 2p: the fewest DualPipeV takes
    (dict(pp=2, tp=2), dict(**V, sequence_parallel=True, recompute="full"), "dualpipev", 5, {}),
    (dict(pp=2, dp=2), dict(**V, zero_stage=1), "zbv", 4, {}),
]


def _train(settings):
    return [result[:2] for result in train_meshes(settings, CFG)]


def test_every_zero_bubble_schedule_equals_one_device_in_float64():
    run = mt.launch(_train, 4, SETTINGS, timeout=300)
    assert_every_mesh_matches(run, SETTINGS, TOLERANCE)


def test_b_then_w_gives_the_whole_backwards_gradients():
    """One linear layer: B computes the input and bias gradients and stores (W, x, g);
    W adds gᵀx to the weight's gradient — together what autograd gives."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(5, 3).double()
    layer.weight_grads = None
    x = torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 4, 3, dtype=torch.float64)
    torch.nn.functional.linear(x, layer.weight, layer.bias).backward(g)
    whole = [x.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone()]
    x.grad, layer.weight.grad, layer.bias.grad = None, None, None
    layer.weight_grads = DeferredWeightGrads()
    out = linear(x, layer.weight, layer.bias, layer)  # the forward of a split microbatch
    out.backward(g)  # B
    assert layer.weight.grad is None and x.grad is not None  # the weight's part waits
    layer.weight_grads.run()  # W
    for a, b in zip(whole, [x.grad, layer.weight.grad, layer.bias.grad], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 12), (8, 16)])
def test_bubbles_and_peaks_on_paper_match_the_papers_formulas(p, m):
    one_f_one_b, h1, h2 = (simulate(s, p, m, costs=UNIT) for s in ("1f1b", "zb-h1", "zb-h2"))
    assert one_f_one_b["idle"][0] == (p - 1) * 3  # (p−1)(F+B+W)
    assert h1["idle"][0] == (p - 1) * 1  # (p−1)(F+B−W)
    assert h2["inner_idle"] == [0] * p  # no stage idles between its first and last unit
    assert one_f_one_b["peak"] == [p - r for r in range(p)]
    assert h1["peak"] == [p] * p  # 1F1B's peak (its first stage's) on every stage
    assert h2["peak"] == [2 * p - 1] * p


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 12), (8, 16)])
def test_the_v_schedules_on_paper(p, m):
    """ZBV: no rank idles between its first and last unit, and it holds what 1F1B holds
    (2p chunk activations of half a stage each: p stages' worth). DualPipeV holds 2p+1
    (DeepSeek's table: "PP+1" for PP = 2p stages). Both lose only the V's p−1 units of
    fill and drain with unit costs (its F&B pairs run one after the other here)."""
    zbv, dual = (simulate(s, p, m, 2, costs=UNIT) for s in ("zbv", "dualpipev"))
    assert zbv["inner_idle"] == [0] * p and zbv["peak"] == [2 * p] * p
    assert dual["peak"] == [2 * p + 1] * p
    assert zbv["ticks"] - zbv["busy"] == dual["ticks"] - dual["busy"] == p - 1
    assert dual["inner_idle"] == [p - 1 - r for r in range(p)]


# (F, B, W): B the input backward, at least F and W (DualPipe's setting: DeepSeek-V3
# §3.2.1 splits a backward chunk into input and weight parts)
PAIR_COSTS = [(1, 1, 1), (1, 2, 1), (2, 2, 1), (1, 3, 2)]


@pytest.mark.parametrize("p,m", [(2, 4), (3, 7), (4, 8), (5, 10)])
def test_dualpipev_with_its_pairs_overlapped_idles_deepseeks_formula(p, m):
    """DeepSeek's bubble (PP/2−1)(F&B + B − 3W) (deepseek-ai/DualPipe, README.md; PP =
    2p stages, B a whole backward) is the worst rank's idle when each F&B pair runs as
    one unit whose results leave at its end — for F&B from no overlap (F + whole B) to
    whole overlap (the longer half). Run one after the other, the halves let F's
    activation leave before B starts: with F = B = W that order idles (p−1)F, half."""
    for f, b, w in PAIR_COSTS:
        whole = b + w
        for pair in (f + whole, f + whole - 1, max(f, whole)):
            sim = simulate("dualpipev", p, m, 2, costs={"F": f, "B": b, "W": w, "F&B": pair})
            assert max(sim["idle"]) == (p - 1) * (pair + whole - 3 * w), (f, b, w, pair)
    assert simulate("dualpipev", p, m, 2, costs=UNIT)["idle"] == [p - 1] * p
    # the pairs are phases 4 and 5's: 2(m − 2p + r + 1) + (p − r − 1) on rank r
    for r in range(p):
        pairs = [s for s in overlapped_pairs(SCHEDULES["dualpipev"](p, r, m)) if len(s) == 2]
        assert len(pairs) == 2 * m - 3 * p + r + 1


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_each_v_order_runs_every_unit_once_w_after_b(schedule):
    for p, m in [(2, 4), (3, 6), (4, 9)]:
        for r in range(p):
            order = SCHEDULES[schedule](p, r, m)
            units = [(kind, k, i) for kind in "FB" for k in (0, 1) for i in range(m)]
            assert sorted(u for u in order if u[0] != "W") == sorted(units)
            for kind, k, i in order:
                if kind == "W":
                    assert order.index(("B", k, i)) < order.index(("W", k, i))
            split_order = check_split_order(order, 2, m)  # what the executor relies on
            assert split_order == {(k, i) for kind, k, i in order if kind == "W"}


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-h2"])
def test_every_w_follows_its_b_once_and_the_last_microbatch_ends_each_rank(schedule):
    for p, m in [(2, 4), (4, 7), (4, 9)]:
        for r in range(p):
            order = SCHEDULES[schedule](p, r, m)
            assert sorted(order) == sorted((kind, 0, i) for kind in "FBW" for i in range(m))
            for i in range(m):
                assert order.index(("F", 0, i)) < order.index(("B", 0, i)) < order.index(
                    ("W", 0, i))
            assert order[-1][2] == m - 1


@pytest.mark.parametrize("kwargs,message", [
    (dict(schedule="zb-h2", pp=4, microbatches=6), "needs microbatches >= 2\\*pp-1 = 7"),
    (dict(schedule="zb-h1", pp=2, tp=2, sequence_parallel=True, tp_overlap=True),
     "overlapped GEMMs"),
    (dict(schedule="zbv", pp=2, virtual_stages=2), "build the model with virtual_stages=2, "
     "placement='v'"),
    (dict(schedule="1f1b", pp=2, virtual_stages=2, placement="v"), "does not fit placement"),
    (dict(placement="v", pp=2), "needs virtual_stages=2 and pp > 1"),
    (dict(placement="v", pp=2, virtual_stages=2, zero_stage=2), "ZeRO-2/3's sharded"),
    (dict(schedule="zbv", pp=4, virtual_stages=2, placement="v", microbatches=6, n_layer=8),
     "'zbv' needs microbatches >= 2\\*pp-1 = 7"),
    (dict(schedule="dualpipev", pp=4, virtual_stages=2, placement="v", microbatches=7,
          n_layer=8), "'dualpipev' needs microbatches >= 2\\*pp = 8"),
    (dict(placement="ring"), "placement must be one of"),
])
def test_zero_bubble_rules_refuse_in_one_line(kwargs, message):
    cfg = mt.GPTConfig(**{**CFG, "n_layer": kwargs.pop("n_layer", CFG["n_layer"])})
    with pytest.raises(ValueError, match=message):
        mt.check_parallel_config(cfg, **kwargs)


def _bf16_losses_and_weights():
    out = {}
    for schedule in ("1f1b", "zb-h1"):
        mesh = mt.Mesh(pp=2, dp=2)
        torch.manual_seed(0)
        model = mt.parallelize(mt.GPT(mt.GPTConfig(**CFG)), mesh, param_dtype=torch.bfloat16)
        optimizer = mt.make_optimizer(model, mesh, torch.optim.AdamW, lr=1e-2)
        generator = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(3):
            x, y = (torch.randint(0, 16, (8, 8), generator=generator) for _ in range(2))
            losses.append(mt.train_step(model, (x, y), mesh, optimizer, schedule=schedule,
                                        microbatches=2))
        out[schedule] = losses, model.full_state_dict()
    return out


def test_bf16_mixed_precision_zb_h1_is_bit_for_bit_1f1b():
    """Under bf16 mixed precision (float32 main_grad and masters) W adds the same bf16
    gᵀx into the same float32 main_grad as the whole backward did: bit for bit."""
    run = mt.launch(_bf16_losses_and_weights, 4, timeout=120)
    for rank in run:
        (a, weights_a), (b, weights_b) = rank["1f1b"], rank["zb-h1"]
        assert a == b
        assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
