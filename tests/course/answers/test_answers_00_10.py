"""Lessons 00 to 08 and 10: the mesh, collectives, tensor, sequence and context parallelism.

Every number checked here; the lessons' design questions (a letter the same for every
draw) in test_answers_choices.py. Not checked: none."""

import pytest
from answers_common import MiB, asked, close

import minitp as mt
from minitp.rules import cp_chunks

NOT_CHECKED = set()


# ---- lesson 00: the mesh -------------------------------------------------------------------

def replica_nodes_from_layout(dp, pp, tp, replica, gpus_per_node=8):
    """The nodes one replica's ranks sit on, read off `mt.layout`: the replica of data-parallel
    index `replica` is the pp groups of the ranks in its tp groups."""
    groups = mt.layout(dp=dp, pp=pp, tp=tp)
    first_stage = [g for g in groups["tp"] if g[0] < dp * tp][replica]  # stage 0's tp groups
    ranks = {r for g in groups["pp"] if g[0] in first_stage for r in g}
    assert len(ranks) == pp * tp
    return len({r // gpus_per_node for r in ranks})


def test_replica_nodes_is_the_count_mt_layout_gives():
    for q, p, right in asked("00.replica-nodes"):
        spans = {replica_nodes_from_layout(p["dp"], p["pp"], p["tp"], d) for d in range(p["dp"])}
        assert spans == {right}, (p, spans, right)  # every replica spans as many nodes
        for mistake in q.wrong:  # no usual mistake is the right number
            assert mistake.value(p) != right, (p, mistake.says)


@pytest.mark.parametrize("mesh, nodes", [((12, 4, 4), 4), ((12, 8, 2), 8), ((3, 4, 2), 3)])
def test_replica_nodes_of_the_issues_meshes(mesh, nodes):
    dp, pp, tp = mesh
    assert replica_nodes_from_layout(dp, pp, tp, 0) == nodes


def _option(q, p, letter):
    """The text of choice `letter` in a question that lists (a)-(d) in its text."""
    return q.text(p).split(f"({letter}) ")[1].split(";")[0].rstrip(".")


def test_why_tp_fastest_marks_the_node_count_mt_layout_gives_with_dp_fastest():
    for q, p, right in asked("00.why-tp-fastest"):
        # dp fastest, then tp, then pp is mt.layout's order with the names of dp and tp
        # swapped: its "dp" groups (the middle index varying) are then the tp groups
        groups = mt.layout(dp=p["tp"], pp=p["pp"], tp=p["dp"])["dp"]
        (group,) = [g for g in groups if p["rank"] in g]
        assert len(group) == p["tp"] and group[1] - group[0] == p["dp"]
        nodes = len({r // 8 for r in group})
        (megatron,) = [g for g in mt.layout(dp=p["dp"], pp=p["pp"], tp=p["tp"])["tp"]
                       if p["rank"] in g]
        assert len({r // 8 for r in megatron}) == 1 < nodes  # tp fastest: one node
        marked = _option(q, p, right)
        assert marked.startswith("tp fastest") and f"over {nodes} nodes" in marked, (p, marked)


# ---- lessons 01 to 05: collectives, tensor and sequence parallelism -------------------------

def test_01_ring_bytes_and_time():
    for _, p, right in asked("01.ring-bytes"):
        assert close(right, mt.calc.ring_wire_bytes("all_reduce", p["mib"] * MiB, p["n"]))
    for _, p, right in asked("01.ring-time"):
        steps, sent = 2 * (p["n"] - 1), mt.calc.ring_wire_bytes("all_reduce", p["mib"] * MiB,
                                                                  p["n"])
        assert close(right, (steps * 5e-6 + sent / 450e9) * 1e6)


def test_02_mlp_params_counts_the_split_layers():
    torch = pytest.importorskip("torch")
    for _, p, right in asked("02.mlp-params"):
        h, t = p["h"], p["t"]
        fc, proj = torch.nn.Linear(h, 4 * h, device="meta"), torch.nn.Linear(4 * h, h,
                                                                              device="meta")
        per_rank = (fc.weight.numel() + fc.bias.numel()) / t + proj.weight.numel() / t \
            + proj.bias.numel()
        assert right == per_rank, p


def test_03_and_05_tensor_parallel_bytes():
    for _, p, right in asked("03.layer-bytes"):
        activation = p["b"] * p["s"] * p["h"] * 2
        assert close(right, 4 * mt.calc.ring_wire_bytes("all_reduce", activation, p["t"]))
    for _, p, right in asked("05.sp-bytes"):
        cfg = mt.GPTConfig(vocab_size=512, seq_len=p["s"], n_layer=1, n_head=1, d_model=p["h"])
        # sequence parallelism sends exactly tensor parallelism's 4 all-reduces' bytes
        assert close(right, mt.calc.tp_comm_bytes(cfg, p["b"], p["t"], bytes_per_value=2))
        size = 2 * p["b"] * p["s"] * p["h"]
        assert close(right, 8 * (p["t"] - 1) / p["t"] * size)


def test_04_padded_vocab_and_loss_bytes():
    for _, p, right in asked("04.padded-vocab"):
        unit = 128 * p["t"]  # Megatron-LM's make-vocab-size-divisible-by times tp
        assert right % unit == 0 and p["v"] <= right < p["v"] + unit, p
    for _, p, right in asked("04.loss-bytes"):
        tokens = p["b"] * p["s"]
        assert close(right, 3 * mt.calc.ring_wire_bytes("all_reduce", 4 * tokens, p["t"]))


def korthikanti(s, b, h, a, t, sp, selective):
    """Korthikanti et al. 2022, Table 2, one layer's activation bytes."""
    attention = 0 if selective else 5 * a * s / h
    if sp:
        return s * b * h / t * (34 + attention)
    return s * b * h * (10 + (24 + attention) / t)


def test_05_and_07_activation_bytes_are_korthikantis_table_2():
    from minitp.course.questions import lesson05, lesson07
    for _, p, right in asked("05.sp-memory"):
        h, a = lesson05.MODELS[p["model"]]
        assert close(right, korthikanti(p["s"], p["b"], h, a, p["t"], True, False))
    for _, p, right in asked("07.selective-bytes"):
        _, h, a = lesson07.MODELS[p["model"]]
        assert close(right, korthikanti(p["s"], p["b"], h, a, p["t"], False, True))


# ---- lessons 06 to 08 and 10: 2D TP, recomputation, context parallelism, modern layers ------

def test_06_two_d():
    for _, p, right in asked("06.2d-bytes"):
        q, T, d = p["q"], p["T"], p["d"]
        assert close(right, 2 * (q - 1) / q**2 * (T * d + d * d) * 2)
    for _, p, right in asked("06.alpha-terms"):
        q = p["q"]  # a ring over q ranks: q-1 steps to gather or scatter, 2(q-1) to all-reduce
        linear = 2 * (q - 1) + 2 * (q - 1) + 2 * (q - 1)  # gathers, reduce-scatters, bias
        norm = 4 * 2 * (q - 1) + 2 * 2 * (q - 1)  # Σx, Σx², Σg, Σg·x̂ on the row; dγ, dβ
        assert right == 2 * linear + norm
    for _, p, right in asked("06.which-split"):
        T, d = p["T"], p["d"]
        bytes_ = {"a": mt.calc.tp1d_linear_bytes(T, d, d, 4, sequence_parallel=True),
                  "b": mt.calc.tp2d_linear_bytes(T, d, d, 2, bias=False),
                  "c": mt.calc.tp2d_linear_bytes(T, d, d, 2, bias=False, regather=True)}
        assert right == min(bytes_, key=bytes_.get) and len(set(bytes_.values())) == 3


def test_07_full_recomputation_hfu_and_which_recompute():
    from minitp.course.questions import lesson07
    for _, p, right in asked("07.full-hfu"):
        layers, h, _ = lesson07.MODELS[p["model"]]
        s, V = 2048, 51200
        model = 72 * s * layers * h * h * (1 + s / (6 * h) + V / (12 * layers * h))  # Eq. 7
        hardware = 96 * s * layers * h * h * (1 + s / (6 * h) + V / (16 * layers * h))  # Eq. 3
        assert close(right, p["mfu"] * hardware / model)
    cfg = mt.GPTConfig(vocab_size=51200, seq_len=2048, n_layer=48, n_head=64, d_model=6144)
    states = mt.calc.model_state_bytes(mt.calc.params_per_rank(cfg, tp=8),
                                       optimizer="megatron")["total"]
    left = mt.calc.H100_80GB.memory - states
    for _, p, right in asked("07.which-recompute"):
        fits = {r: mt.calc.activation_bytes(cfg, p["b"], tp=8, sp=True, recompute=r) <= left
                for r in (None, "selective", "full")}
        assert right == "b" and fits == {None: False, "selective": True, "full": True}, p


def test_08_and_09_context_parallel():
    for _, p, right in asked("08.ring-bytes"):
        c, message = p["c"], 2 * p["s"] * p["h"] / (p["c"] * p["t"])  # one K or V, bf16
        # forward K and V c-1 hops; backward K and V c-1 hops and dK, dV c hops
        assert close(right, (2 * (c - 1) + 2 * (c - 1) + 2 * c) * message)
    for _, p, right in asked("08.causal-split"):
        c = p["c"]  # 2c half-chunks; a query chunk i meets key chunks 0..i
        contiguous = max((2 * r + 1) + (2 * r + 2) for r in range(c))
        balanced = {sum(i + 1 for i in cp_chunks(r, c)) for r in range(c)}
        assert len(balanced) == 1  # the load-balanced split: the same work on every rank
        assert close(right, contiguous / balanced.pop())
    for _, p, right in asked("09.ring-bytes"):
        cp, head_dim = p["cp"], p["d"] // p["heads"]
        message = p["seq"] // cp * p["kv"] * head_dim * 2
        assert close(right, (2 * (cp - 1) + 2 * (cp - 1) + 2 * cp) * message / MiB)
    for _, p, right in asked("09.kv-weight"):
        head_dim = p["d"] // p["heads"]  # tp above the K/V heads: every rank holds them all
        assert close(right, 2 * p["kv"] * head_dim * p["d"] * 2 / MiB)
    for q, p, right in asked("09.rope-positions"):
        size = p["s"] // (2 * p["cp"])  # the rank's local tensor: its two chunks, in order
        positions = [k * size + o for k in cp_chunks(p["rank"], p["cp"]) for o in range(size)]
        assert len(positions) == p["s"] // p["cp"]
        assert int(_option(q, p, right)) == positions[p["j"]], p
