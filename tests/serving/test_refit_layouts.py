"""Refit and KV reshard across layouts, in one launch of 4 ranks: a trainer on ranks 0–1
(tp 2) refit onto separate serving ranks 2–3 at tp 2 and at pp 2 (each an `mt.Mesh` over
its own ranks); a (pp 2, tp 2) trainer on all four refit onto pp 2 (dp replicas); the
served weights equal `mt.parallelize`'s of the trainer's dense weights bit for bit in
float64 and decode the dense model's tokens; bytes from the trace equal the plan's. A
prefill's KV cache at tp 4, at (pp 2, tp 2) and on ranks 0–1 moved to a tp-2 decoding
layout equals the one the decoding layout's own prefill builds (bit for bit where both
layouts compute alike) and decodes on; a tp the heads cannot split on the serving ranks
alone is refused on every rank."""

import copy

import pytest
import torch
import torch.distributed as dist

import minitp as mt
from minitp import data
from minitp.serving import (
    Decoder,
    Refit,
    generate,
    pp_decode,
    refit,
    reshard_kv,
    tp_model,
    vocab_gather,
)

CFG = mt.GPTConfig(vocab_size=64, seq_len=8, n_layer=2, n_head=4, d_model=16)
TOKENS = 3


def _ref():
    torch.manual_seed(0)
    return mt.GPT(CFG).to(torch.float64)


def _prompt():
    return torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(1))


