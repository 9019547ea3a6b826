"""Checks for ex14: what each rank writes and reads when a ZeRO-1, tp = 2 checkpoint is
loaded at tp = 1 (lesson 14), in the format of `minitp.checkpoint.sharded`: one file per
rank, each element written once, by the lowest global rank that holds it.

The reference is built from minitp's own layout, not from the exercise's arithmetic: a
plain GPT whose every element holds its own number is sharded by the tensor-parallel plan
(`minitp.tensor_parallel.plan.apply_tensor_parallel`, on an axis of the grader's making:
building the layers slices, it sends nothing) and each tp rank's parameters are cut by
ZeRO-1's own `FlatShard`; the numbers read back say which ranks hold each element, the
lowest of them writes it. The new layout (tp 1, ZeRO-1 over dp) is `FlatShard` over the
plain GPT's parameters. No process is launched.

On two models and layouts (tp 2, dp 2 → tp 1, dp 4, the lesson's; and tp 2, dp 3 → tp 1,
dp 2, with padding in every flat vector):

* tp_block: each tp rank's block of every parameter;
* state_owner: the rank that writes each element's Adam state;
* writes: each old rank writes exactly its reference file (every element once);
* reads: each new rank gets its whole model and its ZeRO-1 shard, each element from the
  file that holds it;
* reads: only the bytes it needs, each once (counted in float32).

Named slips: the split taken on the wrong dimension; a state placed in the wrong dp
rank's shard; a holder that is not the lowest; a replica (another dp rank, or for a
replicated parameter another tp rank) writing what another already wrote; every dp rank
writing all of its tp rank's optimizer state; every rank reading whole files.
"""

from __future__ import annotations

import copy
import functools
import math
from collections import namedtuple

import torch

from ...data_parallel.zero_stage1 import FlatShard
from ...model import GPT, GPTConfig
from ...runtime.mesh import Axis
from ...sharding.tags import tag
from ...tensor_parallel.plan import apply_tensor_parallel
from .base import Check

Param = namedtuple("Param", "name shape rule")
BYTES = 4  # float32 state
STATE = ("exp_avg", "exp_avg_sq")
NAMES = ["tp_block: each tp rank's block of every parameter (column, row, vocab, replicated)",
         "state_owner: the rank that writes each element's Adam state (the lowest holder)",
         "writes: each rank of the saving layout writes what it is the lowest holder of",
         "reads: each new rank gets its whole model and its ZeRO-1 shard, each element from "
         "a file that holds it",
         "reads: only the bytes it needs, each once"]
CASES = (  # (label, config, old tp, old dp, new dp)
    ("a 1-layer GPT, tp 2, dp 2 -> tp 1, dp 4",
     GPTConfig(vocab_size=64, seq_len=16, n_layer=1, n_head=2, d_model=8), 2, 2, 4),
    ("a 2-layer GPT, tp 2, dp 3 -> tp 1, dp 2",
     GPTConfig(vocab_size=48, seq_len=6, n_layer=2, n_head=2, d_model=12), 2, 3, 2),
)


def rank_file(r: int) -> str:
    return f"rank-{r}.bin"


