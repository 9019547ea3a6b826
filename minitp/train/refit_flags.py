"""`python -m minitp.train --refit-every N --serve-tp T [--serve-pp P] [--serve-ranks
collocated|separate]`: an RL loop's inner step, without the RL. Every N steps the run moves
its weights onto a serving layout (`minitp.serving.refit`), generates a batch from the
held-out text's first tokens, and scores the generator's log-probabilities of its own
sampled tokens beside the trainer's forward over the same tokens (`minitp.serving.parity`).

    python -m minitp.train --dp 1 --pp 1 --tp 2 --refit-every 1 --serve-tp 2 --check

Collocated (default): the serving grid (pp P, tp T, the world's other ranks dp replicas)
lies on the training ranks. Separate: on T·P more ranks after them, the launch made that
much larger; the trainer's grid is then an `mt.Mesh` over its own ranks.

Recorded per refit in metrics.json's "refits" (the lead rank's): the bytes the serving
ranks received (every rank's refit receives, from the trace), the plan's minimum, the
slowest rank's seconds, and two log-probability differences over the generated tokens:
``max_logprob_diff``, the generator's forward over the sampled sequence (a pp grid: its
decode) against the trainer's forward; ``decode_logprob_gap``, the generator's decode
through its KV cache (how it drew them) against the same. The summary (and so --check's
last line) holds each's largest over the run. In float64 the first is 0 where the two
layouts compute alike (tp 2 from tp 2); the second can be an ulp (MEASURED 8.9e-16 at tp 2:
a decode step's one-row matrix products round unlike the whole sequence's).
Refused in one line before any process starts: a serving tp the heads cannot split, a
grid the world cannot hold, and what a refit does not take (--impl torch, FP8, a VLM;
--save/--load with separate ranks).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .machine import under_torchrun, world_size_of

PLACEMENTS = ("collocated", "separate")


def add_refit_flags(parser) -> None:
    a = parser.add_argument
    a("--refit-every", type=int, default=None, metavar="N",
      help="every N steps, move the weights onto the serving layout (--serve-tp, --serve-pp) "
           "and generate from the held-out text, recording bytes, seconds and the largest "
           "generator-vs-trainer log-prob difference in metrics.json (docs/refit.md)")
    a("--serve-tp", type=int, default=1, metavar="T", help="the serving layout's tp (default 1)")
    a("--serve-pp", type=int, default=1, metavar="P", help="the serving layout's pp (default 1)")
    a("--serve-ranks", choices=PLACEMENTS, default="collocated",
      help="serve on the training ranks (default), or on T*P ranks of their own after them")


def extra_ranks(args) -> int:
    """The ranks the launch adds for the generator: T·P where separate, else none."""
    return (args.serve_tp * args.serve_pp if getattr(args, "refit_every", None)
            and args.serve_ranks == "separate" else 0)


def validate_refit(args, cfg, parser) -> None:
    """parser.error (one line, exit 2) for a refit the run cannot make."""
    from ..rules import check_tp_widths
    from ..rules.layouts import layout_stages
    from ..serving.refit_checks import serving_ranks

    if args.refit_every is None:
        given = [f for f in ("serve_tp", "serve_pp") if getattr(args, f) != 1]
        if given or args.serve_ranks != "collocated":
            parser.error(f"--{(given or ['serve_ranks'])[0].replace('_', '-')} needs "
                         "--refit-every N")
        return
    for name in ("refit_every", "serve_tp", "serve_pp"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    refused = [(args.impl == "torch", "--impl torch (a refit reads mt.parallelize's layout)"),
               (args.fp8 is not None, "--fp8"), (bool(cfg.vision_patches), "--arch vlm"),
               (extra_ranks(args) and bool(args.save or args.load),
                "--save/--load with --serve-ranks separate")]
    for bad, what in refused:
        if bad:
            parser.error(f"--refit-every with {what}: not supported")
    train, serve = world_size_of(args), args.serve_tp * args.serve_pp
    try:
        check_tp_widths(cfg, args.serve_tp)
        layout_stages(None, cfg.n_layer, args.serve_pp)
        if args.serve_ranks == "collocated" and train % serve:
            raise ValueError(f"a serving grid of {serve} ranks (tp {args.serve_tp} x pp "
                             f"{args.serve_pp}) does not tile the {train} training ranks")
        world = int(__import__("os").environ["WORLD_SIZE"]) if under_torchrun() else None
        if args.serve_ranks == "separate" and world is not None:
            serving_ranks(world, train, serve, "separate")
    except ValueError as exc:
        parser.error(f"--serve-tp/--serve-pp/--serve-ranks: {exc}")


def trainer_ranks(args) -> dict:
    """`mt.Mesh`'s keyword for the trainer's grid: its own ranks where the generator has
    others."""
    return {"ranks": range(world_size_of(args))} if extra_ranks(args) else {}


def serves_only(args) -> bool:
    return bool(extra_ranks(args)) and dist.get_rank() >= world_size_of(args)


class Refitter:
    """Every rank's part of the run's refits: planned at the first, run every N steps."""

    def __init__(self, args, cfg, eval_tokens):
        self.args, self.cfg, self.records, self.planned = args, cfg, [], None
        flat = torch.cat(eval_tokens) if isinstance(eval_tokens, list) else eval_tokens
        # seq_len + 1 tokens in all: the trainer then scores seq_len positions (what
        # sequence parallelism splits), the generator's cache holding at most seq_len
        self.new = min(8, max(1, cfg.seq_len // 2))
        self.prompt_len = cfg.seq_len + 1 - self.new
        starts = [i * cfg.seq_len for i in range(2)]
        self.prompt = torch.stack([flat[s:s + self.prompt_len] for s in starts]).long()
        train, serve = world_size_of(args), args.serve_tp * args.serve_pp
        self.serving = (range(train, train + serve) if extra_ranks(args) else range(train))

    def due(self, step: int) -> bool:
        return step % self.args.refit_every == 0

    def __call__(self, step: int, model) -> None:
        """Refit (every rank), generate (the serving ranks), score (the trainer's)."""
        from ..runtime import trace
        from ..runtime.mesh import Mesh
        from ..serving import Refit

        if self.planned is None:
            with trace.paused():  # the plan and the served shell: bookkeeping
                me, a = dist.get_rank(), self.args
                target = None
                if me in self.serving:
                    replicas = len(self.serving) // (a.serve_tp * a.serve_pp)
                    target = Mesh(dp=replicas, pp=a.serve_pp, tp=a.serve_tp,
                                  **({"ranks": self.serving} if extra_ranks(a) else {}))
                self.planned = (Refit(model, target) if model is not None
                                else Refit.for_generator(self.cfg, target))
        started = time.perf_counter()
        report = self.planned.refit_once()
        seconds = time.perf_counter() - started
        with trace.paused():
            holder = list(self._generate(step))  # (tokens, scored, decoded): the serving
            dist.broadcast_object_list(holder, src=self.serving[-1])  # grid's last rank's
            mine = None if model is None else _trainer_logprobs(model, self.cfg, holder[0])
            every: list = [None] * dist.get_world_size()
            dist.all_gather_object(every, (report, seconds))
        if model is None or dist.get_rank() != 0:
            return
        mine = mine[:, self.prompt_len - 1:]
        reports = [r for r, _ in every]
        self.records.append({
            "step": step, "received_bytes": sum(r.received for r in reports),  # the trace's
            "planned_bytes": sum(r.planned for r in reports),
            "minimum_bytes": sum(r.minimum for r in reports),
            "local_bytes": sum(r.local for r in reports),
            "seconds": max(s for _, s in every),
            "max_logprob_diff": float((holder[1] - mine).abs().max()),
            "decode_logprob_gap": float((holder[2] - mine).abs().max())})

    def _generate(self, step: int):
        """On the serving grid's last rank: (tokens, the generator's log-probs of its
        sampled tokens by its forward over them, and as its decode drew them through its
        KV cache); (None,) * 3 elsewhere. A pp grid scores through its decode only."""
        from ..runtime._device import device
        from ..serving import generate, pp_decode, token_logprobs, vocab_gather

        served = self.planned.served
        if served is None:
            return None, None, None
        prompt, a = self.prompt.to(device()), self.args
        if served.mesh.pp.size > 1:
            groups = pp_decode(served, [prompt], self.new, a.temperature, a.seed + step).groups
            gen = groups[0] if groups else None
        else:
            gen = generate(served, prompt, self.new, a.temperature, a.seed + step,
                           gather=vocab_gather(served))
        if gen is None:
            return None, None, None
        tokens = gen.tokens.cpu()
        picked = tokens[:, self.prompt_len:, None]
        decoded = torch.log_softmax(torch.stack(gen.logits, dim=1), -1).gather(-1, picked)[..., 0]
        scored = (decoded if served.mesh.pp.size > 1  # (every tp rank: a collective)
                  else token_logprobs(served, tokens)[:, self.prompt_len - 1:])
        if dist.get_rank() != self.serving[-1]:
            return None, None, None
        return tokens, scored, decoded


def _trainer_logprobs(model, cfg, tokens):
    """(B, T − 1) float64: the trainer's log-probs of `tokens`, by its own forward where it
    is one stage over whole sequences, else by its gathered dense weights (one process)."""
    from ..checkpoint import dense_expert_biases
    from ..data_parallel import zero
    from ..model import GPT
    from ..serving import token_logprobs

    was = model.training
    model.eval()  # (no dropout: the generator has none)
    try:
        if model.mesh.pp_size == 1 and model.mesh.cp_size == 1:
            return token_logprobs(model, tokens)
        with zero.gathered(model):
            state = {**model.full_state_dict(), **dense_expert_biases(model, model.mesh)}
        with torch.random.fork_rng(devices=[]):
            dense = GPT(cfg).to(next(iter(state.values())).dtype)
        dense.load_state_dict(state)
        with torch.no_grad():
            logits = dense.eval()(tokens[:, :-1])[0].double()
        return torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None])[..., 0]
    finally:
        model.train(was)


def serve_rank(args, cfg, eval_tokens, start_step: int) -> dict:
    """What a separate serving rank runs: the trainer's refits, step for step."""
    from .. import memory

    refitter = Refitter(args, cfg, eval_tokens)
    for step in range(start_step, args.steps):
        if refitter.due(step + 1):
            refitter(step + 1, None)
    served = refitter.planned.served if refitter.planned else None
    states = memory.measure_model_states(served) if served is not None else {}
    return {"memory": {**states, "activations": 0}}


def summary(lead: dict) -> dict:
    """The run's summary keys: the last refit's bytes and seconds, the largest difference."""
    refits = lead.get("refits")
    if not refits:
        return {}
    return {"refit_received_bytes": refits[-1]["received_bytes"],
            "refit_seconds": refits[-1]["seconds"],
            "max_logprob_diff": max(r["max_logprob_diff"] for r in refits),
            "decode_logprob_gap": max(r["decode_logprob_gap"] for r in refits)}
