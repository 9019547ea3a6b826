"""``%load_ext minitp``: live ranks in notebook cells, over `mt.session`.

    %ranks start 4 --mesh dp=2,tp=2      # [--backend auto|gloo|nccl] [--timeout 30]
    %%ranks                               # the cell runs on every rank, in its namespace
    %%ranks 0,2                           # ... on ranks 0 and 2 only
    %ranks                                # the session, and whether it runs
    %ranks restart / %ranks stop

What each rank printed, and its last line's value, come back labelled ``[rank r]``; the
cell's `Cell` (a `Run`: ``_ranks.trace`` for `mt.viz.timeline`, ``_ranks[r]``) is left in
``_ranks``. Kept out of `minitp.runtime.session` so that only a kernel imports IPython.
"""

from __future__ import annotations

import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from .session import Session

USAGE = ("%ranks start N [--mesh dp=2,tp=2] [--backend auto] [--timeout 30] | "
         "%ranks restart | %ranks stop | %%ranks [0,2] (a cell)")
_OPTIONS = {"--mesh": "mesh", "--backend": "backend", "--timeout": "timeout"}


def parse_start(words: list[str]) -> tuple[int, dict]:
    """``["4", "--mesh", "dp=2,tp=2"]`` -> (4, {"mesh": "dp=2,tp=2"}); a UsageError else."""
    if not words or not words[0].isdigit() or int(words[0]) < 1:
        raise UsageError(f"say how many ranks: {USAGE}")
    options, rest = {}, words[1:]
    while rest:
        flag, *value = rest[0].split("=", 1) if rest[0].startswith("--") else (rest[0],)
        if flag not in _OPTIONS:
            raise UsageError(f"unknown option {rest[0]!r}: {USAGE}")
        if value:
            options[_OPTIONS[flag]], rest = value[0], rest[1:]
        elif len(rest) > 1:
            options[_OPTIONS[flag]], rest = rest[1], rest[2:]
        else:
            raise UsageError(f"{flag} needs a value: {USAGE}")
    if "timeout" in options:
        try:
            options["timeout"] = float(options["timeout"])
        except ValueError:
            raise UsageError(f"--timeout {options['timeout']!r}: a number of seconds") from None
    return int(words[0]), options


def parse_ranks(line: str) -> list[int] | None:
    """``"0,2"`` -> [0, 2]; ``""`` -> None (every rank)."""
    line = line.strip()
    if not line:
        return None
    try:
        return [int(r) for r in line.replace(" ", ",").split(",") if r]
    except ValueError:
        raise UsageError(f"%%ranks {line}: name the ranks as 0,2 (or nothing: all)") from None


@magics_class
class RanksMagics(Magics):
    session: Session | None = None
    cells = 0

    @line_cell_magic
    def ranks(self, line: str, cell: str | None = None):
        if cell is not None:
            return self._cell(line, cell)
        words = shlex.split(line)
        if not words:
            print(self.session if self.session is not None else f"no ranks yet: {USAGE}")
        elif words[0] == "start":
            world_size, options = parse_start(words[1:])
            if self.session is not None:
                self.session.close()
            RanksMagics.session = Session(world_size, **options)
            # No timing here: a notebook's output must read the same on every run.
            print(f"{world_size} ranks started ({self.session.backend}"
                  + (f", mesh {self.session.mesh}" if self.session.mesh else "") + ")")
        elif words[0] in ("stop", "restart"):
            if self.session is None:
                raise UsageError(f"no ranks to {words[0]}: {USAGE}")
            if words[0] == "stop":
                self.session.close()
                RanksMagics.session = None
                print("ranks stopped")
            else:
                self.session.restart()
                print(f"{self.session.world_size} ranks restarted (namespaces empty)")
        else:
            raise UsageError(f"%ranks {line}: {USAGE}")

    def _cell(self, line: str, cell: str):
        if self.session is None:
            raise UsageError(f"start the ranks first: {USAGE}")
        RanksMagics.cells += 1
        try:
            # One line ahead for the "%%ranks" line: a traceback's line is the cell's own.
            result = self.session.exec("\n" + cell, parse_ranks(line),
                                       name=f"<ranks cell {self.cells}>")
        except Exception as error:  # the rank's traceback is the message; ours would bury it
            raise error.with_traceback(None) from None
        self.shell.user_ns["_ranks"] = result
        result.show()


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(RanksMagics)


def unload_ipython_extension(ipython) -> None:
    if RanksMagics.session is not None:
        RanksMagics.session.close()
        RanksMagics.session = None
