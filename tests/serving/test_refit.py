"""Refit (`minitp.serving.refit`) on real ranks, in one launch of 4: weights trained at
(dp 2, tp 2) with ZeRO-1, at (pp 2, tp 2) and (a mixture of experts) at (dp 4, ep 2) with
ZeRO-3 move onto tp 4 equal
to the trainer's dense weights bit for bit in float64, and decode as the dense model does
on one device; each rank's bytes read from the trace equal the plan's; the generator's
log-probabilities of its own tokens equal the trainer's forward in float64 and drift in
bf16 between tp 1, 2 and 4 (a mixture of experts, its routing flips counted); a refit
planned once follows two more training steps; bad requests are refused in one line on every rank."""

import math

import pytest
import torch

import minitp as mt
from minitp import data
from minitp.checkpoint.reshard import dense_expert_biases
from minitp.data_parallel.zero import gathered
from minitp.model.routing import Router
from minitp.serving import (
    Refit,
    generate,
    logprob_parity,
    refit,
    routing_flips,
    tp_model,
    vocab_gather,
)
from minitp.sharding.tags import tag

CFG = mt.GPTConfig(vocab_size=64, seq_len=8, n_layer=2, n_head=4, d_model=16)
MOE = mt.GPTConfig(vocab_size=64, seq_len=8, n_layer=2, n_head=4, d_model=16, n_experts=4,
                   top_k=2)
TRAININGS = {"dp2-tp2-zero1": (dict(dp=2, tp=2), dict(zero_stage=1), CFG),
             "pp2-tp2": (dict(pp=2, tp=2), {}, CFG),
             "moe-dp4-ep2-zero3": (dict(dp=4, ep=2), dict(zero_stage=3), MOE)}
TOKENS = 3


def _ref(dtype=torch.float64, cfg=CFG):
    torch.manual_seed(0)
    return mt.GPT(cfg).to(dtype)


def _prompt():
    return torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(1))


