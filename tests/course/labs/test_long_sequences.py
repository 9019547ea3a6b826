"""Lesson 08's lab and pictures (minitp.course.labs.long_sequences, minitp.course.viz.ring).

* a saved tensor's shape says how much of the sequence it holds;
* the lab's ring, contiguous and load-balanced, at cp = 2 on real processes: each
  rank's output equals plain causal attention (float64), and the blocks it counted
  are the ones the causal mask leaves to it (3 and 7 contiguous, 5 and 5 balanced);
* the ring picture draws one arrow per send of a trace, and refuses a trace
  without sends; the causal-work picture draws each split's grid and bars.
(The memory rows are measured in the lesson's notebook, which asserts them.)
"""

import pytest

import minitp.course.viz as viz
from minitp.course.labs import long_sequences as lab
from minitp.runtime.trace import Event

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def test_sequence_share_reads_the_shape():
    assert lab.sequence_share((1, 2, 64, 64), 64, 32) == "s x s"
    assert lab.sequence_share((64, 24), 64, 32) == "whole"
    assert lab.sequence_share((1, 32, 24), 64, 32) == "split"
    assert lab.sequence_share((), 64, 32) == "other"


def test_chunks_of_each_split():
    assert [lab.chunks_of(r, 2, balanced=False) for r in range(2)] == [(0, 1), (2, 3)]
    assert [lab.chunks_of(r, 2, balanced=True) for r in range(2)] == [(0, 3), (1, 2)]


def test_the_labs_ring_is_causal_attention_and_counts_each_ranks_blocks():
    work = lab.ring_work(cp=2, shape=(1, 2, 16, 4), timeout=60)
    assert [w["blocks"] for w in work["contiguous"]] == [3, 7]
    assert [w["blocks"] for w in work["load-balanced"]] == [5, 5]
    for ranks in work.values():
        for w in ranks:
            assert w["error"] < 1e-12, w
            assert w["scores"] == w["blocks"] * 2 * 4 * 4  # heads x chunk x chunk per block


def _send(rank, peer, start, label="layer0.ring K/V", phase="fwd"):
    return Event(rank=rank, op="send", axis="cp", shape=(4,), dtype="float32", nbytes=16,
                 model_bytes=16, start=start, end=start + 0.001, phase=phase, label=label,
                 peer=peer)


def test_the_ring_picture_draws_one_cell_per_send_rank_by_step():
    events = [_send(r, (r + 1) % 3, 0.01 * r + 0.1 * i, phase=("fwd", "bwd")[i])
              for i in range(2) for r in range(3)]
    events.append(Event(rank=0, op="all_reduce", axis="tp", shape=(4,), dtype="float32",
                        nbytes=16, model_bytes=16, start=0.0, end=0.1))
    fig = viz.ring(events)
    right = fig.axes[1]
    cells = [t for t in right.texts if t.get_gid() == "send"]
    assert len(cells) == 6
    # row = rank, column = its i-th send; each cell names the receiver
    assert sorted((round(t.get_position()[1]), round(t.get_position()[0] - 0.45), t.get_text())
                  for t in cells) == [(r, i, f"→{(r + 1) % 3}") for r in range(3) for i in (0, 1)]
    assert {t.get_gid() for t in fig.axes[0].texts} >= {"pair-0-1", "pair-1-2", "pair-2-0"}
    with pytest.raises(ValueError, match="no sends of a ring over .cp."):
        viz.ring(events[-1:])


def test_the_causal_work_picture_draws_both_splits():
    work = {"contiguous": [{"chunks": (0, 1), "scores": 3}, {"chunks": (2, 3), "scores": 7}],
            "load-balanced": [{"chunks": (0, 3), "scores": 5}, {"chunks": (1, 2), "scores": 5}]}
    fig = viz.causal_work(work)
    assert len(fig.axes) == 3
    assert len(fig.axes[0].patches) == len(fig.axes[1].patches) == 10  # 4 x 5 / 2 blocks
    heights = [p.get_height() for p in fig.axes[2].patches]
    assert heights == [3, 7, 5, 5]
