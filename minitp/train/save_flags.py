"""`python -m minitp.train`'s periodic checkpoints: --save-every, --keep, --async-save,
--load DIR's newest complete step, and the test-only failure MINITP_FAIL_AT_STEP.

    torchrun --max-restarts 1 --nproc-per-node 4 -m minitp.train --dp 2 --pp 1 --tp 2 \\
        --save ckpt --save-every 50 --load ckpt

is a job that survives a rank's death: torchrun restarts the group, and every rank
resumes from the newest complete ``ckpt/step-<n>`` (the first attempt finds none and
starts from step 0). Batches and every step's random numbers are functions of (seed,
step), so the resumed run is the uninterrupted one, bit for bit (tests/train).

MINITP_FAIL_AT_STEP=k (testing only): on the first attempt (TORCHELASTIC_RESTART_COUNT
unset or 0), global rank MINITP_FAIL_RANK (default: the last) kills itself with
SIGKILL once it has taken step k, before that step's save. The parent reads both
variables (`validate_save`): ranks forked from an older process may not see them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from ..checkpoint import files, sharded_read, writer_lock
from ..checkpoint.sharded import Saver, step_dirs
from ..runtime import trace
from .machine import under_torchrun, world_size_of


def add_save_flags(p) -> None:
    a = p.add_argument
    a("--save-every", type=int, default=None, metavar="N",
      help="with --save DIR: a sharded checkpoint DIR/step-<n>/ every N steps and at the end "
           "(each rank writes its own shard)")
    a("--keep", type=int, default=None, metavar="K",
      help="with --save-every: keep the newest K checkpoints (default 2)")
    a("--async-save", action="store_true",
      help="with --save-every: the step waits only for the copy to host memory; the write "
           "to disk runs beside the next steps")


def validate_save(args, parser) -> None:
    """The checkpoint flags' checks (parser.error: one line, exit 2). With --load DIR,
    args.load becomes the checkpoint it means: DIR, or DIR's newest complete step; None
    when DIR is also --save's and holds none yet (a job's first attempt)."""
    if args.save_every is not None and not args.save:
        parser.error("--save-every needs --save DIR: where would the checkpoints go?")
    for flag, value in (("save-every", args.save_every), ("keep", args.keep)):
        if value is not None and value < 1:
            parser.error(f"--{flag} must be at least 1, got {value}")
    if args.keep is not None and args.save_every is None:
        parser.error("--keep needs --save-every N: a dense --save keeps one checkpoint")
    args.keep = 2 if args.keep is None else args.keep
    fail = os.environ.get("MINITP_FAIL_AT_STEP")  # read here: ranks may not see the variable
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    args.fail_at_step = int(fail) if fail and first_attempt else None
    args.fail_rank = int(os.environ.get("MINITP_FAIL_RANK", world_size_of(args) - 1))
    if args.async_save and args.save_every is None:
        parser.error("--async-save needs --save-every N: it applies to the periodic sharded saves")
    if args.save:
        _check_save_dir(args, parser)
    if not args.load:
        return
    try:
        resolved = sharded_read.resolve(args.load)
    except FileNotFoundError as exc:
        if args.save and os.path.abspath(args.save) == os.path.abspath(args.load):
            args.load = None  # the job's first attempt: nothing saved yet
            return
        parser.error(f"--load: {exc}")
    except (OSError, ValueError) as exc:
        parser.error(f"--load: {exc}")
    _say_which(args.load, resolved)
    args.load = resolved
    if sharded_read.is_sharded(resolved):  # verified whole by flags.validate's read_meta
        try:
            saved_seed = sharded_read.read_manifest(resolved, verify=False)["extra"].get("seed")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            parser.error(f"--load: {resolved}: {exc}")
        if saved_seed is not None and saved_seed != args.seed:
            parser.error(f"--seed {args.seed}: the checkpoint was trained with --seed "
                         f"{saved_seed}, and its batches follow (seed, step)")


def _check_save_dir(args, parser) -> None:
    """--save DIR, before any rank starts: no other run writing there (`writer_lock`),
    and a dense save never over sharded steps (it replaces the whole directory)."""
    who = writer_lock.holder(args.save)
    if who is not None:
        parser.error(f"--save: {writer_lock.in_use_message(args.save, who)}")
    steps = files.step_names(args.save)
    if args.save_every is None and steps:
        parser.error(f"--save {args.save} holds sharded steps ({', '.join(steps[-2:])}): a "
                     f"dense save would replace the directory and them; add --save-every N, "
                     f"or save elsewhere")


def _say_which(given: str, resolved: str) -> None:
    """One line when DIR holds both a dense checkpoint and complete sharded steps: which
    of them the run resumes from (the newer: `sharded_read.resolve`)."""
    steps = [p for _, p in step_dirs(given) if sharded_read.is_sharded(p)]
    if not steps or not os.path.isfile(os.path.join(given, "meta.json")):
        return
    said = (f"resuming from the dense checkpoint in {given}, newer than {steps[-1]}"
            if resolved == given else
            f"resuming from {resolved}, newer than the dense checkpoint in {given}")
    if not under_torchrun() or os.environ.get("RANK") == "0":
        sys.stderr.write(f"--load {given}: {said}\n")


class SaveFailed(RuntimeError):
    """A save that failed on a rank for a reason its one line says (a full disk, a state
    that is not finite, a directory another writer took, a rank that never sealed): the
    parent prints that line (`failure_line`), not the rank's traceback."""


@contextlib.contextmanager
def reported():
    """Around a rank's saves: the checkpoint code's own one-line errors become SaveFailed."""
    try:
        yield
    except (OSError, ValueError, TimeoutError) as exc:
        raise SaveFailed(str(exc)) from exc


def failure_line(error) -> str | None:
    """`error` (a LaunchError)'s one line when a rank's save failed (`reported`), else None:
    a traceback's last line is the exception's qualified name and its message."""
    lines = (error.remote_traceback or "").strip().splitlines()
    prefix = f"{SaveFailed.__module__}.{SaveFailed.__qualname__}: "
    if lines and lines[-1].startswith(prefix):
        return f"rank {error.rank}: {lines[-1].removeprefix(prefix)}"
    return None


def saver_for(args, model, optimizer, mesh, plan: dict) -> Saver | None:
    """The run's `Saver` with --save-every (collective: every rank builds it), else None."""
    if args.save_every is None:
        return None
    return Saver(model, optimizer, mesh, args.save, plan, keep=args.keep,
                 asynchronous=args.async_save,
                 extra={"seed": args.seed, "optimizer": args.optimizer},
                 timeout=args.timeout)


def after_step(args, saver: Saver | None, step: int, rank: int) -> None:
    """After step `step` (steps taken): the test-only failure, then the save it is due."""
    if args.fail_at_step == step and rank == args.fail_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    if saver is not None and (step % args.save_every == 0 or step == args.steps):
        # drawn on the timeline with the traced step (the last), like the step itself
        with contextlib.nullcontext() if step == args.steps else trace.paused():
            saver.save(step)
