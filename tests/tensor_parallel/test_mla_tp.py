"""Latent attention under tensor parallelism (`GPTConfig.mla`, `minitp.tensor_parallel.plan`)
equals one device in float64: the loss of every step and every parameter after 2 steps, on
sampled meshes: dp 2 × tp 2 (AdamW), tp 4 with sequence parallelism and full recomputation
(SGD), pp 2 × tp 2 with SP (1F1B, 2 microbatches), dp 2 × tp 2 with ZeRO-3, SP and selective
recomputation, cp 2 × tp 2 with SP, the latent and rotary key all-gathered over cp
(`minitp.context_parallel.latent`), also on packed documents (masked within each, rotary
positions restarting). The down-projections, their norms and the shared rotary
key's W^KR are replicated, the up-projections split by heads, W^O row-parallel; the replicas'
gradients are partial on each rank and summed.
Each rank holds what `mt.calc.params_per_rank` counts.

The trap, on purpose (torchtitan PR #1373's review): W^KR's gradient left un-summed. After
one step W^KR alone departs from one device (every other parameter still equal), and its
copies on the tp ranks differ from each other.

Bytes, from the trace of one step beside the calculator (`mt.calc.mla_tp_bytes_per_layer`,
`mla_cp_bytes_per_layer`): each layer's four tp collectives of b·s·h, with and without SP; the
replicated modules' partial gradients in the one flattened all-reduce (SP adds the norms);
under cp the latent and rotary key gathered, (d_c + d_h^R)·b·s bytes, never the heads' K/V.

Serving: absorbed decoding over tp 4 (`minitp.serving.tp.tp_generate`) equals one uncached
process, and every rank's cache holds the whole latent, (kv_lora_rank + rope_dim)·layers·bytes
a token, measured from its tensors (`minitp.serving.cache_bytes.cache_bytes_per_rank`): tp
does not divide it. All in ONE launch of 4 ranks."""

import torch
from helpers import random_batches, train_side_by_side

import minitp as mt

TOLERANCE = 1e-10
CFG = dict(vocab_size=32, seq_len=8, n_layer=2, n_head=4, d_model=16, q_lora_rank=8,
           kv_lora_rank=8, rope_dim=4)
SETTINGS = [  # (mesh sizes, parallelize's options, optimizer, schedule, microbatches)
    (dict(dp=2, tp=2), {}, torch.optim.AdamW, None, 1),
    (dict(tp=4), dict(sequence_parallel=True, recompute="full"), torch.optim.SGD, None, 1),
    (dict(pp=2, tp=2), dict(sequence_parallel=True), torch.optim.AdamW, "1f1b", 2),
    (dict(dp=2, tp=2), dict(zero_stage=3, sequence_parallel=True, recompute="selective"),
     torch.optim.AdamW, None, 1),
    (dict(cp=2, tp=2), dict(sequence_parallel=True, cp_comm="allgather"), torch.optim.AdamW,
     None, 1),
]
TRACED = [(dict(tp=4), {}), (dict(tp=4), dict(sequence_parallel=True)),
          (dict(cp=2, tp=2), dict(sequence_parallel=True, cp_comm="allgather"))]


def _setup(sizes, options):
    mesh = mt.Mesh(**sizes)
    cfg = mt.GPTConfig.mla(**CFG)
    torch.manual_seed(0)
    ref = mt.GPT(cfg).double()
    return mesh, cfg, ref, mt.parallelize(ref, mesh, **options)


def _train(sizes, options, optimizer_class, schedule, microbatches, steps=2):
    mesh, cfg, ref, model = _setup(sizes, options)
    held = sum(p.numel() for p in model.parameters())  # the calculator's count, measured
    if "zero_stage" not in options:  # (ZeRO-3 holds a 1/dp shard of each)
        assert held == mt.calc.params_per_rank(cfg, tp=mesh.tp.size, pp=mesh.pp.size,
                                               stage=mesh.pp.rank), (held, sizes)
    loss_error, worst, _ = train_side_by_side(
        ref, model, mesh, random_batches(steps, cfg, 4), microbatches=microbatches,
        schedule=schedule, optimizer_class=optimizer_class)
    return loss_error, worst


def _trap():
    """W^KR treated as if its gradient were whole on each rank: one SGD step at tp 4."""
    mesh, cfg, ref, model = _setup(dict(tp=4), {})
    for name, p in model.named_parameters():
        if ".k_rope." in name:
            p.grad_partial_over_tp = False
    _, worst, _ = train_side_by_side(ref, model, mesh, random_batches(1, cfg, 4),
                                     optimizer_class=torch.optim.SGD)
    k_rope = next(p for n, p in model.named_parameters() if n.endswith("k_rope.weight"))
    return worst, k_rope.detach().clone()


def _packed_cp():
    """cp 2 × tp 2 with SP on two documents a row (positions restarting at 3)."""
    mesh, cfg, ref, model = _setup(dict(cp=2, tp=2), dict(sequence_parallel=True,
                                                           cp_comm="allgather"))
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]] * 4)
    batches = [(x, y, positions) for x, y in random_batches(2, cfg, 4)]
    loss_error, worst, _ = train_side_by_side(ref, model, mesh, batches,
                                              optimizer_class=torch.optim.AdamW)
    return loss_error, worst


