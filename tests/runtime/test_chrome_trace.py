"""`run.trace.to_chrome`: the file loads back as Chrome trace-event JSON and holds exactly
the trace's events (one complete "X" event each, µs, on a lane that overlaps nothing);
a path that cannot be written is refused in one line. In process: a trace built by hand."""

from __future__ import annotations

import itertools
import json

import pytest

from minitp.runtime.chrome_trace import Trace, check_writable, chrome_events
from minitp.runtime.trace import Event


def _event(rank, op, start, end, **kw):
    comm = op != "compute"
    return Event(rank=rank, op=op, axis=kw.pop("axis", "tp" if comm else ""),
                 shape=(4, 2) if comm else (), dtype="float32" if comm else "",
                 nbytes=32 if comm else 0, model_bytes=16 if comm else 0, start=start, end=end,
                 group_ranks=(0, 1) if comm and "peer" not in kw else (), **kw)


TRACE = Trace(sorted([
    _event(0, "compute", 0.0, 0.002, label="F0", phase="fwd"),
    _event(0, "all_reduce", 0.001, 0.004, sent_bytes=20),  # posted during F0: overlaps it
    _event(0, "all_gather", 0.002, 0.003),  # in flight beside the all-reduce: a second lane
    _event(1, "all_reduce", 0.0015, 0.004, sent_bytes=20),
    _event(1, "send", 0.005, 0.006, axis="p2p", peer=0),
], key=lambda e: (e.start, e.rank)))


def test_the_file_holds_exactly_the_traces_events(tmp_path):
    path = TRACE.to_chrome(tmp_path / "trace.json")
    document = json.loads((tmp_path / "trace.json").read_text())
    assert path == str(tmp_path / "trace.json")
    spans = [e for e in document["traceEvents"] if e["ph"] == "X"]
    as_written = sorted((e["pid"], e["name"], e["ts"], e["dur"]) for e in spans)
    expected = sorted((e.rank, e.op if e.is_comm else e.label, round(e.start * 1e6, 3),
                       round(e.duration * 1e6, 3)) for e in TRACE)
    assert as_written == expected
    reduce = next(e for e in spans if e["name"] == "all_reduce" and e["pid"] == 0)
    assert reduce["cat"] == "collective"
    assert reduce["args"] == {"axis": "tp", "group": [0, 1], "bytes": 32, "model_bytes": 16,
                                   "sent_bytes": 20, "shape": [4, 2], "dtype": "float32",
                                   "phase": "", "label": ""}
    send = next(e for e in spans if e["name"] == "send")
    assert (send["cat"], send["args"]["peer"]) == ("p2p", 0)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in document["traceEvents"]
             if e["name"] == "thread_name"}
    assert names == {(0, 0): "compute", (0, 1): "communication", (0, 3): "communication 2",
                     (1, 1): "communication"}


def test_no_two_events_of_one_lane_overlap():
    """A viewer stacks a thread's events by nesting: partly overlapping ones would be
    drawn wrong (or dropped), so events in flight at once go to lanes of their own."""
    spans = [e for e in chrome_events(TRACE) if e["ph"] == "X"]
    for lane in {(e["pid"], e["tid"]) for e in spans}:
        on_it = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans
                       if (e["pid"], e["tid"]) == lane)
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(on_it))


def test_a_path_that_cannot_be_written_is_one_line(tmp_path):
    for path, said in ((tmp_path / "no" / "such" / "trace.json", "cannot write a trace to"),
                       (tmp_path, "is a folder, not a file")):
        with pytest.raises(ValueError, match=said) as info:
            check_writable(path)
        assert "\n" not in str(info.value)
        with pytest.raises(ValueError, match=said):
            TRACE.to_chrome(path)
    check_writable(tmp_path / "fine.json")
    assert not (tmp_path / "fine.json").exists()  # only tried: nothing left behind
