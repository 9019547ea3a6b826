"""The refit against a checkpoint round trip: the same trained weights moved from a training
layout onto tp 4 live (`mt.serving.Refit`) and through `minitp.checkpoint`'s sharded format
(saved at the training layout, loaded at the serving one), side by side in one run.

    python bench/refit.py            # -> bench/results/refit-cpu.json (7 min on 2 loaded cores)
    python bench/refit.py --quick --out /tmp/x.json   # a check that it runs; --profile: cProfile

One `mt.launch` of 4 gloo ranks on the CPU. For each training layout, (dp 2, tp 2) ZeRO-1,
(pp 2, tp 2) and a mixture of experts at (dp 4, ep 2) ZeRO-3, a GPT takes one AdamW step
(so Adam's state exists for the checkpoint), then goes to ``Mesh(tp=4)`` three ways:

* refit: ``Refit(model, tp4)`` (the plan and the serving shard, once), then
  ``refit_once()`` (the weights moved: what an RL loop repeats every N steps);
* checkpoint, weights only: the sharded format (`checkpoint.Saver`'s files, owners and
  manifest) holding the weights alone, as the refit moves them, loaded by `Reader` into
  the serving shard, the layouts computed once (`WeightsSaver`, `WeightsLoader` below);
* checkpoint, as the library does it: `Saver.save` then `checkpoint.load` (first) or
  `load_into` (after): the weights and Adam's two moments (3× the bytes), and `load_into`
  computes the serving layout's ids on every call.

A save ends with a barrier (the loaders wait for rank 0's manifest). Every rank's serving
shard from the three ways is checked equal, bit for bit, before anything is timed. "first"
is the first call (the plan, the owners, the serving model built); then the ways take turns
(the order rotates) for ``reps`` rounds, each after a barrier, timed as its slowest rank
(MEASURED, wall clock; medians). The files go to a temporary directory on the disk, fsynced.

Bytes, summed over the ranks (`mt.serving.RefitReport`): ``received`` (from the trace),
``planned`` (what must move: what a rank does not hold already), ``minimum`` (each weight a
rank serves, once: planned + kept), ``broadcast`` (a naive refit: each rank gets the dense
model), ``sent_measured`` (the kernel's count of what the ranks wrote, headers included).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import os
import pstats
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

import minitp as mt
from minitp.checkpoint import Saver
from minitp.checkpoint import sharded_read as ckpt_read
from minitp.checkpoint.layout import Space, _model_tensors, local_ids
from minitp.checkpoint.manifest import MANIFEST
from minitp.serving import Refit

RESULTS = Path(__file__).resolve().parent / "results"
PRESETS = {  # (vocab, d_model, n_layer, n_head, experts, reps, pairs: the last n of PAIRS)
    "cpu": (4096, 256, 4, 8, 4, 5, 3),
    "quick": (64, 16, 1, 4, 4, 1, 1),
}
PAIRS = {  # name: (training mesh, mt.parallelize keywords, a mixture of experts?)
    "(dp 2, tp 2) ZeRO-1 → tp 4": (dict(dp=2, tp=2), dict(zero_stage=1), False),
    "(pp 2, tp 2) → tp 4": (dict(pp=2, tp=2), {}, False),
    "MoE (dp 4, ep 2) ZeRO-3 → tp 4": (dict(dp=4, ep=2), dict(zero_stage=3), True),
}
WAYS = ("refit", "checkpoint, weights only", "checkpoint, library (weights + Adam)")


class WeightsSaver(Saver):
    """`Saver`'s format holding the weights alone: its owners, file layout and manifest,
    with Adam's elements dropped after they were agreed (the ids sort the weights first,
    so the slots `copies` computed still hold)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.mine = self.mine[self.mine < self.space.n_model]
        self.copies = [c for c in self.copies if c[0] == "model"]
        if self.layout is not None:
            self.layout = {r: [e for e in entries if e["tensor"].startswith("model/")]
                           for r, entries in self.layout.items()}


class WeightsLoader:
    """The weights of a sharded checkpoint into a parallel `model`: `load_into`'s reads
    without Adam's state, the ids of what this rank holds computed once; the manifest
    parsed, not checked (checking it would refuse the Adam state it lacks)."""

    def __init__(self, model, mesh, plan: dict):
        self.model, space = model, Space.of(model.cfg)
        self.ids = local_ids(model.cfg, mesh, plan, space)[0]
        self.wanted = torch.unique(torch.cat([i[i >= 0] for i in self.ids]))
        self.cache = torch.zeros(space.n_model, dtype=next(model.parameters()).dtype)

    def load(self, step_dir: str) -> int:
        with open(os.path.join(step_dir, MANIFEST), "rb") as f:  # (not `read_manifest`: its
            manifest = json.load(f)  # check wants every tensor held, Adam's too)
        reader = ckpt_read.Reader(step_dir, manifest)
        self.cache[self.wanted] = reader.read(self.wanted).to(self.cache.dtype)
        with torch.no_grad():
            for t, ids in zip(_model_tensors(self.model)[0], self.ids, strict=True):
                keep = ids >= 0
                t.data.view(-1)[keep] = self.cache[ids[keep]].to(t)
        return reader.bytes_read