def _trained(sizes, plan, dtype=torch.float64, steps=2, cfg=CFG):
    """A model trained `steps` AdamW steps at `sizes` with `plan`, its dense weights, and
    a function that takes one more step and returns the dense weights after it."""
    mesh = mt.Mesh(**sizes)
    model = mt.parallelize(_ref(dtype, cfg).to(mt.device()), mesh, **plan)
    optimizer = mt.make_optimizer(model, mesh, lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    tokens = torch.randint(0, 64, (400,), generator=torch.Generator().manual_seed(2))
    done = []

    def train(n):
        for _ in range(n):
            batch = data.get_batch(tokens, len(done), 4, CFG.seq_len)
            done.append(mt.train_step(model, batch, mesh, optimizer))
        with gathered(model):  # ZeRO-3 keeps shards only
            dense = {k: v.cpu().clone() for k, v in model.full_state_dict().items()}
        dense.update(dense_expert_biases(model, mesh))  # (a buffer the steps moved)
        return dense
    return model, train(steps), lambda: train(1)


def _equal(served, dense, cfg, mesh) -> bool:
    """`served`'s whole state is tp_model's of the `dense` weights, bit for bit."""
    expect = tp_model(_dense_gpt(dense, cfg).to(mt.device()), mesh).state_dict()
    return all(torch.equal(v, expect[k]) for k, v in served.state_dict().items())


def _dense_gpt(state, cfg=CFG):
    ref = _ref(cfg=cfg)
    ref.load_state_dict(state)
    return ref


def _refused(call):
    try:
        call()
    except (TypeError, ValueError) as error:
        return str(error)
    return None


def _rank():
    out = {"refit": {}}
    tp4 = mt.Mesh(tp=4)
    for name, (sizes, plan, cfg) in TRAININGS.items():
        model, dense, more = _trained(sizes, plan, cfg=cfg)
        served, report = refit(model, tp4)  # the layout read off the model
        equal = _equal(served, dense, cfg, tp4)
        gen = generate(served, _prompt().to(mt.device()), TOKENS, temperature=1.0, seed=3,
                       gather=vocab_gather(served))
        out["refit"][name] = (equal, report, dense, gen.tokens.cpu(), torch.stack(gen.logits))
        if name == "dp2-tp2-zero1":
            out["parity64"] = logprob_parity(model, served, gen.tokens, _prompt().shape[1])
            out["split_bytes"] = 8 * sum(p.numel() for p in served.parameters()  # by the tags
                                         if tag(p, "tp_split_dim") is not None)
        if name == "pp2-tp2":  # an RL loop: planned once, refit after each of two more steps
            planned, out["again"] = Refit(model, tp4), []
            for _ in range(2):
                dense_now, report_now = more(), planned.refit_once()
                out["again"].append((_equal(planned.served, dense_now, cfg, tp4), report_now,
                                     _equal(planned.served, dense, cfg, tp4)))
    out["bf16"] = _bf16_logprobs()
    out["refused"] = [
        _refused(lambda: refit(_ref(), tp4)),  # a plain GPT
        _refused(lambda: refit(mt.parallelize(_ref(), tp4), mt.Mesh(cp=2, tp=2))),
        _refused(lambda: refit(mt.parallelize(_ref(), tp4), _Heads3())),
        _refused(lambda: refit(None, tp4)),  # serving without training: no config
        _refused(lambda: refit(mt.parallelize(_ref(), tp4), tp4, dict(zero_stage=3))),
    ]
    return out


def _bf16_logprobs():
    """The mixture of experts trained at (dp 2, tp 2) in bf16; generators refit from it at
    tp 1, 2 and 4 (with dp replicas) score the same tokens: {tp: (logprob_parity's
    answer, routing_flips')}."""
    model = _trained(dict(dp=2, tp=2), {}, dtype=torch.bfloat16, steps=1, cfg=MOE)[0]
    tokens = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(4))
    out = {}
    for tp in (1, 2, 4):
        served = refit(model, mt.Mesh(dp=4 // tp, tp=tp))[0]
        out[tp] = (logprob_parity(model, served, tokens, 4),
                   routing_flips(model, served, tokens, 4))
    for router in (m for m in served.modules() if isinstance(m, Router)):
        router.gate.weight.data.neg_()  # every top-2 of 4 becomes the bottom 2: all flip
    out["negated"] = routing_flips(model, served, tokens, 4)
    return out


class _Heads3(mt.Mesh):
    """A mesh claiming tp 3 (4 heads cannot split 3 ways): the refusal comes before any of
    its groups would be used, so it is built without them."""

    def __init__(self):
        self.dp_size, self.pp_size, self.cp_size, self.tp_size, self.ep_size = 1, 1, 1, 3, 1
        self.world_size = 4


@pytest.fixture(scope="module")
def run():
    return mt.launch(_rank, 4, timeout=120)


def test_refit_equals_the_dense_trainer_bit_for_bit(run):
    for name, (_, _, cfg) in TRAININGS.items():
        dense = run[0]["refit"][name][2]
        one = generate(_dense_gpt(dense, cfg), _prompt(), TOKENS, temperature=1.0, seed=3)
        for r in range(4):
            equal, _, theirs, tokens, logits = run[r]["refit"][name]
            assert equal, (r, name)  # every served shard is tp_model's of the dense weights
            assert all(torch.equal(theirs[k], dense[k]) for k in dense)  # one dense model
            assert torch.equal(tokens, one.tokens), (r, name)
            assert float((logits - torch.stack(one.logits)).abs().max()) <= 1e-12


def test_a_refit_planned_once_follows_the_training(run):
    for r in range(4):
        first = run[r]["refit"]["pp2-tp2"][1]
        for now, report, stale in run[r]["again"]:
            assert now and not stale, r  # the newest weights, not the first refit's
            assert report.received == first.received and report.messages == first.messages


def test_bytes_from_the_trace_equal_the_plan(run):
    for name, (_, _, cfg) in TRAININGS.items():
        ref = _ref(cfg=cfg)  # the whole dense model: float64 weights, float32 experts' biases
        dense_bytes = sum(t.numel() * t.element_size() for t in ref.state_dict().values())
        reports = [run[r]["refit"][name][1] for r in range(4)]
        for report in reports:
            assert report.received == report.planned, (report, name)
            assert report.minimum == report.planned + report.local
            assert report.broadcast == dense_bytes
            assert report.minimum < report.broadcast
        assert sum(rep.received for rep in reports) == sum(rep.sent for rep in reports) > 0
        families = 1 + bool(cfg.n_experts)  # (the experts' biases travel as float32)
        for report in reports:  # MEASURED: the kernel's count of what each rank wrote, beside
            if report.sent_measured is not None:  # the plan's; gloo's headers (96 bytes a
                headers = report.sent_measured - report.sent  # send, 48 a receive, here)
                assert 0 <= headers <= 128 * 2 * 3 * families, (name, report)
    # the MODEL, from (dp 2, tp 2) to tp 4: ranks 0 and 3 hold their tp-4 slice already (in
    # their tp-2 one); ranks 1 and 2 receive their slice of every split weight, nothing else
    # (a replicated weight every rank holds); every rank keeps each weight once
    reports = [run[r]["refit"]["dp2-tp2-zero1"][1] for r in range(4)]
    split = run[0]["split_bytes"]
    assert [rep.received for rep in reports] == [0, split, split, 0]
    assert [rep.messages for rep in reports] == [0, 1, 1, 0]


def test_logprobs_equal_in_float64_and_drift_in_bf16(run):
    parity = run[0]["parity64"]
    assert parity["generator"].shape == (2, TOKENS)
    assert parity["max_diff"] <= 1e-12
    bf16 = run[0]["bf16"]
    drift = {(a, b): float((bf16[a][0]["generator"] - bf16[b][0]["generator"]).abs().max())
             for a, b in ((1, 2), (1, 4), (2, 4))}
    assert all(math.isfinite(d) and d > 0 for d in drift.values()), drift  # measured, > 0
    negated = bf16["negated"]
    assert negated[0] == negated[1] == MOE.n_layer * 2 * 6  # the count can see a flip
    for parity, (flips, decisions) in (bf16[tp] for tp in (1, 2, 4)):
        assert math.isfinite(parity["max_diff"])
        assert decisions == MOE.n_layer * 2 * 6 and 0 <= flips <= decisions  # measured


def test_bad_requests_are_refused_in_one_line(run):
    for r in range(4):
        plain, pp, heads, world, plan = run[r]["refused"]
        assert "mt.parallelize" in plain
        assert "tp and pp (with dp replicas) only" in pp
        assert "not divisible by tp=3" in heads
        assert "passes the model's config" in world
        assert "does not describe this model's layout" in plan
        assert all("\n" not in m for m in run[r]["refused"])
