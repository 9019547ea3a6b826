"""Lab: when a rank dies — a rank killed on purpose and the job restarted by torchrun, who
writes what in a sharded checkpoint, a synchronous save against an asynchronous one, and
how often to save (lesson 14).

The runs are `minitp.checkpoint.measure`'s and `minitp.train.restart`'s (real processes:
torchrun's agent and its workers, `mt.launch`'s ranks); this module reads what they return
and draws it:

* `torchrun_lines`: the lines torchrun's agent logged when the rank died, without their
  clock, thread and process numbers (they differ every run);
* `loss_curves`: the killed-and-restarted run's losses on the uninterrupted run's;
* `writes_by_rank` / `writes_figure`: the bytes each rank wrote, by family (model,
  exp_avg, exp_avg_sq), read from the manifest (MEASURED: the files' sizes); `read_at`:
  the bytes each rank of another layout reads, counted by the loader;
* `save_timeline`: rank 0's steps with no save, a synchronous and an asynchronous one,
  and the checkpoint's snapshot and write events (MEASURED on this machine);
* `intervals`: how often a real cluster should save, by Young's and Daly's intervals
  from `minitp.calc.reliability.checkpointing` (a MODEL, sourced there).
"""

from __future__ import annotations

import re

from ...calc.reliability import checkpointing as ckpt
from ..viz._style import COMPUTE_COLOR, _new_figure, human_bytes, rank_color

FAMILIES = ("model", "exp_avg", "exp_avg_sq")
_AGENT = re.compile(r"^[WEI]\d{4} [\d:.]+ \d+ torch/distributed/elastic/\S+\] (.*)$")


def torchrun_lines(log: str) -> list[str]:
    """torchrun's own lines in a job's log (its warnings and errors: the worker that died,
    the group torn down), with process ids and the interpreter's path taken out."""
    out = []
    for line in log.splitlines():
        m = _AGENT.match(line.strip())
        if m:
            text = re.sub(r"\b(pid:? |process )\d+", r"\1<pid>", m.group(1))
            out.append(re.sub(r"binary: \S+", "binary: python", text))
    return out


def loss_curves(result: dict, title: str | None = None):
    """The uninterrupted run's loss per step, and the restarted run's from the step it
    resumed at, on the same axes; the step the rank was killed after, marked."""
    fig = _new_figure((6.4, 3.2))
    ax = fig.add_subplot()
    whole, resumed = result["uninterrupted"], result["resumed"]
    ax.plot(list(whole), list(whole.values()), "-o", color=rank_color(0), lw=2.5, ms=7,
            label="never interrupted", zorder=1)
    ax.plot(list(resumed), list(resumed.values()), "x", color=rank_color(1), ms=11, mew=2.5,
            label=f"killed after step {result['killed_at']}, resumed from step "
                  f"{result['resumed_from']}", zorder=2)
    ax.axvline(result["killed_at"] + 0.5, color="#999999", ls="--", lw=1)
    ax.text(result["killed_at"] + 0.55, max(whole.values()), "SIGKILL", color="#666666",
            va="top", fontsize=9)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(title or "A rank killed mid-run: the restarted job lands on the same curve")
    ax.legend(frameon=False, fontsize=9)
    return fig


def writes_by_rank(manifest: dict) -> list[dict]:
    """{"rank", "model", "exp_avg", "exp_avg_sq", "total"}: bytes each rank's file holds."""
    rows = []
    for entry in sorted(manifest["files"].values(), key=lambda e: e["rank"]):
        row = {"rank": entry["rank"], **dict.fromkeys(FAMILIES, 0)}
        for held in entry["holds"]:
            row[held["tensor"].split("/", 1)[0]] += held["bytes"]
        row["total"] = entry["bytes"]
        rows.append(row)
    return rows


