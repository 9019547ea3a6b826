"""How the default run's settings were chosen, measured: docs/default-run.md's table, again.

    python bench/default_run.py                    # about 6 minutes on 2 cores
    python bench/default_run.py --steps 40 --no-ranks   # a quick look

Part 1, what each setting learns. `python -m minitp.train`'s GPT trained for
`--steps` steps in this one process under each setting of SETTINGS, by the
training its --check does (`minitp.train.train_one_process`: seed 0, the run's
batches, Adam on its schedule, float32); then the held-out loss on the same 8
held-out batches of 16 sequences for every row, so rows with different batch
sizes compare (the row with 32-byte sequences is scored on 32-byte windows: less
context, so a little higher for the same model). One process does the parallel
run's arithmetic: the question here is what the settings learn, not how the work
is split.

Part 2, what a step costs on the default mesh. `python -m minitp.train` for 30
steps at each (batch, microbatches) of COSTS, one after another in this run;
seconds per step from the run's own tokens/s. Eight ranks sharing a laptop's
cores are bound by the number of collectives (microbatches × layers), not by
the arithmetic, which is why a batch four times larger costs little more. A
shared machine is noisy: compare the rows of one run, not of two.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from tqdm import tqdm

from minitp import data, train

# (label, flags of python -m minitp.train): each row differs from the default in the flags
# it names; the old default (batch 16, lr 3e-3) is the first row.
SETTINGS = [
    ("batch 16, lr 3e-3 (the old default)", ["--batch-size", "16", "--lr", "3e-3"]),
    ("batch 16, lr 3e-3, 128 wide", ["--batch-size", "16", "--lr", "3e-3", "--d-model", "128"]),
    ("batch 64, lr 3e-3", ["--lr", "3e-3"]),
    ("batch 64, lr 2e-3 (the default)", []),
    ("batch 64, lr 1e-3", ["--lr", "1e-3"]),
    ("batch 64, lr 2e-3 with a cosine to 2e-4", ["--lr-schedule", "cosine"]),
    ("batch 128 of 32 bytes, lr 2e-3", ["--batch-size", "128", "--seq-len", "32"]),
]
COSTS = [(16, 4), (64, 4), (64, 2), (64, 1)]  # (global batch, microbatches per dp rank)
EVAL_BATCHES, EVAL_BATCH_SIZE = 8, 16


def held_out_loss(flags: list[str], steps: int) -> float:
    """The CLI's GPT trained with `flags` for `steps` steps in this process (the CLI's
    own --check training, `minitp.train.train_one_process`); its held-out loss."""
    parser = train.build_parser()
    args = parser.parse_args([*flags, "--steps", str(steps), "--no-progress"])
    cfg, train_tokens, eval_tokens, _ = train.validate(args, parser)  # the CLI's defaults
    model, _ = train.train_one_process(args, cfg, train_tokens)
    held_out = data.eval_batches(eval_tokens, EVAL_BATCHES, EVAL_BATCH_SIZE, cfg.seq_len, args.seed)
    with torch.no_grad():
        return sum(float(model(x, y)[1]) for x, y in held_out) / len(held_out)


def seconds_per_step(batch: int, microbatches: int, steps: int = 30) -> float:
    """One short run of the default mesh; seconds per step from its tokens/s."""
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [sys.executable, "-m", "minitp.train", "--steps", str(steps), "--batch-size",
             str(batch), "--microbatches", str(microbatches), "--eval-every", str(steps),
             "--eval-batches", "1", "--sample-tokens", "8", "--no-progress", "--out",
             os.path.join(out, "run")], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"python -m minitp.train failed:\n{done.stderr[-2000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return batch * train.MODEL_SIZES["seq-len"] / summary["tokens_per_s"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=400, help="steps per setting (default 400)")
    p.add_argument("--no-ranks", action="store_true", help="skip part 2 (the 8-rank step cost)")
    args = p.parse_args(argv)
    print(f"| {args.steps} steps of | held-out loss |\n|---|---|", flush=True)
    for label, flags in tqdm(SETTINGS, unit="setting", file=sys.stderr):
        tqdm.write(f"| {label} | {held_out_loss(flags, args.steps):.2f} |", file=sys.stdout)
    if args.no_ranks:
        return
    print("\n| dp=2 pp=2 tp=2, batch | microbatches | seconds per step |\n|---|---|---|",
          flush=True)
    for batch, microbatches in tqdm(COSTS, unit="run", file=sys.stderr):
        tqdm.write(f"| {batch} | {microbatches} | {seconds_per_step(batch, microbatches):.2f} |",
                   file=sys.stdout)


if __name__ == "__main__":
    main()
