"""ex14's five checks, each against the reference layout (ex14_layout.py): the tp
blocks, the owners of the Adam state, the writes, the reads, the bytes read."""

from __future__ import annotations

import functools
import math

import torch

from .base import Check
from .ex14_answers import _call, _counted, _Failed, _items
from .ex14_layout import BYTES, CASES, _layout, rank_file

NAMES = ["tp_block: each tp rank's block of every parameter (column, row, vocab, replicated)",
         "state_owner: the rank that writes each element's Adam state (the lowest holder)",
         "writes: each rank of the saving layout writes what it is the lowest holder of",
         "reads: each new rank gets its whole model and its ZeRO-1 shard, each element from "
         "a file that holds it",
         "reads: only the bytes it needs, each once"]


def _check_blocks(module) -> Check:
    for case, (label, _cfg, tp, _dp, _new) in enumerate(CASES):
        ref = _layout(case)
        for p in ref.table:
            for t in range(tp):
                block = _call(module.tp_block, p.shape, p.rule, t, tp)
                try:
                    got = torch.arange(math.prod(p.shape)).view(*p.shape)[block].flatten()
                except Exception as exc:  # noqa: BLE001 - not a valid index: said so
                    raise _Failed(f"{label}: tp_block{(p.shape, p.rule, t, tp)} = {block!r} is "
                                  f"not a block of the tensor ({exc})",
                                  "return one slice per dimension") from None
                want = ref.blocks[p.name, t]
                if not torch.equal(got, want):
                    return Check(NAMES[0], False, f"{label}: {p.name} {p.shape} ({p.rule}), tp "
                                 f"rank {t}: {got.numel()} elements, not the "
                                 f"{want.numel()} minitp's layer holds",
                                 hint=_block_hint(p, t, tp, got))
    return Check(NAMES[0], True, f"{sum(len(_layout(c).table) for c in range(len(CASES)))} "
                 "parameters, every tp rank")


def _block_hint(p, t: int, tp: int, got: torch.Tensor) -> str:
    if p.rule is None:
        return ("a replicated parameter (a LayerNorm, the positions, a row-parallel bias) is "
                "whole on every tp rank")
    for dim in range(len(p.shape)):
        size = p.shape[dim] // tp
        block = [slice(None)] * len(p.shape)
        block[dim] = slice(t * size, (t + 1) * size)
        other = torch.arange(math.prod(p.shape)).view(*p.shape)[tuple(block)].flatten()
        if torch.equal(got, other):
            right = 1 if p.rule == "row" else 0
            return (f"that is the split along dim {dim}: a {p.rule}-parallel parameter is split "
                    f"along dim {right} (nn.Linear's weight is (out_features, in_features): a "
                    "column-parallel layer splits its outputs, a row-parallel one its inputs)")
    return (f"rank t of tp holds the t-th of tp equal, contiguous blocks along one dimension "
            f"({p.rule}: dim {1 if p.rule == 'row' else 0})")


def _where(r: int, tp: int) -> str:
    return f"rank {r} (tp {r % tp}, dp {r // tp})"


def _check_owners(module) -> Check:
    for case, (label, _cfg, tp, dp, _new) in enumerate(CASES):
        ref = _layout(case)
        for k, p in enumerate(ref.table):
            for i in range(math.prod(p.shape)):
                got = _call(module.state_owner, ref.table, k, i, tp, dp)
                want = ref.owner[f"exp_avg/{p.name}", i]
                if got != want:
                    return _owner_failed(label, ref, p, i, got, want)
    return Check(NAMES[1], True, "every element of every parameter, two layouts")


