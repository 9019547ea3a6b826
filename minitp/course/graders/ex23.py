"""Checks for ex23: expert parallelism's dispatch and combine.

One launch of 4 ranks, in float64. First the learner's `dispatch_and_combine`
alone, at ep = 4 (the whole world; E = 8 experts, 2 per rank, top-2, some
assignments dropped, gates not 1): every rank knows every rank's tokens and
routing, so it knows what each step of its run should hold, and checks:

* the split sizes: a counts exchange (an all-to-all of integers) before the
  rows move; the dispatch's splits (send: rows for each rank's experts; recv:
  rows from each rank) and the combine's, swapped. Every all-to-all is watched:
  the ranks compare their splits before it runs, so splits that do not match
  stop every rank with a diagnosis, never a hang;
* the output equals the one-device layer's (`minitp.model.moe.LocalDispatch` with all
  E experts). If not, the first step that went wrong is named: the rows sent,
  the results sent back (the regroup not undone, or undone by itself), the
  un-permute (by `order` rather than its inverse) or the gates (forgotten, or
  applied twice);
* the gradients of the tokens, the gates and this rank's experts equal one
  device's (backward runs through the learner's all-to-alls).

Then the function is installed as every MoE layer's dispatch of a GPT made by
`parallelize` on ``Mesh(dp=4, ep=2)`` (E = 4, 2 per rank), and one AdamW step's
loss and every parameter after it must equal the plain GPT's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...data_parallel import make_optimizer
from ...expert_parallel import shard_experts, source_to_expert_major
from ...model import GPT, GPTConfig
from ...model.moe import Experts, LocalDispatch, moe_layers, permute
from ...parallelize import parallelize
from ...runtime import comm
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh, world
from ...step import train_step
from .base import Check, run_per_size

WORLD = 4
E, D, K, N = 8, 4, 2, 6  # experts, width, top-k, tokens per rank (the function alone)
MODEL = dict(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=8, n_experts=4, top_k=2)
TOLERANCE = 1e-12  # float64
STEP_TOLERANCE = 1e-10
TIMEOUT = 30.0
STEP_CHECK = True  # the training step on Mesh(dp=4, ep=2) (its tests may leave it out)
NAMES = ["ep=4: counts exchanged, rows dispatched and combined with the right split sizes",
         "ep=4: the output equals the one-device layer's",
         "ep=4: the gradients of the tokens, the gates and this rank's experts equal one device's",
         "dp=4, ep=2: a training step of the MoE GPT equals one device's"]
REFUSED = "not checked: the all-to-alls' split sizes do not match (see above)"
ELSEWHERE = "the results that came back are not this rank's rows'"


class _Refused(Exception):
    """The ranks' splits for one all-to-all do not match: every rank stops here."""


class _Watch:
    """Every all-to-all and counts exchange while active; the splits of each compared
    over the ranks before it runs. ``record``: keep the calls (the function alone)."""

    def __init__(self):
        self.calls, self.record = [], False

    def __enter__(self):
        self._originals = a2a, exchange = comm.all_to_all, comm.exchange_counts

        def all_to_all(x, axis, send_splits, recv_splits=None):
            send = [int(s) for s in send_splits]
            recv = None if recv_splits is None else [int(s) for s in recv_splits]
            call = {"kind": "rows" if x.is_floating_point() else "counts", "send": send,
                    "recv": recv, "x": x.detach().clone()}
            if self.record:
                self.calls.append(call)
            problem = None
            if len(send) != axis.size or (recv is not None and len(recv) != axis.size):
                problem = "length"
            elif sum(send) != x.shape[0]:
                problem = "sum"
            everyone = [None] * axis.size
            dist.all_gather_object(everyone, (problem, send, recv), group=axis.group)
            if any(p for p, _, _ in everyone) or any(
                    r is not None and r[s] != everyone[s][1][i]
                    for i, (_, _, r) in enumerate(everyone) for s in range(axis.size)):
                call["problem"] = problem or "mismatch"
                raise _Refused
            out = a2a(x, axis, send_splits, recv_splits)
            call["out"] = out.detach().clone()
            return out

        def exchange_counts(counts, axis):
            got = exchange(counts, axis)
            if self.record:
                self.calls.append({"kind": "counts", "send": list(counts), "recv": got})
            return got

        comm.all_to_all, comm.exchange_counts = all_to_all, exchange_counts
        return self

    def __exit__(self, *exc):
        comm.all_to_all, comm.exchange_counts = self._originals


def _close(a, b) -> bool:
    return a is not None and a.shape == b.shape and (a - b).abs().max().item() <= TOLERANCE


