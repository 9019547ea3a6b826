"""``python -m minitp.generate``: generate from a `minitp.train` checkpoint through a KV cache.

    python -m minitp.generate --load ckpt                       # one process
    python -m minitp.generate --load ckpt --tp 2 --pp 2 --batch 4 --check --dtype float64

The parent checks every flag (`minitp.generate.flags`: one line, exit 2, before any process
starts), launches tp·pp ranks (`mt.launch`), each loading the dense checkpoint (latent
attention in decode's absorbed form, W^UK and W^UV folded: `minitp.model.mla`) and taking its
part (`minitp.serving.tp_generate`, or `pp_generate` with a pipeline), and prints the first
sequence, then one JSON object: prefill and decode seconds apart, decoded tokens per second,
and with --check whether the tokens equal one uncached process's and the largest logit
difference (``max_logit_diff``).
"""

from __future__ import annotations

import json
import sys

import torch

from .. import checkpoint
from ..model.mla import set_absorbed
from ..runtime.errors import LaunchError
from ..serving import generate, pp_generate, tp_generate
from .flags import build_parser, groups_of, validate


def _prompts(prompt: torch.Tensor, batch: int, pp: int) -> list[torch.Tensor]:
    return [prompt[None].expand(rows, -1).clone() for rows in groups_of(batch, pp)]


def _rank(args, prompt):
    from ..runtime._device import device
    from ..runtime.mesh import Mesh

    ref = checkpoint.load_dense(args.load)[0].to(device(), getattr(torch, args.dtype))
    set_absorbed(ref)  # latent attention decodes absorbed (a no-op for other attention)
    mesh = Mesh(pp=args.pp, tp=args.tp)
    prompts = _prompts(prompt, args.batch, args.pp)
    if args.pp == 1:
        done = tp_generate(ref, mesh, prompts[0], args.tokens, args.temperature, args.seed)
        groups, times = [done], (done.prefill_s, done.decode_s)
    else:
        done = pp_generate(ref, mesh, prompts, args.tokens, args.temperature, args.seed)
        groups, times = done.groups, (done.prefill_s, done.decode_s)
    if not groups or mesh.tp.rank:  # the last stage's first tp rank reports
        return None
    return {"tokens": [g.tokens for g in groups], "logits": [torch.stack(g.logits) for g in groups],
            "prefill_s": times[0], "decode_s": times[1]}


def reference(args, prompt) -> tuple[list, list]:
    """--check's tokens and logits: one process, no cache, each group from seed + g."""
    ref = checkpoint.load_dense(args.load)[0].to(getattr(torch, args.dtype))
    out = [generate(ref, p, args.tokens, args.temperature, args.seed + g, cached=False)
           for g, p in enumerate(_prompts(prompt, args.batch, args.pp))]
    return [g.tokens for g in out], [torch.stack(g.logits) for g in out]


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # a --save-every directory: its newest complete step (DIR itself if it is one)
        args.load = checkpoint.resolve(args.load)
    except (OSError, ValueError) as exc:
        parser.error(f"--load {args.load}: {exc}")
    _, prompt = validate(args, parser)
    from ..runtime.launch import launch

    try:
        run = launch(_rank, args.tp * args.pp, args, prompt, timeout=args.timeout)
    except (KeyboardInterrupt, LaunchError) as error:  # one line: the rank's traceback is in it
        stopped = isinstance(error, KeyboardInterrupt)
        sys.stderr.write(f"{parser.prog}: "
                         f"{'stopped by Ctrl-C (every rank stopped)' if stopped else error}\n")
        raise SystemExit(130 if stopped else 1) from None
    lead = next(r for r in run if r is not None)
    steps = args.tokens - 1  # the first token comes from the prefill
    summary = {"tp": args.tp, "pp": args.pp, "batch": args.batch, "tokens": args.tokens,
               "prefill_s": round(lead["prefill_s"], 6), "decode_s": round(lead["decode_s"], 6),
               "decode_tokens_per_s": (round(args.batch * steps / lead["decode_s"], 1)
                                       if steps and lead["decode_s"] else None)}
    if args.check:
        tokens, logits = reference(args, prompt)
        summary["tokens_equal"] = all(torch.equal(a, b) for a, b in
                                      zip(lead["tokens"], tokens, strict=True))
        summary["max_logit_diff"] = max(float((a - b).abs().max()) for a, b in
                                        zip(lead["logits"], logits, strict=True))
    text = bytes(lead["tokens"][0][0].tolist()).decode("utf-8", errors="replace")
    print(f"generated (prompt {args.prompt!r}, temperature {args.temperature}):\n{text}\n")
    print(json.dumps(summary), flush=True)
    return summary