def _owner_failed(label, ref, p, i, got, want) -> Check:
    tp, holders = ref.tp, ref.holders[f"exp_avg/{p.name}", i]
    detail = (f"{label}: {p.name}[{i}] ({p.rule}): yours {got!r}, but "
              f"{_where(want, tp)} writes it")
    if isinstance(got, int) and got in holders:
        return Check(NAMES[1], False, f"{detail}: {_where(got, tp)} holds it too, but the lowest "
                     "holder writes it", hint="for a replicated parameter every tp rank holds its "
                     "state, each in the dp shard where its own flat vector puts it: take the "
                     "lowest global rank of those")
    if isinstance(got, int) and got % tp in {r % tp for r in holders}:
        return Check(NAMES[1], False, f"{detail}: the state placed in the wrong dp rank's shard",
                     hint="the dp rank is the element's position in its tp rank's flat vector "
                          "(that rank's blocks end to end, in the table's order) // s, s the "
                          "padded length / dp; a dense position, or a position in the "
                          "parameter alone, gives another")
    return Check(NAMES[1], False, detail, hint="find the tp ranks whose block holds the element, "
                 "then each one's dp shard that has it; the lowest global rank writes it")


def _check_writes(module) -> Check:
    for case, (label, _cfg, tp, dp, _new) in enumerate(CASES):
        ref = _layout(case)
        for r in range(tp * dp):
            answer = _call(module.writes, ref.table, r % tp, r // tp, tp, dp)
            mine = _items(answer, f"writes(table, {r % tp}, {r // tp}, {tp}, {dp})")
            want = {(rank_file(r), n, i) for n, i in ref.files.get(rank_file(r), ())}
            if mine != want:
                return _writes_failed(label, ref, r, mine, want)
    return Check(NAMES[2], True, f"{len(CASES)} layouts, every element written once")


def _writes_failed(label, ref, r, mine, want) -> Check:
    tp = ref.tp
    extra, missing = mine - want, want - mine
    where = f"{label}: {_where(r, tp)}"
    hint = ("each rank writes what it is the lowest holder of: the model blocks on dp rank 0 "
            "(replicated parameters on rank 0 only) and, of its ZeRO-1 shard, the state no "
            "lower rank holds")
    model = {(n, i) for _, n, i in extra if n.startswith("model/")}
    replicated = {n for n, _ in model if _rule(ref, n) is None}
    if model and r // tp > 0:
        detail = (f"{where} writes model blocks that rank {r % tp} (tp {r % tp}, dp 0) writes "
                  "too: a replica writing bytes another replica already wrote")
        hint = ("the dp ranks of one tp rank hold the same model block: the lowest of them "
                "(dp 0) writes it; the others write only their optimizer state")
    elif replicated:
        detail = (f"{where} writes the replicated {min(replicated)}, which rank 0 writes too: a "
                  "replica writing bytes another replica already wrote")
        hint = "a replicated parameter is held by every rank: rank 0, the lowest, writes it"
    elif _state(extra) and _state(mine) >= _all_state(ref, r % tp):
        detail = (f"{where} writes all of tp rank {r % tp}'s optimizer state "
                  f"({len(_state(mine)):,} elements): under ZeRO-1 it holds only its "
                  f"1/{_dp(ref)}")
        hint = ("ZeRO-1's shard on (tp t, dp d): elements [d·s, (d+1)·s) of tp rank t's flat "
                "vector, padded to a multiple of dp")
    else:
        detail = (f"{where} writes {len(extra):,} elements it should not and misses "
                  f"{len(missing):,}" + _example(extra, missing))
    return Check(NAMES[2], False, detail, hint=hint)


def _rule(ref, tensor: str):
    name = tensor.split("/", 1)[1]
    return next(p.rule for p in ref.table if p.name == name)


def _state(items) -> set:
    return {(n, i) for _, n, i in items if not n.startswith("model/")}


def _all_state(ref, t: int) -> set:
    """The state of tp rank t's split parameters, all its dp ranks' shards together."""
    return {item for item, ranks in ref.holders.items() if not item[0].startswith("model/")
            and _rule(ref, item[0]) is not None and any(r % ref.tp == t for r in ranks)}


def _dp(ref) -> int:
    return max(r for ranks in ref.holders.values() for r in ranks) // ref.tp + 1


def _example(extra, missing) -> str:
    parts = []
    if extra:
        f, n, i = min(extra)
        parts.append(f"e.g. {n}[{i}], not its to write")
    if missing:
        f, n, i = min(missing)
        parts.append(f"e.g. {n}[{i}] belongs in {f}")
    return " (" + "; ".join(parts) + ")"


@functools.lru_cache(maxsize=4)  # both reads checks ask for the same answers
def _learner_reads(module, case: int) -> list[dict]:
    _, _, tp, dp, new_dp = CASES[case]
    ref = _layout(case)
    answers = []
    for d in range(new_dp):
        answer = _call(module.reads, ref.table, d, tp, dp, new_dp)
        _items(answer, f"reads(table, {d}, {tp}, {dp}, {new_dp})")  # the form
        answers.append(answer)
    return answers


def _check_reads(module) -> Check:
    for case, (label, *_rest) in enumerate(CASES):
        ref = _layout(case)
        for d, answer in enumerate(_learner_reads(module, case)):
            got = _counted(answer, "reads")
            for (f, n, i) in sorted(got):
                if f not in ref.files or (n, i) not in ref.files[f]:
                    return _wrong_source(label, ref, d, f, n, i)
            missing = ref.needs[d] - {(n, i) for _, n, i in got}
            if missing:
                n, i = min(missing)
                return Check(NAMES[3], False, f"{label}: new rank {d} never reads "
                             f"{len(missing):,} elements it needs, e.g. {n}[{i}] (in "
                             f"{rank_file(ref.owner[n, i])})",
                             hint="the model whole (tp 1), and its ZeRO-1 slice of the dense "
                                  "flat vector, padded to a multiple of the new dp")
    return Check(NAMES[3], True, f"{len(CASES)} layouts, every new rank exact")


def _wrong_source(label, ref, d, f, n, i) -> Check:
    detail = f"{label}: new rank {d} asks {f} for {n}[{i}]"
    if (n, i) not in ref.owner:
        return Check(NAMES[3], False, detail + ", which no file holds",
                     hint="runs count the dense tensor's flat elements (row-major), from 0")
    right = ref.owner[n, i]
    detail += f", but {rank_file(right)} holds it"
    asked = int(f.removeprefix("rank-").removesuffix(".bin")) if f.startswith("rank-") else -1
    if not n.startswith("model/") and asked % ref.tp == right % ref.tp:
        return Check(NAMES[3], False, f"{detail}: the optimizer shard read from the wrong dp "
                     "rank", hint="the old dp rank is the element's position in its old tp "
                     "rank's flat vector // s (state_owner); the new shards do not nest "
                     "inside the old ones")
    return Check(NAMES[3], False, detail, hint="each element is in the file of the lowest rank "
                 "that held it: state_owner for the state; for the model, dp rank 0 of the tp "
                 "rank whose block has it (rank 0 for a replicated parameter)")


def _check_bytes(module) -> Check:
    shown = None
    for case, (label, *_rest) in enumerate(CASES):
        ref = _layout(case)
        for d, answer in enumerate(_learner_reads(module, case)):
            got = _counted(answer, "reads")
            twice = [k for k, c in got.items() if c > 1]
            extra = {(n, i) for _, n, i in got} - ref.needs[d]
            read = sum(got.values()) * BYTES
            need, whole = len(ref.needs[d]) * BYTES, ref.size * BYTES
            touched = {f for f, _, _ in got}
            if extra and all({(n, i) for g, n, i in got if g == f} == ref.files.get(f)
                             for f in touched):
                return Check(NAMES[4], False, f"{label}: new rank {d} reads {read:,} bytes of "
                             f"the checkpoint's {whole:,}; it needs {need:,}: every rank reads "
                             "the whole file", tensor="bytes", max_error=float(read - need),
                             hint="ask each file only for the runs this rank keeps: its ZeRO-1 "
                                  "slice of the optimizer state, not every rank's")
            if extra or twice:
                return Check(NAMES[4], False, f"{label}: new rank {d} reads {read:,} bytes, "
                             f"needs {need:,} ({len(extra):,} elements it does not keep, "
                             f"{len(twice):,} read twice)", tensor="bytes",
                             max_error=float(read - need),
                             hint="only this rank's slice of the state, and each run once")
            if shown is None:
                shown = f"new rank 0 reads {read:,} of the checkpoint's {whole:,} bytes"
    return Check(NAMES[4], True, shown or "")
