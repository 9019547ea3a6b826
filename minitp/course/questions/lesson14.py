"""Lesson 14's questions: how often a large job should save (Young's interval), the bytes one
rank writes to a sharded ZeRO-1 checkpoint, and what a synchronous and an asynchronous
save stall."""

from __future__ import annotations

from ...calc.reliability.checkpointing import job_mtbf_seconds, save_seconds, young_interval
from .form import Question, Wrong


def _distinct(q: Question) -> Question:
    """Keep the usual mistakes whose answers differ (within the question's tolerance) from
    the right one and from each other: some draws make two slips give one number."""
    values = [q.right(q.params)]

    def fresh(mistake: Wrong) -> bool:
        value = mistake.value(q.params)
        new = not any(q._same(value, v) for v in values)
        values.append(value)
        return new

    q.wrong = [w for w in q.wrong if fresh(w)]
    return q


def young(seed=None) -> Question:
    def draw(rng):
        return {"gpus": rng.choice((4096, 8192, 16384, 32768)),
                "gpu_mtbf_kh": rng.choice((25, 50, 100)),  # thousands of GPU-hours
                "gb": rng.choice((1, 2, 4)), "tbps": rng.choice((1, 2, 7))}

    def save(p, gpus=None):  # seconds: every GPU's bytes through the shared storage
        return save_seconds((gpus or p["gpus"]) * p["gb"] * 1e9, p["tbps"] * 1e12)

    def mtbf(p, gpus=None):
        return job_mtbf_seconds(gpus or p["gpus"], 1 / (p["gpu_mtbf_kh"] * 1000))

    def right(p):
        return young_interval(save(p), mtbf(p)) / 60

    return _distinct(Question(
        key="14.young", seed=seed, draw=draw,
        text=lambda p: (f"A job trains on {p['gpus']:,} GPUs. Each GPU fails, independently, "
                        f"about once every {p['gpu_mtbf_kh']},000 GPU-hours (Llama 3's run "
                        "saw about 50,000: 419 unexpected interruptions in 54 days on 16,384 "
                        "GPUs, arXiv:2407.21783 §3.3.4), and any one failure stops the whole "
                        f"job. A save writes {p['gb']} GB from every GPU to storage that takes "
                        f"{p['tbps']} TB/s in all. By Young's first-order model, how many "
                        "minutes of training should pass between saves? (Minutes; within "
                        "1%.)"),
        right=right,
        wrong=[
            Wrong(lambda p: young_interval(save(p), mtbf(p, 1)) / 60,
                  "that uses one GPU's MTBF: the job stops when any of its GPUs fails, so "
                  "its MTBF is the GPU's divided by the number of GPUs"),
            Wrong(lambda p: young_interval(save(p, 1), mtbf(p)) / 60,
                  "that is one GPU's bytes through the whole storage: every GPU writes at "
                  "once and they share the bandwidth"),
            Wrong(lambda p: right(p) / 2 ** 0.5, "Young's interval is √(2·C·M): the 2 "
                                                  "is missing"),
            Wrong(lambda p: right(p) * 60, "that is seconds: divide by 60 for minutes"),
        ],
        worked=lambda p: (
            f"the job's MTBF M = {p['gpu_mtbf_kh']},000 h / {p['gpus']:,} = "
            f"{mtbf(p) / 3600:.2f} h = {mtbf(p):,.0f} s; a save moves {p['gpus']:,} × "
            f"{p['gb']} GB at {p['tbps']} TB/s: C = {save(p):.1f} s. Young: τ = √(2·C·M) = "
            f"{right(p) * 60:,.0f} s = {right(p):.1f} min (a MODEL: Poisson failures; "
            "`mt.calc.young_interval`; Daly's higher-order estimate is a little shorter)."),
    ))


