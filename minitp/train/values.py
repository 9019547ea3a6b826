"""The checks on `python -m minitp.train`'s values that argparse's types let through: a
number that is nan, inf, negative or too large to use, a prompt that is not text, a run
directory or text file that cannot be used. Each raises ValueError with the one line
`minitp.train.flags.validate` prints (exit 2), before any process starts: each of these
once reached a traceback on a rank, some only after the whole run had trained.
"""

from __future__ import annotations

import math
import os

import torch

from .. import checkpoint
from ..data import MAX_CORPUS_BYTES
from ..rules import check_timeout
from ..runtime.chrome_trace import check_writable

SEED_STRIDE = 1_000_003  # a step's seed is seed * SEED_STRIDE + step + 1 (`rank.step_seed`)
SEED_LIMIT = 2**63 - 1  # torch.manual_seed's int64: larger seeds overflow on every rank
# The sample is printed at the end of the run, one token a forward pass: a screenful is the
# point, and 10**20 tokens once kept a finished run "sampling" for ever.
MAX_SAMPLE_TOKENS = 100_000


def check_numbers(args) -> None:
    """The float flags are positive and finite (an infinite --lr trains nothing but NaN;
    --timeout nan stops `mt.launch`); --sample-tokens is from 0 to MAX_SAMPLE_TOKENS; --seed
    fits every step's torch seed."""
    for name in ("lr", "temperature", "clip_grad"):
        value = getattr(args, name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ValueError(f"--{name.replace('_', '-')} must be a positive, finite number, "
                             f"got {value}")
    try:  # the launcher's own rule, in its words
        check_timeout(args.timeout)
    except ValueError as exc:
        raise ValueError(f"--timeout: {exc}") from None
    if not 0 <= args.sample_tokens <= MAX_SAMPLE_TOKENS:
        raise ValueError(f"--sample-tokens must be from 0 to {MAX_SAMPLE_TOKENS:,} (the sample "
                         f"is printed at the end of the run), got {args.sample_tokens:,}")
    top = max(0, (SEED_LIMIT - args.steps - 1) // SEED_STRIDE)
    if not 0 <= args.seed <= top:
        raise ValueError(f"--seed {args.seed}: each step's seed is seed*{SEED_STRIDE:,} + step, "
                         f"a 64-bit integer for torch; give a seed from 0 to {top:,}")


def check_lr_fits(args) -> None:
    """--lr is a number the weights' dtype holds (float32's masters under bfloat16): Adam's
    step size is cast to it, and past float32's largest (3.4e38) the first step raised."""
    dtype = torch.float32 if args.dtype == "bfloat16" else getattr(torch, args.dtype)
    largest = torch.finfo(dtype).max
    if args.lr > largest:
        raise ValueError(f"--lr {args.lr} is past the largest {dtype} ({largest:.3g}): Adam's "
                         f"step is taken in the weights' dtype")


def check_text_and_places(args) -> None:
    """--prompt is text that UTF-8 can encode (bytes that are not UTF-8 reach Python as lone
    surrogates, and the sample at the end of the run could not encode them); --out is
    a directory this process can create or write into; --trace-out a file it can write;
    --data is a file with text in it."""
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"--prompt {args.prompt!r} is not valid UTF-8 text (the model reads "
                         "and writes UTF-8 bytes)") from None
    if args.out is not None:
        try:
            checkpoint.check_save_target(args.out)  # the same test as --save's directory
        except OSError as exc:
            raise ValueError(f"--out: {exc}") from None
    if args.trace_out is not None:
        try:
            check_writable(args.trace_out)
        except ValueError as exc:
            raise ValueError(f"--trace-out: {exc}") from None
    if args.data is not None:
        if not os.path.isfile(args.data):
            why = "a directory, not a file" if os.path.isdir(args.data) else "no such file"
            raise ValueError(f"--data {args.data}: {why}")
        try:
            open(args.data, "rb").close()
        except OSError as exc:
            raise ValueError(f"--data {args.data}: {exc.strerror or exc}") from None
        if os.path.getsize(args.data) == 0:
            raise ValueError(f"--data {args.data}: the file is empty (there is no text to "
                             "train on)")


def rank_data_bytes(args, cfg) -> int:
    """What every rank holds of the data: the text (a byte a token, each rank sent its copy)
    and the held-out batches it builds whole (x, y and with --pack the positions, int64):
    --eval-batches 10**9 once filled the machine's memory."""
    text = os.path.getsize(args.data) if args.data else MAX_CORPUS_BYTES
    tensors = 3 if args.pack else 2
    return text + args.eval_batches * args.batch_size * cfg.seq_len * tensors * 8