def _in_rank(fn):
    """Runs on every rank: the learner's function alone, then in a MoE GPT."""
    axis, dev = world(), device()
    ep, r, local = axis.size, axis.rank, E // axis.size
    g = torch.Generator().manual_seed(3)
    tokens = torch.randn(ep * N, D, generator=g, dtype=torch.float64)
    skew = torch.arange(E).repeat(ep * N, 1) == (torch.arange(ep * N) * 3 % E).unsqueeze(1)
    experts = (torch.rand(ep * N, E, generator=g) + skew).topk(K).indices
    gates = torch.rand(ep * N, K, generator=g, dtype=torch.float64) + 0.5
    keep = torch.rand(ep * N, K, generator=g) > 0.2
    w = torch.randn(ep * N, D, generator=g, dtype=torch.float64)
    tokens, experts, gates, keep, w = (t.to(dev) for t in (tokens, experts, gates, keep, w))
    torch.manual_seed(0)
    full = Experts(E, D, bias=True).double().to(dev)
    with torch.no_grad():
        for p in full.parameters():
            p.normal_(0, 0.5)
    shard = shard_experts(full, axis)
    # one device: every rank's tokens, all E experts
    ref_t, ref_g = tokens.clone().requires_grad_(), gates.clone().requires_grad_()
    ref_out = LocalDispatch()(ref_t, experts, ref_g * keep, keep, full, E)
    (ref_out * w).sum().backward()
    mine = slice(r * N, (r + 1) * N)
    t, gt = tokens[mine].clone().requires_grad_(), gates[mine].clone().requires_grad_()
    with _Watch() as watch:
        watch.record = True
        try:
            out = fn(t, experts[mine], gt * keep[mine], keep[mine], shard, axis, E)
        except _Refused:
            out = None
        watch.record = False
        plan = _plan(tokens, experts, keep, gates, full, ep, r)
        checks = [_splits(watch.calls, plan, ep, r)]
        if out is None:
            return {"checks": checks + [(False, REFUSED, "", None)] * 3}
        checks.append(_output(out, ref_out[mine], watch.calls, plan, r))
        crash = None
        try:
            (out * w[mine]).sum().backward()
        except RuntimeError as error:
            crash = str(error).strip().splitlines()[0]
        grads = {"tokens": (t.grad, ref_t.grad[mine]), "gates": (gt.grad, ref_g.grad[mine])}
        for name, p in shard.named_parameters():
            grads[f"experts.{name}"] = (p.grad, getattr(full, name).grad[r * local:][:local])
        checks.append(_gradients(checks[1][0], crash, grads, r))
        checks.append(_step(fn, dev) if STEP_CHECK else (False, "not run", "", None))
    return {"checks": checks}


def _plan(tokens, experts, keep, gates, full, ep, r) -> dict:
    """What rank r's run should hold at each step, and what the usual mistakes give."""
    local, mine = E // ep, slice(r * N, (r + 1) * N)
    parts = [permute(tokens[s * N:(s + 1) * N], experts[s * N:(s + 1) * N],
                     keep[s * N:(s + 1) * N], E) for s in range(ep)]
    tables = [counts.view(ep, local) for _, counts, _, _ in parts]
    arrived = torch.stack([tables[s][r] for s in range(ep)])
    got = torch.cat([rows.split(tables[s].sum(1).tolist())[r]
                     for s, (rows, _, _, _) in enumerate(parts)])
    regroup = source_to_expert_major(arrived)
    padded = [0] * (r * local) + arrived.sum(0).tolist() + [0] * ((ep - r - 1) * local)
    rows, counts, order, token_of = parts[r]
    g = (gates[mine] * keep[mine])[keep[mine]]
    with torch.no_grad():
        expert_major = full(got[regroup], padded)
        plan = {"send": tables[r].sum(1).tolist(), "recv": arrived.sum(1).tolist(),
                "rows": rows, "gated rows": rows * g[order].unsqueeze(1),
                "combine": expert_major[_inverse(regroup)],
                "expert-major": expert_major, "regrouped twice": expert_major[regroup],
                "unsorted": full(got, padded), "back": full(rows, counts.tolist()),
                "order": order, "token_of": token_of, "g": g}
    return plan


def _inverse(perm):
    out = torch.empty_like(perm)
    out[perm] = torch.arange(perm.numel(), device=perm.device)
    return out


