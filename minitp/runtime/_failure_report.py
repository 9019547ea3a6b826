"""What a failed launch says: the first rank that failed and its traceback (not the
echoes of it on other ranks), every rank waiting in a collective nobody else joined,
or a rank that died with what its native side printed and each rank's collective."""

from __future__ import annotations

from . import _flight_recorder
from .errors import CollectiveTimeout, LaunchError

_CASCADE_PATTERN = ("Connection closed by peer", "Connection reset", "Broken pipe", "EOF")
_NATIVE_STDERR_LINES = 20  # how much of a rank's C++ stderr a failure report quotes


def raise_failure(launch, deaths: dict[int, int]) -> None:
    errors = {r: m for r, m in launch.messages.items() if m["status"] == "error"}
    timeouts = {r: m for r, m in launch.messages.items() if m["status"] == "timeout"}
    root = [r for r, m in errors.items() if not is_cascade(m["error"])]
    if root:
        rank = min(root)
        message = errors[rank]
        raise LaunchError(
            f"rank {rank} of {launch.world_size} failed:\n{tail(message['error'])}"
            + _printed(message),
            rank=rank, remote_traceback=message["error"],
        )
    if timeouts:
        waiting = {r: m["op"] for r, m in timeouts.items()}
        waiting.update({r: what for r, what in _collectives_entered(launch, errors).items()
                        if r not in waiting})
        raise_timeout(launch, waiting)
    if deaths:
        rank = min(deaths)
        code = deaths[rank]
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        native = launch.native_stderr(rank).rstrip()
        if native:
            said = f", after printing:\n{tail(native, _NATIVE_STDERR_LINES)}"
        else:
            said = " (os._exit, a crash, or out of memory?)"
        raise LaunchError(
            f"rank {rank} of {launch.world_size} {how} before reporting back{said}"
            + collectives_in_flight(launch, errors),
            rank=rank, remote_traceback=native,
        )
    rank = min(errors)
    raise LaunchError(
        f"rank {rank} of {launch.world_size} failed:\n{tail(errors[rank]['error'])}",
        rank=rank, remote_traceback=errors[rank]["error"],
    )


def _collectives_entered(launch, errors: dict[int, dict]) -> dict[int, str]:
    """The collective each rank is in (its status slot), or, for a rank whose collective
    failed because a peer's connection went away (an echo of the peer's end), the one
    it entered last: it was waiting there too."""
    inside = {r: what for r, (_, what) in launch.slots().items()}
    inside.update({r: m["last_collective"] for r, m in errors.items()
                   if r not in inside and m.get("last_collective")
                   and is_cascade(m["error"])})
    return inside


def collectives_in_flight(launch, errors: dict[int, dict]) -> str:
    """Which collective (op, axis, shape) each rank was in when the run ended. The calls'
    check refuses a mismatch before it is sent (`minitp.runtime._collective_checks`);
    with it off (``comm.checks(False)``), gloo aborts the process with only its own sizes
    ("8 vs 4"), and the learner needs to see which call on which rank disagreed."""
    inside = _collectives_entered(launch, errors)
    if not inside:
        return ""
    lines = [f"  rank {r}: {what}" for r, what in sorted(inside.items())]
    return ("\nthe collective each rank was in (every rank of a group must call the same "
            "one, with the same shape):\n" + "\n".join(lines))


def raise_timeout(launch, waiting: dict[int, str]) -> None:
    finished = sorted(r for r, m in launch.messages.items() if m["status"] == "ok")
    lines = [f"  rank {r}: waiting in {op}" for r, op in sorted(waiting.items())]
    asked = getattr(launch, "asked", None) or range(launch.world_size)  # a session's cell: some
    others = [r for r in asked if r not in waiting and r not in finished]
    if finished:
        lines.append(f"  ranks {finished}: had already returned from the function")
    if len(asked) < launch.world_size:
        lines.append(f"  ranks {[r for r in range(launch.world_size) if r not in asked]}: "
                     "not asked to run this cell")
    if others:
        lines.append(f"  ranks {others}: busy outside any collective")
    # what each rank's ring holds, read from shared memory: a rank that never reported
    # (stuck in a loop, or timed out after the others) is in the table too
    rings = _flight_recorder.read(getattr(launch, "flight", None), launch.world_size)
    table = _flight_recorder.report(rings)
    raise CollectiveTimeout(
        f"a collective was not joined by every rank within timeout={launch.timeout:g} s:\n"
        + "\n".join(lines)
        + "\nEvery rank of a group must call the same collectives in the same order."
        + (f"\n{table}" if table else ""),
        waiting=dict(sorted(waiting.items())),
        finished=finished,
        last_collectives=rings,
    )


def is_cascade(error_text: str) -> bool:
    """Errors that are echoes of another rank's failure (its sockets went away)."""
    last = error_text.strip().splitlines()[-1] if error_text.strip() else ""
    return any(pattern in last for pattern in _CASCADE_PATTERN)


def tail(text: str, lines: int = 25) -> str:
    kept = text.rstrip().splitlines()
    if len(kept) > lines:
        kept = ["  ..."] + kept[-lines:]
    return "\n".join(kept)


def _printed(message: dict) -> str:
    printed = message.get("stdout", "").rstrip()
    return f"\n--- it printed ---\n{printed}" if printed else ""
