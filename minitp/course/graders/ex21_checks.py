"""ex21 in the parent: the five checks from what every rank found (ex21_rank.py): the
numbers, the memory after each forward and during backward, the collectives, the
accumulation over two micro-batches. A failed backward is named by autograd's message.
"""

from __future__ import annotations

from .base import Check
from .ex21_rank import UNITS

TOLERANCE = 1e-12  # float64
FREED = "out of bounds for storage of size 0"  # autograd reading a freed saved view
WRITTEN = "modified by an inplace operation"  # autograd's version check


def _crash(name, per_rank) -> Check | None:
    for rank, r in enumerate(per_rank):
        for k, s in enumerate(r["steps"]):
            if not s["crash"]:
                continue
            where = f"step {k + 1}, rank {rank}"
            refills = sum(op == "all_gather" and phase == "bwd" for op, phase, _ in s["ops"])
            if FREED in s["crash"] and not refills:
                return Check(name, False, f"{where}: backward read a saved view of the "
                             "parameters while their storage held 0 bytes: nothing refilled "
                             "it before the unit's backward", rank=rank, tensor="saved views",
                             hint="the refill must run after the forward and before the first "
                                  "of the unit's backward nodes: when the gradient of the "
                                  "unit's output arrives (a hook on its input fires too late)")
            if FREED in s["crash"]:
                return Check(name, False, f"{where}: backward gathered again, but a saved "
                             "view of the parameters still saw a storage of 0 bytes: the "
                             "refill went somewhere else", rank=rank, tensor="saved views",
                             hint="the saved views point into full's own storage: give that "
                                  "storage its bytes back and write the values into it; a new "
                                  "tensor (full.data = ..., full = ...) leaves them on the "
                                  "freed one")
            if WRITTEN in s["crash"]:
                return Check(name, False, f"{where}: autograd refused a saved view of the "
                             "parameters: the refill counted as an in-place write (its "
                             "version went up)", rank=rank, tensor="saved views",
                             hint="autograd counts every in-place write to a tensor it "
                                  "saved, under torch.no_grad() too, and refuses the tensor "
                                  "after one; the refill changes no value: write the same "
                                  "storage through a tensor autograd does not watch")
            return Check(name, False, f"{where}: backward raised RuntimeError: {s['crash']}",
                         rank=rank, hint="read the message: backward fails where a saved "
                                         "tensor is read")
    return None


def _numbers(name, per_rank) -> Check:
    worst = 0.0
    for rank, r in enumerate(per_rank):
        for k, s in enumerate(r["steps"]):
            where = f"step {k + 1}, rank {rank}"
            errors = dict(s["error"])
            for u, error in enumerate(s["grad"]):
                if error is None:
                    return Check(name, False, f"{where}: unit {u}'s shard has no gradient of "
                                 "its shape", rank=rank, tensor="shard.grad",
                                 hint="keep GatherParams as given: its backward returns the "
                                      "shard's gradient")
                errors[f"shard gradient of unit {u}"] = error
            tensor, error = max(errors.items(), key=lambda item: item[1])
            if error > TOLERANCE:
                why = (": the forward is right, so backward read other values than the "
                       "forward's" if errors["output"] <= TOLERANCE else "")
                return Check(name, False, f"{where}, the {tensor}: largest error "
                             f"{error:.3g}{why}", rank=rank, tensor=tensor, max_error=error,
                             hint="the refill must bring back exactly the values the forward "
                                  "used (every rank's shard, in rank order); storage given "
                                  "its bytes back holds garbage until they are written")
            worst = max(worst, error)
    return Check(name, True, f"largest error {worst:.1e}", max_error=worst)


def _after_forward(name, per_rank) -> Check:
    for rank, r in enumerate(per_rank):
        whole = r["padded"] * r["e"]
        for k, s in enumerate(r["steps"]):
            for u, held in enumerate(s["after_fwd"]):
                if held:
                    return Check(name, False, f"step {k + 1}, rank {rank}: {held} bytes of "
                                 f"gathered parameters still held after unit {u}'s forward "
                                 f"(the whole vector is {whole} bytes)", rank=rank,
                                 tensor="gathered parameters",
                                 hint="autograd saved views of the vector and keeps them "
                                      "alive: `del` drops only your name. Free the memory "
                                      "they all point to")
    return Check(name, True, "between a unit's forward and its backward each rank held "
                 "its shards only (the saved views alive, their storage empty)")


def _in_backward(name, per_rank) -> Check:
    for rank, r in enumerate(per_rank):
        for k, s in enumerate(r["steps"]):
            where = f"step {k + 1}, rank {rank}"
            # backward reaches the units last to first: the i-th reduce-scatter is unit -i-1's
            for i, held in enumerate(s["held"][:UNITS]):
                unit = UNITS - 1 - i
                for other, nbytes in enumerate(held):
                    if other == unit or not nbytes:
                        continue
                    if other > unit:
                        return Check(name, False, f"{where}: unit {other} still held {nbytes} "
                                     f"bytes while unit {unit}'s gradient was reduce-scattered:"
                                     f" not freed after its own backward", rank=rank,
                                     tensor="gathered parameters", hint=FREE_AGAIN)
                    never = bool(s["after_fwd"][other])
                    why = ("never freed after its forward" if never
                           else "refilled before backward reached it")
                    return Check(name, False, f"{where}: unit {other} held {nbytes} bytes "
                                 f"while unit {unit}'s gradient was reduce-scattered: {why}",
                                 rank=rank, tensor="gathered parameters",
                                 hint="free the vector after the unit's forward (the check "
                                      "above)" if never else "refill a unit when the gradient "
                                      "of its output arrives, not sooner: two units gathered "
                                      "at once is the memory ZeRO-3 exists to save")
            if s["after_bwd"]:
                return Check(name, False, f"{where}: {s['after_bwd']} bytes of gathered "
                             "parameters still held after backward", rank=rank,
                             tensor="gathered parameters", hint=FREE_AGAIN)
    return Check(name, True, "at each unit's reduce-scatter no other unit was gathered; "
                 "none after backward")