def _splits(calls, plan, ep, r):
    send, recv = plan["send"], plan["recv"]
    rows = [c for c in calls if c["kind"] == "rows"]
    before = calls[:calls.index(rows[0])] if rows else calls
    exchanged = any(c["kind"] == "counts" for c in before)
    if not rows:
        return (False, f"rank {r} sent no rows by all-to-all", "send the rows with all_to_all "
                "(minitp.expert_parallel), split by destination rank", None)
    d = rows[0]
    if len(d["send"]) == E != ep:
        return (False, f"rank {r}'s dispatch had {E} send splits {d['send']}: one per expert, "
                f"where an all-to-all takes one per rank ({ep})", "the rows for all of rank "
                "j's experts go in one run: one split per rank, the sum of its experts' "
                "counts", None)
    if d["send"] != send:
        return (False, f"rank {r} sent {d['send']} rows to ranks 0..{ep - 1}; its rows for "
                f"each rank's experts are {send}", "how many of this rank's rows "
                "are for rank j's experts?", None)
    if d["recv"] is not None and d["recv"] != recv:
        if not exchanged and d["recv"] == d["send"]:
            return (False, f"the counts exchange is missing: rank {r} assumed it receives what "
                    f"it sends ({d['send']} rows); the ranks send it {recv}", "only the "
                    "senders know what they send: all-to-all the counts table first, and "
                    "take recv from what arrives", None)
        return (False, f"rank {r} expected {d['recv']} rows from ranks 0..{ep - 1}; they send "
                f"it {recv}", "how many rows does rank s send this "
                "rank, and how did this rank learn it?", None)
    if not exchanged:
        return (False, f"rank {r} sent rows before any counts exchange", "exchange the counts "
                "table (an all-to-all of integers) before the rows", None)
    if len(rows) < 2:
        return (False, f"rank {r} made one all-to-all of rows: the results never went back",
                "all_to_all the experts' results back, the splits swapped", None)
    c = rows[1]
    if c["send"] == send and c["recv"] in (recv, None) and send != recv:
        return (False, f"rank {r}'s combine used the dispatch's splits (send {send}, recv "
                f"{recv}): not swapped", "each rank returns to rank s the recv[s] rows it got "
                "from it: the combine sends by recv and receives by send", None)
    if c["send"] != recv or c["recv"] not in (send, None):
        return (False, f"rank {r}'s combine sent {c['send']} and expected {c['recv']}; it "
                f"should send {recv} and receive {send}", "the combine is the dispatch "
                "reversed: its splits swapped", None)
    return (True, f"rank {r}: counts exchanged, then {send} rows sent, {recv} received, and "
            "back", "", None)


def _output(out, expected, calls, plan, r):
    if not isinstance(out, torch.Tensor) or out.shape != expected.shape:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return (False, f"rank {r} returned {shape}, expected {tuple(expected.shape)}",
                "return one row per token: (N, C)", None)
    error = (out.detach() - expected).abs().max().item()
    if error <= TOLERANCE:
        return (True, f"largest error {error:.1e}", "", error)
    why, hint = _diagnosis(out.detach(), calls, plan)
    # named: the rank whose own step went wrong, rather than one that got wrong rows back
    return (False, f"rank {r}: largest error {error:.3g}" + (f": {why}" if why else ""),
            hint, error, bool(why) and not why.startswith(ELSEWHERE))


def _diagnosis(out, calls, plan):
    """The first step whose tensor differs from what it should be, and which mistake it is."""
    rows = [c for c in calls if c["kind"] == "rows"]
    if rows and not _close(rows[0]["x"], plan["rows"]):
        if _close(rows[0]["x"], plan["gated rows"]):
            return ("the rows were weighted by their gates before the experts", "an expert "
                    "is not linear: the gate multiplies its output, once, after the combine")
        return ("the rows sent are not the token rows sorted by expert", "which of this "
                "rank's rows does each rank need, and in what order?")
    if len(rows) > 1 and not _close(rows[1]["x"], plan["combine"]):
        x = rows[1]["x"]
        for key, why, hint in [
            ("expert-major", "the results went back grouped by expert: the regroup was not "
             "undone", "row i of the combine must be the result of the i-th row that arrived: "
             "index the experts' output by the regroup's inverse"),
            ("regrouped twice", "the results were permuted by the regroup again, not by its "
             "inverse", "out[regroup] applies the regroup twice; out[inverse(regroup)] undoes "
             "it"),
            ("unsorted", "the experts ran on the rows as they arrived, grouped by source rank",
             "regroup them expert-major first: sort the rows that arrived by local expert, "
             "stably")]:
            if _close(x, plan[key]):
                return why, hint
        return ("the combine sent other values than the experts' results, in the order the "
                "rows arrived", "which rows does each expert run on, and in which order must "
                "its results go back?")
    if len(rows) > 1 and not _close(rows[1]["out"], plan["back"]):
        return (f"{ELSEWHERE}: another rank sent back other values than its experts' results",
                "row i of the combine must be the result of the i-th row that arrived")
    back = rows[1]["out"] if len(rows) > 1 else plan["back"]
    order, token_of, g = plan["order"], plan["token_of"], plan["g"].unsqueeze(1)
    for why, placed, weight, hint in [
        ("un-permuted by order, not by its inverse", back[order], g, "row i of back is "
         "assignment order[i]: assignment a is row inverse(order)[a]"),
        ("not un-permuted", back, g, "back's rows are sorted by expert: put them back in "
         "assignment order (the inverse of order) before summing into the tokens"),
        ("the gates are forgotten", back[_inverse(order)], 1.0, "weight each expert's output "
         "by its gate, gates[keep]"),
        ("the outputs were weighted by their gates twice", back[_inverse(order)], g * g,
         "the gate multiplies each expert's output once")]:
        guess = out.new_zeros(out.shape).index_add(0, token_of, placed * weight)
        if _close(out, guess):
            return why, hint
    return "", ("which token is each returned row's, and with what weight? A token's "
                "results are summed")


