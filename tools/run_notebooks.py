"""Re-execute the course notebooks in place, so their committed outputs are fresh.

    python tools/run_notebooks.py                      # every notebooks/NN_*.ipynb, in order
    python tools/run_notebooks.py 01_collectives       # just these (name, file name or path)
    python tools/run_notebooks.py --timeout 300 00 01  # a longer limit per cell; a prefix is enough

Each notebook runs in a fresh ``python3`` kernel with notebooks/ as its working
directory (as when a learner opens it in JupyterLab), and is written back only
if every cell ran without an error. Check the result with nbval afterwards:

    python -m pytest notebooks --nbval --nbval-sanitize-with notebooks/sanitize.cfg -o addopts="" -q
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def find(names: list[str]) -> list[Path]:
    every = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return every
    chosen = []
    for name in names:
        path = Path(name)
        if path.suffix == ".ipynb" and path.exists():
            chosen.append(path.resolve())
            continue
        stem = path.name.removesuffix(".ipynb")
        matches = [p for p in every if p.stem == stem or p.stem.startswith(stem)]
        if len(matches) != 1:
            known = ", ".join(p.stem for p in every) or "none"
            how = "matches several" if matches else "matches no notebook"
            raise SystemExit(f"{name!r} {how} (the notebooks: {known})")
        chosen.append(matches[0])
    return chosen


def execute(path: Path, timeout: int, kernel: str) -> float:
    """Run every cell of `path` and write it back; return the seconds it took."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name=kernel,
        timeout=timeout,
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,  # no per-cell timestamps: they would change every run
    )
    started = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - started
    nbformat.write(nb, path)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebooks to run (default: all)")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per cell (default 180)")
    parser.add_argument("--kernel", default="python3", help="kernel name (default python3)")
    args = parser.parse_args(argv)
    failed = []
    total = 0.0
    for path in find(args.names):
        try:
            seconds = execute(path, args.timeout, args.kernel)
        except CellExecutionError as exc:
            print(f"{path.name:<32} FAILED (not written back)", flush=True)
            print(str(exc)[-3000:], file=sys.stderr)
            failed.append(path.name)
            continue
        total += seconds
        print(f"{path.name:<32} {seconds:6.1f} s", flush=True)
    print(f"{'total':<32} {total:6.1f} s" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
