"""The design questions whose answer is a letter the same for every draw: each recomputed by
playing every option's premise in one process, in float64, at the draw's numbers (t, n, s),
and keeping the option that is exact with the least communication. Not a lookup of the
letter: a premise that changed (a split that needs no collective, a gradient that needs no
sum) would move the answer and fail here. Not checked: none."""

import dataclasses
import functools
import itertools
import zlib

import pytest
from answers_common import asked

import minitp as mt

torch = pytest.importorskip("torch")
F = torch.nn.functional
NOT_CHECKED = set()


def _rng(p):
    """A generator seeded by the draw (crc32, not `hash`: the same on every run)."""
    return torch.Generator().manual_seed(zlib.crc32(repr(sorted(p.items())).encode()))


def _randn(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def test_01_which_collective_is_the_exact_one_that_sends_least():
    for _, p, right in asked("01.which-collective"):
        n, chunk = p["n"], 4
        grads = [_randn(_rng(p), n * chunk) + r for r in range(n)]  # rank r's whole gradient
        total = sum(grads)
        gets = {"a": [total[r * chunk:(r + 1) * chunk] for r in range(n)],  # keep your part
                "b": list(total.split(chunk)),                              # reduce-scatter
                "c": [torch.cat(grads)[r * chunk:(r + 1) * chunk] for r in range(n)],
                "d": [grads[0][r * chunk:(r + 1) * chunk] for r in range(n)]}
        ops = {"a": "all_reduce", "b": "reduce_scatter", "c": "all_gather", "d": "broadcast"}
        exact = {k for k, got in gets.items()
                 if all(torch.equal(g, total[r * chunk:(r + 1) * chunk])
                        for r, g in enumerate(got))}
        sent = {k: mt.calc.ring_wire_bytes(ops[k], 8 * n * chunk, n) for k in exact}
        assert right == min(sent, key=sent.get) and len(exact) == 2, (p, sent)


def test_01_ring_bytes_formula_is_the_rings_bytes():
    for _, _, right in asked("01.ring-bytes-formula"):  # no draw: the same formula each seed
        for n, size in itertools.product((2, 3, 8, 64), (10**3, 10**6, 10**9)):
            assert abs(right(n, size) - mt.calc.ring_wire_bytes("all_reduce", size, n)) <= 1


def _mlp_collectives(split_a, split_b, t, X, A, B):
    """The fewest collectives (none, all-reduce, all-gather at each of the two points)
    that give every rank the whole GELU(XA)·B, with A and B split over t ranks as named."""
    Z, h4 = F.gelu(X @ A) @ B, A.shape[1]
    cut = [slice(r * h4 // t, (r + 1) * h4 // t) for r in range(t)]
    ways = {"none": lambda ys: ys, "all-reduce": lambda ys: [sum(ys)] * t,
            "all-gather": lambda ys: [torch.cat(ys, -1)] * t}
    h = A.shape[0]
    rows = [slice(r * h // t, (r + 1) * h // t) for r in range(t)]
    first = ([X @ A[:, c] for c in cut] if split_a == "columns"
             else [X[:, r] @ A[r, :] for r in rows])
    best = None
    for one, two in itertools.product(ways, repeat=2):
        hs = [F.gelu(y) for y in ways[one](first)]
        if any(hr.shape[1] not in (h4, h4 // t) for hr in hs):
            continue  # an all-gather of partial sums: no shard of B takes that
        if split_b == "rows":  # B's rows r·4h/t..: the matching columns of GELU(XA)
            second = [hr[:, c] @ B[c, :] if hr.shape[1] == h4 else hr @ B[c, :]
                      for hr, c in zip(hs, cut, strict=True)]
        elif all(hr.shape[1] == h4 for hr in hs):
            second = [hr @ B[:, r] for hr, r in zip(hs, rows, strict=True)]
        else:
            continue  # a column shard of B needs every column of GELU(XA)
        if all(z.shape == Z.shape and torch.allclose(z, Z) for z in ways[two](second)):
            count = (one != "none") + (two != "none")
            best = count if best is None else min(best, count)
    return best


@functools.cache
def _mlp_counts(t):
    splits = {"a": ("columns", "rows"), "b": ("rows", "columns"),
              "c": ("columns", "columns"), "d": ("rows", "rows")}
    g = _rng({"t": t})
    X, A, B = _randn(g, 3, 2 * t), _randn(g, 2 * t, 8 * t), _randn(g, 8 * t, 2 * t)
    return {k: _mlp_collectives(*s, t, X, A, B) for k, s in splits.items()}


def test_02_mlp_split_is_the_one_with_fewest_collectives():
    for _, p, right in asked("02.mlp-split"):  # the draws differ in t alone: once a t
        counts = _mlp_counts(p["t"])
        assert counts == {"a": 1, "b": 2, "c": 2, "d": 2} and right == "a", (p, counts)


def _whole_heads(order, t, dim):
    """Whether every contiguous block of 3h/t features holds the q, k and v of whole heads."""
    size = len(order) // t
    blocks = [order[r * size:(r + 1) * size] for r in range(t)]
    return all({k for k, _ in b} == {0, 1, 2} and len(b) == 3 * dim * len({hd for _, hd in b})
               for b in blocks)


def test_03_qkv_order_is_the_split_that_holds_whole_heads_with_no_collective():
    for _, p, right in asked("03.qkv-order"):
        heads, t, dim = p["n_head"], p["t"], 2
        h = heads * dim
        gpt2 = [(f // h, f % h // dim) for f in range(3 * h)]  # (q/k/v, head) of a feature
        by_head = sorted(gpt2, key=lambda kh: (kh[1], kh[0]))   # (head, q/k/v, head_dim)

        g = _rng(p)
        X, W = _randn(g, 5, h), _randn(g, 3 * h, h)
        row_split = X[:, : h // t] @ W[:, : h // t].T  # (c): a partial sum of every feature
        no_collective = {"a": _whole_heads(gpt2, t, dim), "b": _whole_heads(by_head, t, dim),
                         "c": torch.allclose(row_split, X @ W.T),
                         "d": _whole_heads(gpt2, t, dim)}  # (d)'s blocks are (a)'s until gathered
        assert [k for k, ok in no_collective.items() if ok] == [right] == ["b"], p


def _losses(logits, target, t):
    """Each option's cross-entropy, each rank holding V/t columns; (b)'s is F.cross_entropy."""
    parts, width = logits.chunk(t, -1), logits.shape[-1] // t
    owner, local = target // width, target % width
    rows = torch.arange(len(target))
    mine = [(owner == r) for r in range(t)]
    a = sum(torch.where(mine[r], F.cross_entropy(z, local.clamp(max=z.shape[1] - 1),
                                                 reduction="none"), 0.0)
            for r, z in enumerate(parts)).mean()  # each rank's own softmax, the ranks averaged
    m = torch.stack([z.max(-1).values for z in parts]).max(0).values  # the global max
    zy = sum(torch.where(mine[r], z[rows, local.clamp(max=z.shape[1] - 1)], 0.0)
             for r, z in enumerate(parts))  # the target logit, summed from its one holder
    c = (torch.log(sum((z - m[:, None]).exp().sum(-1) for z in parts)) - (zy - m)).mean()
    own = [z.max(-1).values for z in parts]  # (d): each rank shifts by its own max
    d = (torch.log(sum((z - own[r][:, None]).exp().sum(-1) for r, z in enumerate(parts)))
         - sum(torch.where(mine[r], zy - own[r], 0.0) for r in range(t))).mean()
    return {"a": a, "b": F.cross_entropy(logits, target), "c": c, "d": d}


@functools.cache
def _no_gather(t):
    """(the options whose loss is exact, (b)'s and (c)'s bytes a rank sends) at t ranks."""
    tokens, vocab, g = 16, 64, _rng({"t": t})
    logits = _randn(g, tokens, vocab) * 4 + torch.arange(vocab) / 8  # ranks' maxes differ
    target = torch.randint(vocab, (tokens,), generator=g)
    exact = F.cross_entropy(logits, target)
    ok = {k for k, v in _losses(logits, target, t).items()
          if torch.isclose(v, exact, rtol=1e-12)}
    return ok, {"b": mt.calc.ring_wire_bytes("all_gather", 8 * tokens * vocab, t),
                "c": 3 * mt.calc.ring_wire_bytes("all_reduce", 8 * tokens, t)}


def test_04_no_gather_is_the_exact_loss_that_sends_least():
    for _, p, right in asked("04.no-gather"):  # the draws differ in t alone: once a t
        ok, sent = _no_gather(p["t"])
        assert ok == {"b", "c"} and right == min(sent, key=sent.get), (p, ok, sent)


@functools.cache
def _complete_on_each_rank(t):
    """Which of (a) qkv's column shard, (b) γ, (c) proj's row shard has, on every rank of
    t, the whole gradient's part with no sum of its own; and that γ's summed is whole."""
    g = _rng({"t": t})
    h, x = 4, _randn(g, 2 * t, 4)
    gamma, w1, w2 = _randn(g, h), _randn(g, 2 * t, h), _randn(g, h, 2 * t)
    weight = _randn(g, 2 * t, h)  # the loss: Σ weight·out, a fixed linear read-out
    dense = [v.clone().requires_grad_() for v in (gamma, w1, w2)]  # one process
    (F.gelu(F.layer_norm(x, (h,), dense[0]) @ dense[1].T) @ dense[2].T * weight
     ).sum().backward()
    # sequence parallelism, every rank's tensors separate autograd leaves: its LayerNorm on
    # its own positions, an all-gather (cat), its column and row shards, the reduce-scatter
    # (a sum); each .grad is what that rank holds before any sum of its own
    gammas = [gamma.clone().requires_grad_() for _ in range(t)]
    w1s = [w.clone().requires_grad_() for w in w1.chunk(t)]
    w2s = [w.clone().requires_grad_() for w in w2.chunk(t, 1)]
    normed = torch.cat([F.layer_norm(xr, (h,), gr)
                        for xr, gr in zip(x.chunk(t), gammas, strict=True)])
    out = sum(F.gelu(normed @ a.T) @ b.T for a, b in zip(w1s, w2s, strict=True))
    (out * weight).sum().backward()
    whole = {"a": (w1s, dense[1].grad.chunk(t)), "b": (gammas, [dense[0].grad] * t),
             "c": (w2s, dense[2].grad.chunk(t, 1))}
    complete = {k: all(torch.allclose(v.grad, w) for v, w in zip(*pair, strict=True))
                for k, pair in whole.items()}
    return complete, torch.allclose(sum(gr.grad for gr in gammas), dense[0].grad)


def test_05_partial_grads_is_the_replicated_weight_whose_gradient_is_partial():
    for _, p, right in asked("05.partial-grads"):  # the draws differ in t alone: once a t
        complete, summed_is_whole = _complete_on_each_rank(p["t"])
        incomplete = [k for k, ok in complete.items() if not ok] or ["d"]
        assert summed_is_whole and incomplete == [right] == ["b"], (p, complete)


def test_08_which_axis_is_the_change_that_halves_one_layers_activations():
    act = mt.calc.activation_bytes_per_layer
    for _, p, right in asked("08.which-axis"):
        cfg = mt.GPTConfig.llama(vocab_size=128256, seq_len=p["s"], n_layer=80, n_head=64,
                                 n_kv_head=8, d_model=8192)  # Llama 3 70B's layer: 8 K/V heads
        now = act(cfg, 1, tp=8, sp=True, recompute="selective")
        longer = act(dataclasses.replace(cfg, seq_len=2 * p["s"]), 1, tp=8, sp=True,
                     recompute="selective")
        assert longer == 2 * now  # no s × s term left for a fused kernel (c) to remove
        after = {"a": act(cfg, 1, tp=16, sp=True, recompute="selective"),  # K/V copied
                 "b": act(cfg, 1, tp=8, sp=True, recompute="selective", cp=2),
                 "c": now, "d": now}  # (d): each rank still runs one whole sequence
        halves = [k for k, b in after.items() if b == now / 2]
        assert halves == [right] == ["b"], (p, {k: b / now for k, b in after.items()})


def test_19_sixteen_bytes_is_the_states_torch_holds():
    weight = torch.zeros(8, dtype=torch.bfloat16)           # what the matmuls read
    master = torch.zeros(8, dtype=torch.float32, requires_grad=True)
    grad = torch.zeros(8, dtype=torch.float32)              # accumulated in fp32
    master.grad = grad
    adam = torch.optim.Adam([master])
    adam.step()
    held = [weight, grad, master, *adam.state[master].values()]
    per_param = sum(v.numel() * v.element_size() for v in held if v.dim()) / 8
    options = {"a": 16, "b": 18, "c": 14}
    for q, p, right in asked("20.sixteen-bytes"):
        assert [k for k, b in options.items() if b == per_param] == [right], (p, per_param)
        assert f"{per_param * p['billions']:,.0f} GB" in q.text(p)  # billions × bytes = GB