def _gradients(forward_ok, crash, grads, r):
    if not forward_ok:
        return (False, "not checked: the output is wrong (see above)", "", None)
    if crash:
        return (False, f"rank {r}: backward failed: {crash}", "the output carries no gradient: "
                "mt.comm.all_to_all carries none; send the rows with all_to_all "
                "(minitp.expert_parallel), which does", None)
    worst, where = 0.0, ""
    for name, (got, want) in grads.items():
        if got is None:
            return (False, f"rank {r}: {name}.grad is None", "no gradient came back through "
                    "the all-to-alls: send the rows with all_to_all (minitp.expert_parallel), "
                    "not mt.comm.all_to_all, and keep them attached to the graph", None)
        error = (got - want).abs().max().item()
        if error > worst:
            worst, where = error, name
    if worst > TOLERANCE:
        return (False, f"rank {r}, {where}.grad: largest error {worst:.3g}", "the forward is "
                "right: is any tensor detached, or are the splits of backward's all-to-all "
                "not the forward's, swapped?", worst)
    return (True, f"largest error {worst:.1e}", "", worst)


class _Learners(LocalDispatch):
    """A MoE layer's dispatch that calls the learner's function."""

    def __init__(self, axis, fn):
        super().__init__()
        self.axis, self.fn = axis, fn

    def forward(self, tokens, experts, gates, keep, expert_module, n_experts):
        return self.fn(tokens, experts, gates, keep, expert_module, self.axis, n_experts)


def _step(fn, dev):
    mesh = Mesh(dp=4, ep=2)
    cfg = GPTConfig(**MODEL)
    torch.manual_seed(0)
    ref = GPT(cfg).double().to(dev)
    model = parallelize(ref, mesh)
    for layer in moe_layers(model):
        layer.dispatch = _Learners(mesh.ep, fn)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = make_optimizer(model, mesh, torch.optim.AdamW, lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, cfg.vocab_size, (8, cfg.seq_len), generator=g).to(dev)
            for _ in range(2))
    _, ref_loss = ref(x, y)
    ref_loss.backward()
    ref_opt.step()
    try:
        loss = train_step(model, (x, y), mesh, opt)
    except _Refused:
        return (False, "the all-to-alls' split sizes do not match in the model", "", None)
    error = abs(loss - ref_loss.item())
    if error > STEP_TOLERANCE:
        return (False, f"the loss differs from one device's by {error:.3g}", "", error)
    dense = model.full_state_dict()
    worst, name = max(((dense[n] - p.detach()).abs().max().item(), n)
                      for n, p in ref.named_parameters())
    if worst > STEP_TOLERANCE:
        return (False, f"after the step, {name} differs by {worst:.3g}", "", worst)
    return (True, f"loss and every parameter after an AdamW step: largest error "
            f"{max(error, worst):.1e}", "", max(error, worst))


def run(module) -> list[Check]:
    def launch_at(n):
        return launch(_in_rank, n, module.dispatch_and_combine, timeout=TIMEOUT)

    return run_per_size((WORLD,), lambda n: list(NAMES), launch_at, _judge,
                        what="dispatch_and_combine", size="n")


def _judge(n, names, per_rank) -> list[Check]:
    checks = []
    for i, name in enumerate(names):
        results = [r["checks"][i] for r in per_rank]
        failed = [(rank, res) for rank, res in enumerate(results) if not res[0]]
        if not failed:  # the numbers: the largest error over the ranks
            errors = [res[3] for res in results if res[3] is not None]
            worst = max(errors) if errors and i in (1, 2) else None
            detail = results[0][1] if worst is None else f"largest error {worst:.1e}"
            checks.append(Check(name, True, detail, max_error=worst))
            continue
        # the first rank that names its mistake, else the first that failed
        rank, (_, detail, hint, error, *_) = max(
            failed, key=lambda item: (len(item[1]) > 4 and item[1][4], -item[0]))
        checks.append(Check(name, False, detail, rank=rank, max_error=error, hint=hint))
    return checks