def writes_figure(rows: list[dict], read: dict | None = None, title: str | None = None):
    """Bytes each rank wrote, stacked by family; with `read` (`measure.bytes_read_per_rank`),
    beside them the bytes each rank of the new layout read and a dense load's."""
    panels = 2 if read else 1
    fig = _new_figure((4.2 * panels, 3.2))
    axes = fig.subplots(1, panels, squeeze=False)[0]
    ax = axes[0]
    shades = {"model": "#0072B2", "exp_avg": "#E69F00", "exp_avg_sq": "#F0E442"}
    for row in rows:
        bottom = 0
        for family in FAMILIES:
            ax.bar(row["rank"], row[family], bottom=bottom, color=shades[family],
                   label=family if row["rank"] == 0 else None)
            bottom += row[family]
    ax.set_xticks([row["rank"] for row in rows])
    ax.set_xlabel("rank of the saving layout")
    ax.set_ylabel("bytes written")
    ax.set_title("who writes what", fontsize=10)
    ax.legend(frameon=False, fontsize=8)
    if read:
        ax = axes[1]
        ranks = range(len(read["per_rank"]))
        ax.bar(ranks, read["per_rank"], color=COMPUTE_COLOR, label="read (measured)")
        ax.axhline(read["dense"], color="#D55E00", ls="--", label="a dense load, every rank")
        ax.set_xticks(list(ranks))
        ax.set_xlabel("rank of the loading layout")
        ax.set_ylabel("bytes read")
        ax.set_title("who reads what", fontsize=10)
        ax.legend(frameon=False, fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def read_at(step_dir: str, dp: int = 4, tp: int = 1, zero_stage: int = 1) -> dict:
    """Load the sharded checkpoint `step_dir` on dp·tp real ranks at (dp, tp, ZeRO stage):
    `minitp.checkpoint.measure.bytes_read_per_rank` — {"per_rank": the bytes each rank read
    (MEASURED: the loader counts its reads), "dense": the files' total, what every rank of a
    dense load reads}."""
    from ...checkpoint import measure

    return measure.bytes_read_per_rank(step_dir, dp=dp, tp=tp, zero_stage=zero_stage)


def save_timeline(timing: dict, rank: int = 0, title: str | None = None):
    """Rank `rank`'s steps in each mode (no save, synchronous, asynchronous), one row each,
    with the checkpoint's snapshot and write events under its row (`measure.save_timing`)."""
    modes = ("none", "sync", "async")
    fig = _new_figure((8.0, 3.0))
    ax = fig.add_subplot()
    events = [e for e in timing["events"] if e.rank == rank]
    for row, mode in enumerate(modes):
        spans = timing["spans"][mode]
        origin = spans[0][0]
        y = 3 * (len(modes) - 1 - row)
        for i, (a, b) in enumerate(spans):
            ax.broken_barh([(a - origin, b - a)], (y + 1.1, 0.8), color=COMPUTE_COLOR,
                           edgecolor="white")
            ax.text((a + b) / 2 - origin, y + 1.5, str(i + 1), ha="center", va="center",
                    fontsize=7, color="white")
        end = spans[-1][1]
        for e in events:
            if origin <= e.start <= end + 5.0 and _in_mode(e, spans, timing, mode):
                color = "#D55E00" if e.label.endswith("snapshot") else "#56B4E9"
                lane = y + 0.15 if e.label.endswith("snapshot") else y - 0.75
                ax.broken_barh([(e.start - origin, e.end - e.start)], (lane, 0.8), color=color)
        ax.text(-0.01, y + 1.5, {"none": "no save", "sync": "synchronous",
                                 "async": "asynchronous"}[mode], ha="right", va="center",
                transform=ax.get_yaxis_transform(), fontsize=9)
    ax.broken_barh([(0, 0)], (0, 0), color=COMPUTE_COLOR, label="step")
    ax.broken_barh([(0, 0)], (0, 0), color="#D55E00", label="snapshot (the step waits)")
    ax.broken_barh([(0, 0)], (0, 0), color="#56B4E9", label="write to disk")
    ax.set_yticks([])
    ax.set_xlabel("seconds since the mode's first step (this machine, measured)")
    ax.set_title(title or f"rank {rank}: saving every {timing.get('every', 2)} steps", fontsize=10)
    ax.legend(frameon=False, fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    return fig


def _in_mode(event, spans, timing, mode) -> bool:
    """Whether `event` belongs to `mode`: after its first step and before the next mode's."""
    modes = ("none", "sync", "async")
    later = modes[modes.index(mode) + 1:]
    start = spans[0][0]
    stop = timing["spans"][later[0]][0][0] if later else float("inf")
    return start <= event.start < stop


def save_stalls(timing: dict, rank: int = 0) -> dict:
    """For the "sync" and "async" modes, from rank `rank`'s checkpoint events (MEASURED):
    the mean snapshot and write milliseconds, what each save blocked its step for (sync:
    snapshot and write; async: the snapshot), and how many writes ended after the step
    that started them had ended (they ran beside the next steps)."""
    out = {}
    for mode in ("sync", "async"):
        spans = timing["spans"][mode]
        mine = [e for e in timing["events"] if e.rank == rank and _in_mode(e, spans, timing,
                                                                           mode)]
        snaps = [e.end - e.start for e in mine if e.label.endswith("snapshot")]
        writes = [e for e in mine if e.label.endswith("write")]
        step_end = {i: b for i, (a, b) in enumerate(spans)}
        later = sum(any(a <= w.start < b for a, b in spans) and
                    w.end > next(step_end[i] for i, (a, b) in enumerate(spans) if a <= w.start < b)
                    for w in writes)
        mean = lambda xs: 1e3 * sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        snapshot, write = mean(snaps), mean([w.end - w.start for w in writes])
        out[mode] = {"saves": len(snaps), "snapshot_ms": snapshot, "write_ms": write,
                     "blocked_ms": snapshot + write if mode == "sync" else snapshot,
                     "writes": len(writes), "writes_past_their_step": later}
    return out


def intervals(record: ckpt.FailureRecord = ckpt.LLAMA3_405B, gb_per_gpu=(0.5, 1, 2, 4),
              write_bytes_per_s: float = 2e12) -> list[dict]:
    """For a job of `record.units` GPUs failing at the record's rate: per GB written by
    each GPU, the save's seconds, Young's and Daly's intervals and the first-order fraction
    of the run lost at Daly's. A MODEL (`minitp.calc.reliability.checkpointing`)."""
    rows = []
    for gb in gb_per_gpu:
        plan = ckpt.save_plan(record.units * gb * 1e9, write_bytes_per_s, record.units,
                              record.rate_per_unit_hour)
        rows.append({"gb_per_gpu": gb, "save_s": plan.save_s, "mtbf_h": plan.mtbf_s / 3600,
                     "young_min": plan.young_s / 60, "daly_min": plan.daly_s / 60,
                     "lost": plan.lost_daly})
    return rows


__all__ = ["FAMILIES", "human_bytes", "intervals", "loss_curves", "read_at", "save_stalls",
           "save_timeline", "torchrun_lines", "writes_by_rank", "writes_figure"]
