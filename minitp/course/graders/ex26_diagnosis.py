"""ex26 on each rank, judging its own run: what the rank should hold at each step of the
dispatch and combine (and what each usual mistake gives), and the checks of the split
sizes, the output and the gradients, as (passed, detail, hint, error) for the parent.
"""

from __future__ import annotations

import torch

from ...expert_parallel import source_to_expert_major
from ...model.moe import permute

E, D, K, N = 8, 4, 2, 6  # experts, width, top-k, tokens per rank (the function alone)
TOLERANCE = 1e-12  # float64
ELSEWHERE = "the results that came back are not this rank's rows'"


def _close(a, b) -> bool:
    return a is not None and a.shape == b.shape and (a - b).abs().max().item() <= TOLERANCE


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
