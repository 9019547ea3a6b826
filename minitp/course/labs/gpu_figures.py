"""Lab: the GPU figures recorded by `bench/gpu_figures.py`, read back for lessons 01, 07, 16.

The bench writes one JSON file per run into ``bench/results/figures-<device>.json``:
the device (its name and kind, "cuda" or "cpu"), torch, CUDA and NCCL versions,
the date, the command line, and per lesson a list of measurements, each with
the backend and device it actually ran on. A lesson shows the newest run whose
device kind is "cuda", and of it only the measurements that ran on a GPU (on a
one-GPU node the two-rank runs fall back to gloo on the CPU: those are not GPU
figures).

    show("16", published="Shoeybi et al. 2019, Fig. 5")   # prints the figure, or says none

Nothing here measures; it reads what a run measured, and says when and where.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..paths import repo_root

RESULTS = repo_root() / "bench" / "results"
LESSONS = ("01", "07", "16")


def runs(folder: Path | None = None) -> list[dict]:
    """Every recorded run in ``folder`` (default ``bench/results``), oldest first."""
    found = [json.loads(p.read_text(encoding="utf-8"))
             for p in sorted(Path(folder or RESULTS).glob("figures-*.json"))]
    return sorted(found, key=lambda record: record["date"])


def newest_gpu_run(folder: Path | None = None) -> dict | None:
    """The newest run recorded on a CUDA device, or None when there is none (a
    ``--quick`` run checks the script; its numbers are not figures)."""
    gpu = [record for record in runs(folder)
           if record["device_kind"] == "cuda" and not record.get("quick")]
    return gpu[-1] if gpu else None


def gpu_rows(record: dict, lesson: str) -> list[dict]:
    """A run's measurements for ``lesson`` that ran on a GPU."""
    if lesson not in LESSONS:
        raise ValueError(f"lesson must be one of {LESSONS}, got {lesson!r}")
    return [row for row in record["figures"].get(lesson, [])
            if row["device"].startswith("cuda")]


def label(record: dict) -> str:
    return (f"GPU, recorded {record['date'][:10]} on {record['device_name']} "
            "by bench/gpu_figures.py")


def not_recorded(published: str) -> str:
    return ("No GPU run of bench/gpu_figures.py has been recorded yet; the GPU figures in "
            f"this lesson are the published ones ({published}).")


def lines(lesson: str, published: str, folder: Path | None = None) -> list[str]:
    """What `show` prints: the label and one line per GPU measurement, or why there is none."""
    record = newest_gpu_run(folder)
    rows = gpu_rows(record, lesson) if record else []
    if not rows:
        if record is None:
            return [not_recorded(published)]
        return [f"{label(record)}: no {lesson} figure ran on a GPU in that run "
                f"(too few GPUs for it); the GPU figures here are the published ones "
                f"({published})."]
    return [label(record) + ":", *(_FORMAT[lesson](row) for row in rows)]


def show(lesson: str, published: str, folder: Path | None = None) -> None:
    print("\n".join(lines(lesson, published, folder)))


# --------------------------------------------------------------------------- one line per row
def _line_01(row: dict) -> str:
    bandwidth = (f"1/β = {1 / row['beta_s_per_byte'] / 1e9:.1f} GB/s"
                 if row["beta_s_per_byte"] > 0 else "β not resolved")
    return (f"  all-reduce, world {row['world']} ({row['backend']}): "
            f"α = {row['alpha_s'] * 1e6:.1f} µs, {bandwidth}")


def _line_07(row: dict) -> str:
    return (f"  t = {row['tp']}, {row['setting']:<20} ({row['backend']}): "
            f"{row['seconds'] * 1e3:8.2f} ms per forward + backward (median)")


def _line_16(row: dict) -> str:
    return (f"  t = {row['tp']} (h {row['d_model']}, {row['n_layer']} layers, {row['backend']}): "
            f"{row['seconds'] * 1e3:8.2f} ms per step, {row['comm_share']:.0%} in collectives")


_FORMAT = {"01": _line_01, "07": _line_07, "16": _line_16}
