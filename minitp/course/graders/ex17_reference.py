"""ex17's reference: what the calculator says of a learner's plan — whether it is valid,
its memory and step time, the fastest plan `calc.plan` finds, and the justification
(with the usual slips, each named) the plan should give."""

from __future__ import annotations

from ... import calc
from ...calc.network.cluster import GiB
from ...rules import check_parallel_config
from .ex17_cases import KEYS, TOLERANCE

_PLANS = {}  # label -> calc.plan's answer: the same every time, and calc.plan is the slow part


def _reference(label, cfg, cluster, n_gpus, batch, cap):
    if label not in _PLANS:
        _PLANS[label] = calc.plan(cfg, cluster, batch, n_gpus, micro_batches=(1,),
                                  zero_stage=(0, 1, 2, 3), usable=cap * GiB / cluster.memory)
    return _PLANS[label]


def _describe(plan: dict) -> str:
    return " ".join(f"{key}={plan[key]}" for key in KEYS)


def _memory(cfg, n_gpus, batch, tp, pp, recompute, zero) -> dict:
    dp = n_gpus // (tp * pp)
    return calc.memory_per_gpu(cfg, 1, dp, pp, tp, tp > 1, recompute, zero, "megatron",
                               microbatches=batch // dp)


def _depths(cfg, n_gpus, tp, batch) -> list[int]:
    return [p for p in range(1, n_gpus // tp + 1) if cfg.n_layer % p == 0
            and n_gpus % (tp * p) == 0 and batch % (n_gpus // (tp * p)) == 0]


def _judge(case, plan) -> dict:
    """What the calculator says of one plan: why it is not valid, or its memory and time,
    and what its justification should say."""
    label, cfg, cluster, n_gpus, batch, cap = case
    result = {"label": label, "cap": cap}
    if not isinstance(plan, dict) or set(KEYS) - set(plan):
        missing = ", ".join(k for k in KEYS if not isinstance(plan, dict) or k not in plan)
        result["invalid"] = f"{label}: got {plan!r}, a dict without {missing}"
        return result
    result["plan"] = _describe(plan)
    dp, pp, tp, recompute, zero = (plan[k] for k in KEYS)
    sp = tp > 1 if isinstance(tp, int) else False
    try:
        check_parallel_config(cfg, dp=dp, pp=pp, tp=tp, sequence_parallel=sp,
                              recompute=recompute, zero_stage=zero, world_size=n_gpus)
        if batch % dp:
            raise ValueError(f"the global batch {batch} does not split over dp={dp} replicas")
    except ValueError as exc:
        result["invalid"] = f"{label}: {result['plan']}: {exc}"
        return result
    result["memory"] = _memory(cfg, n_gpus, batch, tp, pp, recompute, zero)
    result["time"] = calc.step_time(cfg, cluster, dp, pp, tp, 1, batch, sp, recompute,
                                    zero_stage=zero)
    result["zero"], result["pp"] = zero, pp
    reference = _reference(*case)
    result["best"] = reference.best
    result["needs zero"] = not any(  # no plan without ZeRO is fast enough: say so if slow
        c.zero_stage == 0 and c.time.total <= (1 + TOLERANCE) * reference.best.time.total
        for c in reference.candidates)
    if zero == 0 and dp > 1:  # what the same plan needs with the distributed optimizer
        result["with zero 1"] = _memory(cfg, n_gpus, batch, tp, pp, recompute, 1)["total"]
    result["why"] = plan.get("why")
    result["expected"] = _expected(case, plan)
    return result


def _expected(case, plan) -> dict:
    """The justification the calculator gives for this plan, and the usual slips."""
    label, cfg, cluster, n_gpus, batch, cap = case
    dp, pp, tp, recompute, zero = (plan[k] for k in KEYS)
    memory = _memory(cfg, n_gpus, batch, tp, pp, recompute, zero)
    shallower = [q for q in _depths(cfg, n_gpus, tp, batch) if q < pp]
    twice, m = 2 * tp, batch // dp
    stop = ("node" if twice > cluster.gpus_per_node
            else "heads" if cfg.n_head % twice else "cost")
    expected = {
        "memory_gib": memory["total"] / GiB,
        "memory slips": {
            "in GB (10^9 bytes), not GiB (2^30)": memory["total"] / 1e9,
            "in bytes, not GiB": memory["total"],
            "the model states alone, without the activations":
                (memory["total"] - memory["activations"]) / GiB,
            "the activations alone, without the model states": memory["activations"] / GiB,
        },
        "shallower": shallower[-1] if shallower else None,
        "shallower_gib": None,
        "shallower slips": {},
        "tp_stop": stop,
        "stop reason": (f"2·tp = {twice} GPUs, a node has {cluster.gpus_per_node}" if
                        stop == "node" else f"{cfg.n_head} heads do not divide by {twice}"
                        if stop == "heads" else f"{twice} GPUs fit in a node of "
                        f"{cluster.gpus_per_node} and divide the {cfg.n_head} heads"),
        "bubble": calc.bubble(pp, m),
        "bubble slips": {
            "(p - 1)/(m + p - 1), the bubble's share of the whole step; the fraction asked "
            "is of the busy time, (p - 1)/m": (pp - 1) / (m + pp - 1),
            f"m taken as the global batch {batch}; each replica runs m = {batch}/{dp} = "
            f"{m} microbatches": (pp - 1) / batch,
            "p/m: the bubble is (p - 1)/m, the first stage idles while p - 1 others fill":
                pp / m,
        },
    }
    if zero:
        expected["memory slips"][f"the plan without ZeRO-{zero} (18 bytes per parameter)"] = (
            _memory(cfg, n_gpus, batch, tp, pp, recompute, 0)["total"] / GiB)
    if shallower:
        q = shallower[-1]
        expected["shallower_gib"] = _memory(cfg, n_gpus, batch, tp, q, recompute,
                                            zero)["total"] / GiB
        slips = expected["shallower slips"]
        for rc in ("selective", "full", None):
            for z in range(4):
                if (rc, z) != (recompute, zero):
                    slips[f"pp={q} with recompute={rc} and ZeRO-{z}; keep the plan's "
                          f"recompute={recompute} and ZeRO-{zero}"] = _memory(
                        cfg, n_gpus, batch, tp, q, rc, z)["total"] / GiB
        deeper = [d for d in _depths(cfg, n_gpus, tp, batch) if d > pp]
        if deeper:
            slips[f"the deeper pipeline pp={deeper[0]}, not the shallower pp={q}"] = _memory(
                cfg, n_gpus, batch, tp, deeper[0], recompute, zero)["total"] / GiB
    return expected