# --------------------------------------------------------------------------- reference
class Layout:
    """One model's reference: its table, each tp rank's blocks, each file's elements."""

    def __init__(self, cfg: GPTConfig, tp: int, dp: int, new_dp: int):
        with torch.random.fork_rng(devices=[]):
            dense = GPT(cfg).to(torch.float64)
        self.first, start = {}, 0
        with torch.no_grad():
            for name, p in dense.named_parameters():
                self.first[name] = start
                p.copy_(torch.arange(start + 1, start + p.numel() + 1,
                                     dtype=torch.float64).view_as(p))
                start += p.numel()
        self.shapes = {n: tuple(p.shape) for n, p in dense.named_parameters()}
        self.blocks, rules = {}, {}  # (name, t) -> dense element numbers
        holders = {}  # (tensor, element) -> the global ranks that hold it
        for t in range(tp):
            model = copy.deepcopy(dense)
            apply_tensor_parallel(model, Axis("tp", tuple(range(tp)), t), False)
            params = list(model.parameters())
            for name, p in model.named_parameters():
                dim = tag(p, "tp_split_dim")
                rules[name] = ("vocab" if tag(p, "tp_true_size") is not None else
                               {0: "column", 1: "row", None: None}[dim])
                self.blocks[name, t] = self._elements(p)[1]
                for i in self.blocks[name, t].tolist():
                    holders.setdefault((f"model/{name}", i), set()).update(
                        d * tp + t for d in range(dp))
            for d in range(dp):
                shard = FlatShard(params, Axis("dp", tuple(range(dp)), d), mixed=False).shard
                for item in self._state(shard):
                    holders.setdefault(item, set()).add(d * tp + t)
        self.table = [Param(n, self.shapes[n], rules[n]) for n in self.shapes]
        self.tp, self.holders = tp, holders
        self.owner = {item: min(ranks) for item, ranks in holders.items()}
        self.files = {}
        for item, r in self.owner.items():
            self.files.setdefault(rank_file(r), set()).add(item)
        params = list(dense.parameters())
        self.needs = []  # per new dp rank: {(tensor, element)}
        for d in range(new_dp):
            shard = FlatShard(params, Axis("dp", tuple(range(new_dp)), d), mixed=False).shard
            model = {(f"model/{n}", i) for n, s in self.shapes.items()
                     for i in range(math.prod(s))}
            self.needs.append(model | self._state(shard))

    def _elements(self, values: torch.Tensor) -> tuple[list[str], torch.Tensor]:
        """(tensor name, dense element) of each value of the numbered model; padding dropped."""
        ids = values.detach().flatten().round().long() - 1
        ids = ids[ids >= 0]
        names = list(self.first)
        starts = torch.tensor([self.first[n] for n in names])
        which = torch.searchsorted(starts, ids, right=True) - 1
        return [names[k] for k in which.tolist()], ids - starts[which]

    def _state(self, shard: torch.Tensor) -> set:
        names, elements = self._elements(shard)
        return {(f"{key}/{n}", int(i)) for key in STATE
                for n, i in zip(names, elements.tolist(), strict=True)}

    @property
    def size(self) -> int:
        return sum(len(items) for items in self.files.values())


@functools.cache
def _layout(case: int) -> Layout:
    _, cfg, tp, dp, new_dp = CASES[case]
    return Layout(cfg, tp, dp, new_dp)


# --------------------------------------------------------------------------- running
class _Failed(Exception):
    """The learner's function failed or answered in the wrong form: the check's text."""

    def __init__(self, detail: str, hint: str):
        super().__init__(detail)
        self.detail, self.hint = detail, hint


def _call(function, *args):
    try:
        return function(*args)
    except NotImplementedError as exc:
        raise _Failed(f"{function.__name__} is not written yet", str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - the learner's bug, reported politely
        raise _Failed(f"{function.__name__}{args[1:] if len(args) > 1 else ''}: raised "
                      f"{type(exc).__name__}: {exc}", "run it by hand on the same arguments"
                      ) from None


def _items(answer, what: str) -> set:
    """{(file, tensor, element)} of a {file: {tensor: runs}} answer."""
    form = "return {file: {tensor: [(start, stop), ...]}}"
    if not isinstance(answer, dict):
        raise _Failed(f"{what} returned {type(answer).__name__}, not a dict", form)
    out = set()
    for f, tensors in answer.items():
        if not isinstance(tensors, dict):
            raise _Failed(f"{what}: {f!r} maps to {type(tensors).__name__}, not a dict", form)
        for tensor, spans in tensors.items():
            for span in spans:
                start, stop = span
                out.update((f, tensor, i) for i in range(int(start), int(stop)))
    return out


def _counted(answer, what: str) -> dict:
    """{(file, tensor, element): how many times it is named} of an answer."""
    counts = {}
    for f, tensors in answer.items():
        for tensor, spans in tensors.items():
            for start, stop in spans:
                for i in range(int(start), int(stop)):
                    counts[f, tensor, i] = counts.get((f, tensor, i), 0) + 1
    return counts


def run(module) -> list[Check]:
    return [_guard(NAMES[0], lambda: _check_blocks(module)),
            _guard(NAMES[1], lambda: _check_owners(module)),
            _guard(NAMES[2], lambda: _check_writes(module)),
            _guard(NAMES[3], lambda: _check_reads(module)),
            _guard(NAMES[4], lambda: _check_bytes(module))]


def _guard(name: str, check) -> Check:
    try:
        return check()
    except _Failed as failed:
        return Check(name, False, failed.detail, hint=failed.hint)


# --------------------------------------------------------------------------- the checks
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