def _train(mesh):
    """`_ref` parallelized on `mesh`, one AdamW step taken."""
    model = mt.parallelize(_ref().to(mt.device()), mesh)
    optimizer = mt.make_optimizer(model, mesh, lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    tokens = torch.randint(0, 64, (400,), generator=torch.Generator().manual_seed(2))
    mt.train_step(model, data.get_batch(tokens, 0, 4, CFG.seq_len), mesh, optimizer)
    return model


def _dense(model, owner: int) -> dict:
    """The trained dense weights, sent from global rank `owner` to every rank (the
    reference's path, not the refit's)."""
    state = [{k: v.cpu() for k, v in model.full_state_dict().items()}
             if model is not None else None]
    dist.broadcast_object_list(state, src=owner)
    return state[0]


def _same(served, dense, mesh) -> bool:
    ref = _ref()
    ref.load_state_dict(dense)
    expect = mt.parallelize(ref.to(mt.device()), mesh, sequence_parallel=False).state_dict()
    return all(torch.equal(v, expect[k]) for k, v in served.state_dict().items())


def _tokens(served):
    """What a served shard decodes after `_prompt` (greedy): tp's generate or pp's."""
    if served.mesh.pp.size > 1:
        groups = pp_decode(served, [_prompt().to(mt.device())], TOKENS).groups
        return groups[0].tokens.cpu() if groups else None
    return generate(served, _prompt().to(mt.device()), TOKENS,
                    gather=vocab_gather(served)).tokens.cpu()


class _Heads3(mt.Mesh):
    """A serving grid claiming tp 3 (4 heads cannot split 3 ways), built without groups:
    the refusal comes first."""

    def __init__(self):
        self.dp_size, self.pp_size, self.cp_size, self.tp_size, self.ep_size = 1, 1, 1, 3, 1


def _separate(me):
    """Ranks 0–1 train at tp 2; ranks 2–3 serve at tp 2 and then at pp 2."""
    trains = me < 2
    model = _train(mt.Mesh(tp=2, ranks=range(2))) if trains else None
    out = {}
    for name, sizes in (("tp2", dict(tp=2)), ("pp2", dict(pp=2))):
        target = None if trains else mt.Mesh(**sizes, ranks=range(2, 4))
        planned = Refit(model, None) if trains else Refit.for_generator(CFG, target)
        report = planned.refit_once()
        dense = _dense(model, 0)
        served = planned.served
        out[name] = (report, None if trains else _same(served, dense, target),
                     None if trains else _tokens(served), dense)
    try:
        refit(model, None if trains else _Heads3(), cfg=CFG)
    except ValueError as error:
        out["refused"] = str(error)
    return out


def _pp_target():
    """A (pp 2, tp 2) trainer on all four ranks, served at pp 2 with dp replicas."""
    model = _train(mt.Mesh(pp=2, tp=2))
    target = mt.Mesh(dp=2, pp=2)
    served, report = refit(model, target)
    dense = _dense(model, 0)  # (rank 0 is in both stages' gather)
    return report, _same(served, dense, target), _tokens(served), dense


def _kv():
    """Prefill caches at tp 4, at (pp 2, tp 2) and on ranks 0–1 at tp 2, resharded onto
    tp 2: {name: (max |difference| from the decoding layout's own prefill cache, bit for
    bit?, next-token logits' max difference, report)}."""
    me, prompt = dist.get_rank(), _prompt().to(mt.device())
    decode = tp_model(_ref().to(mt.device()), mt.Mesh(dp=2, tp=2))
    own = Decoder(decode, vocab_gather(decode))
    own.next_logits(prompt)  # the decoding layout's own prefill
    prefills = {}
    tp4 = tp_model(_ref().to(mt.device()), mt.Mesh(tp=4))
    decoder = Decoder(tp4, vocab_gather(tp4))
    decoder.next_logits(prompt)
    prefills["tp4->tp2"] = (decoder.cache, tp4, decode)
    pipeline = mt.parallelize(_ref().to(mt.device()), mt.Mesh(pp=2, tp=2),
                              sequence_parallel=False).eval()
    caches = pp_decode(pipeline, [prompt], 1).caches  # (pp_generate's, on its own model)
    prefills["pp2tp2->tp2"] = (caches[0], pipeline, decode)
    if me < 2:
        left = tp_model(_ref().to(mt.device()), mt.Mesh(tp=2, ranks=range(2)))
        cache = Decoder(left, vocab_gather(left))
        cache.next_logits(prompt)
        prefills["ranks01->ranks23"] = (cache.cache, left, None)
    else:
        right = tp_model(_ref().to(mt.device()), mt.Mesh(tp=2, ranks=range(2, 4)))
        mine = Decoder(right, vocab_gather(right))
        mine.next_logits(prompt)
        prefills["ranks01->ranks23"] = (None, None, right)
    out = {}
    for name, (cache, source, target) in prefills.items():
        moved, report = reshard_kv(cache, source, target)
        if target is None:
            out[name] = (None, None, None, report)
            continue
        theirs = own if target is decode else mine
        diff = max(float((a.narrow(2, 0, 4) - b.narrow(2, 0, 4)).abs().max())
                   for la, lb in zip(moved.layers, theirs.cache.layers, strict=True)
                   for a, b in ((la.k, lb.k), (la.v, lb.v)))
        bitwise = all(torch.equal(la.k, lb.k) and torch.equal(la.v, lb.v)
                      for la, lb in zip(moved.layers, theirs.cache.layers, strict=True))
        step = torch.cat([prompt, prompt[:, :1]], dim=1)  # one more token, through each cache
        resumed = Decoder(target, vocab_gather(target))
        resumed.cache = moved
        logits = resumed.next_logits(step)
        again = Decoder(target, vocab_gather(target))
        again.cache = copy.deepcopy(theirs.cache)  # (the next layout's cache unmoved)
        out[name] = (diff, bitwise, float((logits - again.next_logits(step)).abs().max()),
                     report)
    return out


def _rank():
    me = dist.get_rank()
    return {"separate": _separate(me), "pp": _pp_target(), "kv": _kv()}


@pytest.fixture(scope="module")
def run():
    return mt.launch(_rank, 4, timeout=120)


def _one_device_tokens(dense):
    ref = _ref()
    ref.load_state_dict(dense)
    return generate(ref, _prompt(), TOKENS).tokens


@pytest.mark.ranks
def test_separate_serving_ranks_get_the_trainers_weights_bit_for_bit(run):
    for name in ("tp2", "pp2"):
        dense = run[0]["separate"][name][3]
        tokens = _one_device_tokens(dense)
        for r in (2, 3):
            report, same, got, _ = run[r]["separate"][name]
            assert same, (r, name)
            if got is not None:  # (pp: the last stage holds the tokens)
                assert torch.equal(got, tokens), (r, name)
            assert report.local == 0 and report.received == report.planned == report.minimum
            assert 0 < report.minimum < report.broadcast
        for r in (0, 1):  # the trainers send, receive nothing
            report = run[r]["separate"][name][0]
            assert report.received == report.minimum == 0 and report.sent > 0
        assert sum(run[r]["separate"][name][0].received for r in range(4)) \
            == sum(run[r]["separate"][name][0].sent for r in range(4))
    assert run[3]["separate"]["pp2"][2] is not None  # pp's last stage: rank 3


@pytest.mark.ranks
def test_a_pp_serving_layout_is_refit_bit_for_bit(run):
    tokens = _one_device_tokens(run[0]["pp"][3])
    for r in range(4):
        report, same, got, _ = run[r]["pp"]
        assert same, r
        assert report.received == report.planned and report.minimum == report.planned \
            + report.local
        if r >= 2:  # the last stage: ranks 2 and 3 (dp replicas)
            assert torch.equal(got, tokens), r


@pytest.mark.ranks
def test_a_kv_cache_resharded_equals_the_decoding_layouts_own(run):
    for r in range(4):
        kv = run[r]["kv"]
        for name in ("tp4->tp2", "pp2tp2->tp2"):
            diff, _, logits, report = kv[name]
            assert diff <= 1e-12 and logits <= 1e-12, (r, name, diff, logits)
            assert report.received == report.planned, (r, name)
            assert report.minimum == report.planned + report.local
        diff, bitwise, logits, report = kv["ranks01->ranks23"]
        if r >= 2:  # the same layout on other ranks: the same numbers, every byte moved
            assert bitwise and diff == 0.0 and logits == 0.0, r
            assert report.local == 0 and report.received == report.planned == report.minimum
            # MODEL: 2 layers × 2 of 4 K/V heads × B 2 × 4 positions × (4 + 4) × 8 bytes
            assert report.minimum == 2 * 2 * 2 * 4 * 8 * 8
        else:
            assert report.received == 0 and report.sent == 2 * 2 * 2 * 4 * 8 * 8


@pytest.mark.ranks
def test_a_tp_only_the_serving_ranks_hold_is_refused_on_every_rank(run):
    for r in range(4):
        said = run[r]["separate"]["refused"]
        assert "not divisible by tp=3" in said and "\n" not in said, r
        assert ("(rank 2)" in said) == (r != 2), (r, said)