def _equal(a, b) -> bool:
    theirs = b.state_dict()
    return all(torch.equal(v, theirs[k]) for k, v in a.state_dict().items())


class Pair:
    """One training layout's model and its three ways to tp 4, each a first call and a
    repeatable one; the bytes each moved."""

    def __init__(self, cfg, sizes, plan, root: str):
        self.mesh, self.plan, self.cfg = mt.Mesh(**sizes), plan, cfg
        torch.manual_seed(0)
        self.model = mt.parallelize(mt.GPT(cfg).to(mt.device()), self.mesh, **plan)
        self.opt = mt.make_optimizer(self.model, self.mesh, torch.optim.AdamW, lr=1e-3)
        tokens = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len + 1),
                               generator=torch.Generator().manual_seed(1))
        mt.train_step(self.model, (tokens[:, :-1], tokens[:, 1:]), self.mesh, self.opt)
        self.tp4 = mt.Mesh(tp=4)
        self.dirs = {way: os.path.join(root, f"way-{k}") for k, way in enumerate(WAYS[1:])}
        self.step, self.bytes = 0, {}

    def _save(self, saver, way) -> str:
        self.step += 1
        saver.save(self.step)
        dist.barrier()  # the loaders wait for rank 0's manifest
        return os.path.join(self.dirs[way], f"step-{self.step}")

    def first(self, way: str):
        if way == WAYS[0]:
            self.refit = Refit(self.model, self.tp4)
            self.bytes[way] = asdict(self.refit.refit_once())
            return
        saver = (WeightsSaver if way == WAYS[1] else Saver)(
            self.model, self.opt, self.mesh, self.dirs[way], self.plan, keep=1)
        step_dir = self._save(saver, way)
        if way == WAYS[1]:
            with torch.random.fork_rng(devices=[]):  # (every value is overwritten)
                served = mt.parallelize(mt.GPT(self.cfg).to(mt.device()), self.tp4,
                                        sequence_parallel=False).eval()
            self.weights = (saver, WeightsLoader(served, self.tp4, {}))
            read = self.weights[1].load(step_dir)
        else:
            served, optimizer, meta = mt.checkpoint.load(  # (Adam's state read in, as ever)
                step_dir, self.tp4, lambda ts: torch.optim.Adam(ts, lr=0.0),
                sequence_parallel=False)
            self.library, read = (saver, served.eval(), optimizer), meta["bytes_read"]
        itemsize = torch.empty(0, dtype=next(self.model.parameters()).dtype).element_size()
        self.bytes[way] = {"written": saver.mine.numel() * itemsize, "read": read}

    def again(self, way: str):
        if way == WAYS[0]:
            self.refit.refit_once()
        elif way == WAYS[1]:
            self.weights[1].load(self._save(self.weights[0], way))
        else:
            saver, served, optimizer = self.library
            ckpt_read.load_into(self._save(saver, way), served, optimizer, self.tp4,
                                dict(sequence_parallel=False))

    def served_equal(self) -> bool:
        return (_equal(self.refit.served, self.weights[1].model)
                and _equal(self.refit.served, self.library[1]))

    def close(self):
        self.weights[0].close()
        self.library[0].close()


def _slowest(call) -> float:
    """Seconds `call` took on the slowest rank, started together."""
    mt.trace.clear()  # (the refit reads its receives back from the trace: keep it short)
    dist.barrier()
    started = time.perf_counter()
    call()
    seconds = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return float(seconds)


def _measure(pair: Pair, reps: int, profile: bool) -> dict:
    """The first calls, the check, then `reps` interleaved rounds (the order rotates)."""
    first = {way: _slowest(lambda way=way: pair.first(way)) for way in WAYS}
    if not pair.served_equal():
        raise RuntimeError("the three ways serve different weights: not timed")
    seconds, profiler = {way: [] for way in WAYS}, cProfile.Profile()
    for k in range(reps):
        for way in WAYS[k % 3:] + WAYS[:k % 3]:
            again = profiler.runcall if profile and way == WAYS[0] else (lambda f, w: f(w))
            seconds[way].append(_slowest(lambda way=way, again=again: again(pair.again, way)))
    pair.close()
    out = {"first_s": first, "seconds": seconds, "bytes": pair.bytes}
    if profile:  # where a steady refit's time goes on this rank (cProfile, MEASURED)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(8)
        out["profile"] = text.getvalue()
    return out


def ranks(cfgs: dict, names: list, reps: int, root: str, profile: bool) -> dict:
    torch.set_num_threads(1)  # 4 ranks share the machine's cores
    return {name: _measure(Pair(cfgs[moe], sizes, plan, os.path.join(root, str(k))), reps,
                           profile)
            for k, (name, (sizes, plan, moe)) in enumerate((n, PAIRS[n]) for n in names)}