FREE_AGAIN = ("free the vector again once the unit's backward is over: when GatherParams' "
              "backward runs, every node that read the vector has run")


def _collectives(name, per_rank) -> Check:
    for rank, r in enumerate(per_rank):
        whole = r["padded"] * r["e"]
        for k, s in enumerate(r["steps"]):
            where = f"step {k + 1}, rank {rank}"
            ops = s["ops"]
            fwd = [op for op, phase, _ in ops if phase == "fwd"]
            bwd = [op for op, phase, _ in ops if phase == "bwd"]
            if fwd != ["all_gather"] * UNITS:
                return Check(name, False, f"{where}: forward made {fwd or 'no collective'}; "
                             f"expected one all_gather per unit ({UNITS})", rank=rank,
                             hint="keep the forward's GatherParams as given: one gather per "
                                  "unit, nothing else")
            refills = bwd.count("all_gather")
            if refills == 0:
                return Check(name, False, f"{where}: backward made no all_gather: the "
                             "parameters were kept from the forward, not gathered again",
                             rank=rank, hint="free the vector after the forward and refill "
                                             "it when backward reaches the unit")
            if refills != UNITS:
                return Check(name, False, f"{where}: backward made {refills} all_gathers for "
                             f"{UNITS} units: refill each unit once", rank=rank,
                             hint="one refill per unit per backward: one hook, on the "
                                  "unit's output")
            if bwd.count("reduce_scatter") != UNITS or len(bwd) != 2 * UNITS:
                return Check(name, False, f"{where}: backward made {bwd}; expected per unit "
                             "one all_gather and one reduce_scatter", rank=rank,
                             hint="the refill is the only collective you add")
            sizes = sorted({nbytes for _, _, nbytes in ops})
            if sizes != [whole]:
                return Check(name, False, f"{where}: collectives of {sizes} bytes; expected "
                             f"the whole padded vector, {whole} bytes, each time", rank=rank,
                             hint="refill by gathering every rank's shard, as the forward did")
    return Check(name, True, f"{UNITS} units x (1 + 1 all-gathers, 1 reduce-scatter) a step: "
                 "3 collectives of the unit's values, where data parallelism makes 1 all-reduce")


def _accumulation(name, per_rank) -> Check:
    for rank, r in enumerate(per_rank):
        a = r["accumulate"]
        where = f"rank {rank}, both forwards done"
        if a["crash"] and FREED in a["crash"]:
            return Check(name, False, f"{where}: micro-batch {a['micro']}'s backward read a "
                         "saved view of the parameters while their storage held 0 bytes: "
                         "the refill did not fill the vector this forward gathered",
                         rank=rank, tensor="saved views",
                         hint="with two forwards before the backwards a unit has two "
                              "gathered (and freed) vectors at once: each backward must refill "
                              "the `full` of its own forward, the one its hook captured, not "
                              "one kept on the unit (self.full is the latest forward's)")
        if a["crash"] and WRITTEN in a["crash"]:
            return Check(name, False, f"{where}: micro-batch {a['micro']}'s backward: "
                         "autograd refused a saved view of the parameters (written in place "
                         "since it was saved)", rank=rank, tensor="saved views",
                         hint="write the refill through a tensor autograd does not watch")
        if a["crash"]:
            return Check(name, False, f"{where}: micro-batch {a['micro']}'s backward raised "
                         f"RuntimeError: {a['crash']}", rank=rank,
                         hint="each backward must find its own forward's vector refilled")
        if a["error"] is None:
            return Check(name, False, f"rank {rank}: after two backwards unit "
                         f"{a['shape']}'s shard has no gradient of its shape", rank=rank,
                         tensor="shard.grad", hint="keep GatherParams as given: its backward "
                         "returns the shard's gradient, and autograd adds it to shard.grad")
        u, error = max(enumerate(a["error"]), key=lambda item: item[1])
        if error > TOLERANCE:
            only = next((k + 1 for k, e in enumerate(a["alone"]) if e <= TOLERANCE), None)
            if only:
                return Check(name, False, f"rank {rank}: after two backwards the shards' "
                             f"gradients are micro-batch {only}'s alone: the other "
                             "backward's were overwritten, not accumulated", rank=rank,
                             tensor="shard.grad", max_error=error,
                             hint="autograd adds each backward's gradient into shard.grad; "
                                  "set or clear .grad nowhere in the unit (the optimizer "
                                  "clears it after the step)")
            return Check(name, False, f"rank {rank}: unit {u}'s shard gradient after two "
                         f"backwards: largest error {error:.3g} from the sum of both "
                         "micro-batches' plain gradients", rank=rank, tensor="shard.grad",
                         max_error=error,
                         hint="each backward must read exactly its own forward's values: "
                              "refill the vector its forward gathered, every rank's shard in "
                              "rank order")
        if a["after_bwd"]:
            return Check(name, False, f"rank {rank}: {a['after_bwd']} bytes of gathered "
                         "parameters still held after both backwards", rank=rank,
                         tensor="gathered parameters", hint=FREE_AGAIN)
    worst = max(max(r["accumulate"]["error"]) for r in per_rank)
    return Check(name, True, f"both forwards, then both backwards: the shards' gradients "
                 f"the plain blocks' sum (largest error {worst:.1e}); nothing held after",
                 max_error=worst)
