"""The timeline at the size a notebook and the run directory show it: labels that
say layer, op and axis and are big enough to read, compute regions grey only where
the rank computed (never under a collective it waited in), and posted-then-waited
operations drawn thin, not as a block that claims the rank was busy sending. Read back
from the drawn figure."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from minitp.course import viz  # noqa: E402
from minitp.course.viz.timeline import IN_FLIGHT, MIN_FONT  # noqa: E402
from minitp.runtime.trace import Event  # noqa: E402


def ev(rank, op, start_ms, end_ms, phase="fwd", label="", axis="tp", peer=None, nbytes=16384):
    comm = op != "compute"
    return Event(rank=rank, op=op, axis=axis if comm else "", shape=(nbytes // 4,),
                 dtype="float32", nbytes=nbytes if comm else 0,
                 model_bytes=nbytes if comm else 0, start=start_ms / 1e3,
                 end=end_ms / 1e3, phase=phase, label=label, peer=peer)


def pipeline_step():
    """Two ranks, as one step of a pipeline looks: a forward region holding two
    layers' collectives, a send posted at its end and waited after the backward,
    a blocking receive of the gradient, the backward region."""
    trace = []
    for rank in (0, 1):
        trace += [
            ev(rank, "compute", 0, 40, label="F0"),
            ev(rank, "all_gather", 2, 18, label="layer0"),
            ev(rank, "reduce_scatter", 20, 38, label="layer1"),
            ev(rank, "send", 41, 190, axis="p2p", peer=2 + rank),  # posted, waited at the end
            ev(rank, "recv", 42, 100, axis="p2p", peer=2 + rank, phase="bwd"),  # blocking
            ev(rank, "compute", 100, 180, phase="bwd", label="B0"),
            ev(rank, "all_gather", 110, 140, phase="bwd", label="layer1"),
            ev(rank, "all_reduce", 192, 196, phase="", axis="pp", nbytes=8, label="batch loss"),
        ]
    return trace


def test_labels_say_layer_op_and_axis_and_are_legible():
    fig = viz.timeline(pipeline_step())
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.texts if t.get_gid() == "label-rank0"]
    assert "F0" in labels and "B0" in labels  # the regions, named in their strip
    assert "layer1 all-gather tp" in labels  # 30 ms: room for layer, op and axis
    wide = viz.timeline(pipeline_step(), width=16).axes[0]
    assert "layer1 all-gather tp 16 KiB" in [t.get_text() for t in wide.texts]
    assert any(t.startswith("recv←2") for t in labels)
    assert min(t.get_fontsize() for t in ax.texts) >= MIN_FONT


def test_a_posted_send_is_thin_and_the_blocking_recv_is_not():
    fig = viz.timeline(pipeline_step())
    ax = fig.axes[0]
    rank0 = [p for p in ax.patches if p.get_gid() == "rank0"]
    assert len(rank0) == 8  # one bar per event still
    by_start = {round(p.get_x()): p for p in rank0}
    send, recv, region, gather = by_start[41], by_start[42], by_start[0], by_start[2]
    assert send.get_width() > 100 and send.get_height() < 0.15  # thin: in flight
    assert recv.get_height() > 2 * send.get_height()  # the rank waited here: a block
    # the region's span is framed in its name strip, above its collectives, not across them
    # (rank 0 at the top: y grows downward)
    assert region.get_width() >= 40 and region.get_y() + region.get_height() <= gather.get_y()
    # grey only where the rank computed: the forward region F0 (0-40 ms) minus its two
    # collectives (2-18, 20-38 ms)
    computing = sorted((round(p.get_x()), round(p.get_x() + p.get_width())) for p in ax.patches
                       if p.get_gid() == "computing-rank0" and p.get_x() < 50)
    assert computing == [(0, 2), (18, 20), (38, 40)], computing
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert IN_FLIGHT in legend and "outside forward/backward" in legend
    assert "neither" not in legend
    # the send's label is not drawn across the step
    assert not any(t.get_text().startswith("send") for t in ax.texts)


def test_a_sendrecv_pair_stays_two_blocking_bars():
    trace = [ev(0, "send", 5, 15, axis="p2p", peer=1), ev(0, "recv", 5, 16, axis="p2p", peer=1)]
    patches = viz.timeline(trace).axes[0].patches
    assert len(patches) == 2 and all(p.get_height() > 0.3 for p in patches)


def test_eight_ranks_at_the_run_directorys_size_keep_readable_labels():
    base = [e for e in pipeline_step() if e.rank == 0]
    trace = [Event(**{**e.__dict__, "rank": r}) for r in range(8) for e in base]
    fig = viz.timeline(trace)
    assert fig.get_figheight() >= 0.7 * 8
    sizes = [t.get_fontsize() for t in fig.axes[0].texts]
    assert sizes and min(sizes) >= MIN_FONT