def _sums(rows: list[dict]) -> dict:
    return {k: sum(r[k] or 0 for r in rows) for k in rows[0] if k != "rank"}


def record(quick: bool, argv: list[str], profile: bool = False) -> dict:
    from gpu_figures import cpu_model, versions  # (bench/, this script's folder; here, not at
    # the top: the ranks get this module by value, and that import costs them seconds)
    vocab, d, n_layer, n_head, experts, reps, n = PRESETS["quick" if quick else "cpu"]
    names = list(PAIRS)[-n:]
    dense = mt.GPTConfig(vocab_size=vocab, seq_len=32, n_layer=n_layer, n_head=n_head,
                         d_model=d)
    cfgs = {False: dense, True: mt.GPTConfig(**{**asdict(dense), "n_experts": experts,
                                                "top_k": 2})}
    root = tempfile.mkdtemp(prefix="minitp-refit-bench-")
    try:
        loads = [os.getloadavg()[0]]  # other programs on the machine stretch every figure
        run = mt.launch(ranks, 4, cfgs, names, reps, root, profile, timeout=1200)
        loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    pairs = {}
    for name in names:
        rank0 = run[0][name]
        refit = _sums([run[r][name]["bytes"][WAYS[0]] for r in range(4)])
        ckpt = {w: _sums([run[r][name]["bytes"][w] for r in range(4)]) for w in WAYS[1:]}
        pairs[name] = {"first_s": rank0["first_s"], "seconds": rank0["seconds"],
                       "median_s": {w: statistics.median(s) for w, s in rank0["seconds"].items()},
                       "refit_bytes": refit, "checkpoint_bytes": ckpt,
                       "refit_profile_rank1": run[1][name].get("profile")}
    return {"script": "bench/refit.py", "command": shlex.join(["python", *argv]),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "device_name": cpu_model(), "cpus": os.cpu_count(), "backend": "gloo",
            "load_average": loads, "ranks": 4, "quick": quick, "reps": reps, **versions(),
            "config": asdict(dense), "experts": experts, "dtype": "float32", "pairs": pairs}


def show(rec: dict) -> None:
    print(f"MEASURED {rec['date'][:10]} on {rec['device_name']} ({rec['cpus']} cores), 4 gloo "
          f"ranks, float32, d {rec['config']['d_model']}, {rec['config']['n_layer']} layers, "
          f"vocabulary {rec['config']['vocab_size']}; slowest rank, median of {rec['reps']} "
          f"interleaved rounds; load average {rec['load_average'][0]:.1f} at the start, "
          f"{rec['load_average'][1]:.1f} at the end\n")
    print("| training → serving | refit, first | refit | ckpt weights, first | ckpt weights "
          "| ckpt library, first | ckpt library | refit ÷ ckpt weights | refit ÷ ckpt library |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, p in rec["pairs"].items():
        f, m = p["first_s"], p["median_s"]
        cells = " | ".join(f"{1e3 * x[w]:.1f} ms" for w in WAYS for x in (f, m))
        print(f"| {name} | {cells} | {m[WAYS[0]] / m[WAYS[1]]:.2f}× "
              f"| {m[WAYS[0]] / m[WAYS[2]]:.2f}× |")
    print("\nBytes, summed over the 4 ranks (× the minimum: each weight a rank serves, once)\n")
    print("| training → serving | minimum | refit received (trace) | × minimum | received ÷ "
          "planned | on the wire (kernel) ÷ planned | broadcast × minimum | ckpt weights "
          "written + read × minimum | ckpt library written + read × minimum |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, p in rec["pairs"].items():
        b, c = p["refit_bytes"], p["checkpoint_bytes"]
        wire = (f"{b['sent_measured'] / b['planned']:.3f}" if b["sent_measured"] and b["planned"]
                else "n/a")
        disk = [(c[w]["written"] + c[w]["read"]) / b["minimum"] for w in WAYS[1:]]
        print(f"| {name} | {b['minimum']:,} | {b['received']:,} "
              f"| {b['received'] / b['minimum']:.2f} | {b['received'] / max(b['planned'], 1):.2f} "
              f"| {wire} | {b['broadcast'] / b['minimum']:.2f} | {disk[0]:.2f} | {disk[1]:.2f} |")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, the MoE alone, 1 round")
    parser.add_argument("--out", type=Path, default=RESULTS / "refit-cpu.json")
    parser.add_argument("--profile", action="store_true", help="where rank 1's refits spend")
    args = parser.parse_args(argv[1:])
    rec = record(args.quick, argv, args.profile)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
    show(rec)
    for name, p in rec["pairs"].items() if args.profile else ():
        print(f"\n{name}: rank 1's steady refits, cProfile (MEASURED)\n{p['refit_profile_rank1']}")
    print(f"\nwrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