def zero1_writes(seed=None) -> Question:
    def draw(rng):
        return {"billions": rng.choice((7, 13, 70)), "t": rng.choice((2, 4, 8)),
                "d": rng.choice((4, 8, 16)), "dp_rank": rng.choice((0, 1))}

    def gb(p, model_copies=None, optim_share=None, tp=None):
        block = p["billions"] * 1e9 / (tp or p["t"])  # parameters in one tp block
        model = 4 * block * (model_copies if model_copies is not None else p["dp_rank"] == 0)
        optim = 8 * block * (optim_share or 1 / p["d"])
        return (model + optim) / 1e9

    return _distinct(Question(
        key="14.zero1-writes", seed=seed, draw=draw,
        text=lambda p: (f"A {p['billions']}B-parameter model trains with tensor parallelism "
                        f"t = {p['t']} (take every parameter as split over tp) and ZeRO-1 "
                        f"over d = {p['d']} data-parallel ranks, in fp32: 4 bytes a weight, "
                        "and Adam's exp_avg and exp_avg_sq, 4 bytes each. Its checkpoint is "
                        "sharded: every byte is written once, by one rank that holds it (the "
                        "first dp replica of each model block). How many GB (10^9 bytes) "
                        f"does rank (tp 0, dp {p['dp_rank']}) write? (GB; within 1%.)"),
        right=gb,
        wrong=[
            Wrong(lambda p: gb(p, model_copies=1),
                  "every dp replica writing its model block writes the same bytes d times: "
                  "only the first writes it"),
            Wrong(lambda p: gb(p, model_copies=0),
                  "the model block is written by dp rank 0 of each tp rank: that rank "
                  "writes it with its optimizer shard"),
            Wrong(lambda p: gb(p, optim_share=1),
                  "under ZeRO-1 a rank holds, and writes, only 1/d of its tp block's "
                  "optimizer state"),
            Wrong(lambda p: gb(p, tp=1), "a rank holds 1/t of the model: tensor parallelism "
                                         "splits every parameter first"),
        ],
        worked=lambda p: (
            f"a tp block is Ψ/t = {p['billions']}B/{p['t']} parameters. Its weights (4 bytes "
            "each) are the same on all d replicas: dp rank 0 writes them"
            + (", this rank" if p["dp_rank"] == 0 else ", not this one")
            + f"; its Adam state (8 bytes each) is cut in d = {p['d']} ZeRO-1 shards, one per "
            f"rank: {gb(p):.3f} GB. Over the d ranks of a tp rank the bytes add up to the block "
            "once: 12·Ψ/t. " + _unbalanced(p, gb)),
    ))


def _unbalanced(p, gb) -> str:
    """What the lowest-holder rule costs against PyTorch DCP's balancing dedup."""
    first, other = gb({**p, "dp_rank": 0}), gb({**p, "dp_rank": 1})
    even = (first + other * (p["d"] - 1)) / p["d"]
    return (f"The rule is lopsided: dp rank 0 writes {first:.2f} GB, every other dp rank "
            f"{other:.2f} GB ({first / other:.0f}×), and the save lasts as long as the "
            "busiest writer. PyTorch DCP deduplicates the other way: `dedup_save_plans` "
            "(torch/distributed/checkpoint/_dedup_save_plans.py; save_to_lowest_rank=False "
            "by default) gives each replicated tensor to the rank with the fewest bytes "
            f"planned so far, so the d ranks write about 12·Ψ/(t·d) = {even:.2f} GB each, to "
            "within a tensor.")


def async_stall(seed=None) -> Question:
    def draw(rng):
        return {"T": rng.choice((0.5, 1.0, 2.0)), "N": rng.choice((10, 50, 100)),
                "h": rng.choice((0.5, 1.0, 2.0)), "w_over": rng.choice((0.4, 0.8, 1.5, 2.5))}

    def write(p):
        return p["w_over"] * p["N"] * p["T"]

    def right(p):  # the write overlaps the N steps that follow; the next save waits for it
        return "b" if write(p) <= p["N"] * p["T"] else "c"

    return _distinct(Question(
        key="14.async-stall", seed=seed, draw=draw, kind="choice",
        text=lambda p: (
            f"A run takes T = {p['T']} s a step and saves every N = {p['N']} steps. A save "
            f"copies the state to host memory in h = {p['h']} s (the step waits for it), then "
            f"writes it to disk in w = {write(p):g} s. A synchronous save waits for both; an "
            "asynchronous one writes beside the steps that follow, and the next save cannot "
            "start its copy until the previous write has finished. Once the run is steady, "
            "how long does each asynchronous save stall training? Answer 'a', 'b', 'c' or "
            "'d': (a) h + w; (b) h; (c) h + (w − N·T); (d) nothing."),
        right=right,
        wrong=[
            Wrong(lambda p: "a", "h + w is the synchronous save: every step waits for the disk"),
            Wrong(lambda p: "b", "the write takes longer than the N steps between saves: the "
                                 "next save waits w − N·T for it, on top of its copy"),
            Wrong(lambda p: "c", "the write ends within the N steps that follow: the next "
                                 "save finds it done, and only the copy stalls"),
            Wrong(lambda p: "d", "the copy to host memory blocks the step: the state must not "
                                 "change while it is copied"),
        ],
        worked=lambda p: (
            f"the write (w = {write(p):g} s) runs beside the N·T = {p['N'] * p['T']:g} s of "
            "steps until the next save; "
            + ("it ends in time, so each save stalls only its copy: h = "
               f"{p['h']} s, against h + w = {p['h'] + write(p):g} s synchronous"
               if right(p) == "b" else
               f"it does not, so the next save waits w − N·T = {write(p) - p['N'] * p['T']:g} "
               f"s for it, then copies: h + (w − N·T) = "
               f"{p['h'] + write(p) - p['N'] * p['T']:g} s, against h + w = "
               f"{p['h'] + write(p):g} s synchronous")
            + ". (A MODEL; lesson 14 measured the three step times.)"),
    ))


QUESTIONS = {"14.young": young, "14.zero1-writes": zero1_writes,
             "14.async-stall": async_stall}
