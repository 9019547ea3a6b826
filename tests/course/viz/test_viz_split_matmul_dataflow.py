"""The pictures of lessons 02 and 03: `viz.split_matmul` and `viz.tp_dataflow`.

As in test_viz.py, the assertions read the drawn figure back (its patches and
texts), so a picture that loses a block, a mapping or a count fails here.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import minitp as mt  # noqa: E402
from minitp.course import viz  # noqa: E402
from minitp.runtime.trace import Event  # noqa: E402


def patches(fig, prefix):
    return [p for p in fig.axes[0].patches if (p.get_gid() or "").startswith(prefix)]


def text_of(fig, gid):
    found = [t.get_text() for t in fig.axes[0].texts if t.get_gid() == gid]
    assert len(found) == 1, f"{gid}: {found}"
    return found[0]


def all_texts(fig):
    return [t.get_text() for t in fig.axes[0].texts]


def tint(rank):
    return mcolors.to_hex(viz._tint(viz.rank_color(rank)))


# --------------------------------------------------------------------------- split_matmul
def test_split_matmul_draws_both_splits_in_rank_colours():
    fig = viz.split_matmul(4)
    for kind, blocks in (("column", ("A", "Y")), ("row", ("X", "A", "term"))):
        for block in blocks:
            for r in range(4):
                (patch,) = patches(fig, f"{kind}-{block}{r}")
                assert mcolors.to_hex(patch.get_facecolor()) == tint(r)
    (x,) = patches(fig, "column-X")  # the column split's X is whole, on every rank
    assert mcolors.to_hex(x.get_facecolor()) != tint(0)
    texts = all_texts(fig)
    assert "$X_2A_2$" in texts and "$Y_3$" in texts and "rank 3" in texts
    assert any(t.startswith("Column split") for t in texts)
    assert any("X_0A_0 + X_1A_1 + \\cdots + X_{3}A_{3}" in t for t in texts)
    assert plt.get_fignums() == []


def test_split_matmul_one_panel_and_small_p():
    fig = viz.split_matmul(2, "row", title="mine")
    assert not patches(fig, "column-")
    assert len(patches(fig, "row-term")) == 2
    assert "mine" in all_texts(fig)
    assert any("X_0A_0 + X_1A_1$" in t for t in all_texts(fig))
    assert len(patches(viz.split_matmul(3, "column"), "column-A")) == 3


@pytest.mark.parametrize("p, split", [(0, "both"), (9, "both"), (2.0, "both"), (2, "diagonal")])
def test_split_matmul_checks_its_input(p, split):
    with pytest.raises(ValueError):
        viz.split_matmul(p, split)


# --------------------------------------------------------------------------- tp_dataflow
def ev(op, phase, start, nbytes=1024, rank=0, label="layer0"):
    return Event(rank=rank, op=op, axis="tp", shape=(nbytes // 8,), dtype="float64",
                 nbytes=nbytes, model_bytes=nbytes, start=start, end=start + 1e-4,
                 phase=phase, label=label)


def one_layer(rank=0, label="layer0"):
    """One layer's collectives in the order a real step runs them: forward g (attention),
    g (MLP); backward f (MLP, the layer's end first), f (attention)."""
    return [ev("all_reduce", "fwd", 0.1, 1024, rank, label),
            ev("all_reduce", "fwd", 0.2, 2048, rank, label),
            ev("all_reduce", "bwd", 0.3, 4096, rank, label),
            ev("all_reduce", "bwd", 0.4, 8192, rank, label)]


def test_dataflow_without_a_trace_says_what_each_mapping_does():
    fig = viz.tp_dataflow(part="block")
    assert len(patches(fig, "step-0-")) == 8 and len(patches(fig, "step-1-")) == 9
    names = [t.get_text() for t in fig.axes[0].texts if (t.get_gid() or "").endswith("-name")]
    assert names.count("$f$") == 2 and names.count("$g$") == 2
    assert {"qkv", "attention", "fc", "GELU", "LN1", "LN2"} <= set(names)
    assert text_of(fig, "comm-0-f-fwd") == "fwd: identity"
    assert text_of(fig, "comm-0-f-bwd") == "bwd: all-reduce"
    assert text_of(fig, "comm-1-g-fwd") == "fwd: all-reduce"
    assert text_of(fig, "comm-1-g-bwd") == "bwd: identity"
    assert any(t.endswith("where the conjugate mappings f and g sit") for t in all_texts(fig))
    assert plt.get_fignums() == []


def test_dataflow_places_forward_events_in_order_and_backward_in_reverse():
    trace = one_layer() + one_layer(rank=1) + [ev("all_reduce", "fwd", 0.05, 64, 0, "embedding")]
    fig = viz.tp_dataflow(trace, part="block", label="layer0", rank=0)
    assert text_of(fig, "comm-0-g-fwd") == "fwd: all-reduce 1 KiB"  # attention's g first
    assert text_of(fig, "comm-1-g-fwd") == "fwd: all-reduce 2 KiB"
    assert text_of(fig, "comm-1-f-bwd") == "bwd: all-reduce 4 KiB"  # backward: MLP's f first
    assert text_of(fig, "comm-0-f-bwd") == "bwd: all-reduce 8 KiB"
    assert text_of(fig, "comm-0-f-fwd") == "fwd: nothing"
    assert text_of(fig, "comm-1-g-bwd") == "bwd: nothing"
    title = [t for t in all_texts(fig) if t.startswith("One tensor-parallel")][0]
    assert "(layer0, rank 0): 2 all-reduces forward, 2 all-reduces backward" in title
    assert not [t for t in fig.axes[0].texts if t.get_gid() == "leftover"]


def test_dataflow_lists_events_the_mappings_do_not_account_for():
    trace = one_layer() + [ev("all_gather", "fwd", 0.25), ev("broadcast", "", 0.5)]
    fig = viz.tp_dataflow(trace, part="block", label="layer0")
    leftover = text_of(fig, "leftover")
    assert leftover.startswith("2 more communication event(s)")
    assert "broadcast (neither" in leftover
    mlp = viz.tp_dataflow(one_layer(), part="mlp")  # label None: every event of rank 0
    assert "2 more" in text_of(mlp, "leftover")


def test_dataflow_sequence_parallel_and_bad_part():
    fig = viz.tp_dataflow(part="mlp", sequence_parallel=True)
    assert text_of(fig, "comm-0-f-fwd") == "fwd: all-gather"
    assert text_of(fig, "comm-0-g-bwd") == "bwd: all-gather"
    sp = [ev("all_gather", "fwd", 0.1), ev("reduce_scatter", "fwd", 0.2),
          ev("all_gather", "bwd", 0.3), ev("reduce_scatter", "bwd", 0.4)]
    fig = viz.tp_dataflow(sp, part="attention", sequence_parallel=True)
    assert text_of(fig, "comm-0-f-fwd") == "fwd: all-gather 1 KiB"
    assert text_of(fig, "comm-0-g-fwd") == "fwd: reduce-scatter 1 KiB"
    assert text_of(fig, "comm-0-g-bwd") == "bwd: all-gather 1 KiB"
    assert text_of(fig, "comm-0-f-bwd") == "bwd: reduce-scatter 1 KiB"
    with pytest.raises(ValueError, match="part"):
        viz.tp_dataflow(part="embedding")


def _one_parallel_step():
    mesh = mt.Mesh(tp=mt.world().size)
    torch.manual_seed(0)
    ref = mt.GPT(mt.GPTConfig(vocab_size=32, seq_len=8, n_layer=2, n_head=4, d_model=16))
    model = mt.parallelize(ref, mesh)
    x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    _, loss = model(x, x)
    loss.backward()


def test_dataflow_of_a_real_parallel_gpt():
    run = mt.launch(_one_parallel_step, 2, timeout=60)
    for rank in (0, 1):
        fig = viz.tp_dataflow(run, part="block", label="layer1", rank=rank)
        title = [t for t in all_texts(fig) if t.startswith("One tensor-parallel")][0]
        assert f"(layer1, rank {rank}): 2 all-reduces forward, 2 all-reduces backward" in title
        nbytes = 2 * 8 * 16 * 4  # (B, T, h) float32
        assert text_of(fig, "comm-0-g-fwd") == f"fwd: all-reduce {viz.human_bytes(nbytes)}"
        assert not [t for t in fig.axes[0].texts if t.get_gid() == "leftover"]
    assert plt.get_fignums() == []