def _traced(sizes, options):
    """One SGD step's collectives: {(label, op, axis): [nbytes, ...]}."""
    mesh, cfg, _, model = _setup(sizes, options)
    mt.trace.clear()
    mt.train_step(model, random_batches(1, cfg, 4)[0], mesh, torch.optim.SGD(model.parameters()))
    seen = {}
    for e in mt.trace.events():
        if e.is_comm and e.axis in ("tp", "cp"):
            seen.setdefault((e.label, e.op, e.axis), []).append(e.nbytes)
    return seen


def _serve():
    from minitp.model.mla import set_absorbed
    from minitp.serving import generate
    from minitp.serving.cache_bytes import cache_bytes_per_rank
    from minitp.serving.tp import tp_generate, tp_model

    mesh = mt.Mesh(tp=4)
    torch.manual_seed(0)
    ref = mt.GPT(mt.GPTConfig.mla(**CFG)).double().eval()
    prompt = torch.randint(0, 32, (2, 3), generator=torch.Generator().manual_seed(1))
    plain = generate(ref, prompt, 7, cached=False)  # one process, expanded, no cache
    set_absorbed(ref)
    out = tp_generate(ref, mesh, prompt, 7)
    held = cache_bytes_per_rank(tp_model(ref, mesh), prompt)
    diff = max(float((a - b).abs().max()) for a, b in zip(out.logits, plain.logits, strict=True))
    return torch.equal(out.tokens, plain.tokens), diff, held


def _worker():
    return ([*(_train(*setting) for setting in SETTINGS), _packed_cp()], _trap(), _serve(),
            [_traced(*setting) for setting in TRACED])


def _check_bytes(traced):
    """The trace's bytes beside the calculator's (float64: 8 bytes a value; batch 4)."""
    shape, w = mt.calc.MLAShape.of(mt.GPTConfig.mla(**CFG)), 8
    layers = CFG["n_layer"]
    for (sizes, options), seen in zip(TRACED, traced, strict=True):
        sp, tp = options.get("sequence_parallel", False), sizes["tp"]
        local = CFG["seq_len"] // sizes.get("cp", 1)
        model = mt.calc.mla_tp_bytes_per_layer(shape, local, 4, tp, sp, w)
        for layer in ("layer0", "layer1"):
            # four places of b·s·h: an all-reduce each, or an all-gather and a reduce-scatter
            ops = ("all_gather", "reduce_scatter") if sp else ("all_reduce",)
            per_op = [sum(seen[(layer, op, "tp")]) for op in ops]
            assert per_op == [model["activations"]] * len(ops), (sizes, layer, per_op)
        norms = CFG["d_model"] * w if sp else 0  # the final norm's, outside the layers
        assert seen[("sequence-parallel grads", "all_reduce", "tp")] == [
            layers * model["partial_grads"] + norms], (sizes, seen)
        if "cp" in sizes:
            cp = mt.calc.mla_cp_bytes_per_layer(shape, CFG["seq_len"], 4, tp, w)
            for op in ("all_gather", "reduce_scatter"):  # forward, then its conjugate
                assert sum(seen[("layer0.allgather latent", op, "cp")]) == cp["latent"]


def test_latent_attention_over_tp_equals_one_device_and_the_unsummed_rotary_key_departs():
    run = mt.launch(_worker, 4, timeout=120)
    for rank, (results, _, _, _) in enumerate(run):
        packed = (dict(cp=2, tp=2), "packed", torch.optim.AdamW)
        for setting, (loss_error, (param_error, name)) in zip([*SETTINGS, packed], results,
                                                              strict=True):
            where = f"rank {rank}, {setting[:2]}, {setting[2].__name__}"
            assert loss_error < TOLERANCE, f"{where}: loss differs by {loss_error:.3g}"
            assert param_error < TOLERANCE, f"{where}: {name} differs by {param_error:.3g}"
    for rank, (_, ((param_error, name), _), _, _) in enumerate(run):
        # one step: only W^KR got a wrong gradient, so it is the one that departs, by SGD's
        # lr·(the other ranks' terms): small at init (std 0.02), yet 1000× the tolerance
        assert param_error > 1000 * TOLERANCE and ".k_rope." in name, (rank, name, param_error)
    copies = [trap[1] for _, trap, _, _ in run]
    assert all((copies[0] - c).abs().max() > 1000 * TOLERANCE for c in copies[1:]), "no drift"
    whole = mt.calc.mla_cache_bytes_per_token(8, 4, 2, 8)  # float64, on every rank
    for _, _, (tokens_equal, diff, held), traced in run:
        assert tokens_equal and diff <= 1e-12, diff
        assert held["per_token"] == whole and held["held"] == whole * 2 * 3  # 2 rows of 3
        # every rank's c_KV and k^R whole: (B, 1, capacity, d_c) and (B, 1, capacity, d_r)
        assert held["tensors"] == [((2, 1, CFG["seq_len"], 8), (2, 1, CFG["seq_len"], 4))] * 2
        _check_bytes(traced)


def test_refusals_come_in_one_line():
    cfg = mt.GPTConfig.mla(**CFG)
    for sizes, words in ((dict(tp=3), "not divisible by tp=3"),
                         (dict(cp=2), "the ring, the all-to-all and allgather-regather")):
        try:
            mt.check_parallel_config(cfg, **sizes)
        except ValueError as error:
            assert words in str(error) and "\n" not in str(error), str(error)
        else:
            raise AssertionError(f"{sizes} was not refused")
