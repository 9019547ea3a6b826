"""Lab: HSDP against FSDP on a SIMULATED two-level network (lesson 25).

How the simulation is made, exactly: 4 ranks on this one machine (gloo over loopback
TCP), called two "nodes", ranks {0, 1} and {2, 3}. Nothing is slower between the nodes:
the network is simulated only in the *counting*. Every collective runs as a ring of
point-to-point messages (`minitp.runtime.comm.sendrecv`: each rank sends to the next rank
of its ring while it receives from the previous one), so each message has one sender
and one receiver, and the trace records both. A message *crosses* when its sender and
its receiver sit in different nodes; its bytes are the bytes the sender's kernel counted
it writing while the message went (``sent_bytes``, MEASURED: the payload and gloo's few
header bytes), summed by whether they crossed.

One data-parallel step's collectives of a vector of ``n_values`` float64 parameters:

* FSDP (ZeRO-3 over all 4 ranks): all-gather the parameters (forward), all-gather them
  again (backward), reduce-scatter the gradients — each a ring 0 → 1 → 2 → 3 → 0, in
  node order: of its four links, 1 → 2 and 3 → 0 cross;
* HSDP (shard inside a node, replicate across): the same three inside each node (rings
  {0, 1} and {2, 3}: nothing crosses), then each rank all-reduces its half-shard
  gradient with its peer in the other node (rings {0, 2} and {1, 3}: everything crosses).

Each collective's result is checked against the plain sum or concatenation (MEASURED
error), and the counted bytes stand beside `minitp.calc.network.hierarchy.dp_step`'s MODEL for a
cluster of nodes of 2 (`crossing_ratio(4, 2)` = 2.25).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...calc.network.cluster import GB, Cluster
from ...calc.network.hierarchy import dp_step
from ...runtime import comm, trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import world

WORLD, PER_NODE = 4, 2
NODES = ((0, 1), (2, 3))
# only the layout matters to the bytes; the bandwidths are placeholders for the MODEL's time
SIMULATED = Cluster("simulated: 2 nodes of 2 ranks", PER_NODE, 1e12, 10**9, 10 * GB, 1 * GB)


def node_of(rank: int) -> int:
    return rank // PER_NODE


def _ring_all_gather(shard: torch.Tensor, ring: list[int]) -> torch.Tensor:
    """Every rank of `ring`'s shard, in ring order: n−1 steps, one shard each to the next."""
    n, i, me = len(ring), ring.index(world().rank), shard
    chunks = [torch.empty_like(me) for _ in ring]
    chunks[i] = me.clone()
    nxt, prv = ring[(i + 1) % n], ring[(i - 1) % n]
    for k in range(n - 1):
        comm.sendrecv(chunks[(i - k) % n], nxt, chunks[(i - k - 1) % n], prv)
    return torch.cat(chunks)


def _ring_reduce_scatter(full: torch.Tensor, ring: list[int]) -> torch.Tensor:
    """This rank's 1/n of the sum over `ring` of `full`: n−1 steps, a running sum each."""
    n, i = len(ring), ring.index(world().rank)
    acc = [c.clone() for c in full.chunk(n)]
    nxt, prv = ring[(i + 1) % n], ring[(i - 1) % n]
    for k in range(n - 1):
        incoming = torch.empty_like(acc[0])
        comm.sendrecv(acc[(i - k - 1) % n], nxt, incoming, prv)
        acc[(i - k - 2) % n] += incoming
    return acc[i]


def _ring_all_reduce(x: torch.Tensor, ring: list[int]) -> torch.Tensor:
    return _ring_all_gather(_ring_reduce_scatter(x, ring), ring)


def _one_step(n_values: int) -> dict:
    """Runs on every rank: FSDP's and HSDP's collectives of one step, each result checked."""
    r, dev = world().rank, device()
    gen = torch.Generator().manual_seed(40)
    params = torch.randn(n_values, generator=gen, dtype=torch.float64).to(dev)  # every rank
    grads = [torch.randn(n_values, generator=gen, dtype=torch.float64).to(dev)
             for _ in range(WORLD)]  # per rank
    total = sum(grads)
    errors = {}
    everyone, mine_node = list(range(WORLD)), list(NODES[node_of(r)])
    first = len(comm_events())
    for _ in range(2):  # FSDP: gather for forward, again for backward
        got = _ring_all_gather(params.chunk(WORLD)[r], everyone)
        errors["fsdp gather"] = (got - params).abs().max().item()
    got = _ring_reduce_scatter(grads[r], everyone)
    errors["fsdp reduce-scatter"] = (got - total.chunk(WORLD)[r]).abs().max().item()
    middle = len(comm_events())
    j = mine_node.index(r)
    for _ in range(2):  # HSDP: the same inside the node
        got = _ring_all_gather(params.chunk(PER_NODE)[j], mine_node)
        errors["hsdp gather"] = (got - params).abs().max().item()
    shard = _ring_reduce_scatter(grads[r], mine_node)  # this node's sum, my half
    peers = [node[j] for node in NODES]  # the same position in every node
    got = _ring_all_reduce(shard, peers)
    errors["hsdp all-reduce"] = (got - total.chunk(PER_NODE)[j]).abs().max().item()
    events = comm_events()
    return {"errors": errors, "fsdp": _count(events[first:middle], r),
            "hsdp": _count(events[middle:], r)}


def comm_events():
    """This rank's sends so far (a sendrecv records its send with the bytes measured)."""
    return [e for e in trace.events() if e.op == "send"]


def _count(sends, rank) -> dict:
    """Bytes this rank's messages carried inside its node and across: MEASURED (the kernel's
    count; None if any message could not be measured) and the payload's."""
    out = {"inside": 0, "across": 0, "payload inside": 0, "payload across": 0}
    for e in sends:
        where = "across" if node_of(e.peer) != node_of(rank) else "inside"
        out[f"payload {where}"] += e.nbytes
        out[where] = None if out[where] is None or e.sent_bytes is None \
            else out[where] + e.sent_bytes
    return out


@dataclass
class TwoLevelBytes:
    """One step's bytes across the simulated node boundary, both strategies, all ranks."""

    n_values: int
    measured: dict  # strategy -> {"inside", "across"}: the kernel's count, summed over ranks
    payload: dict  # strategy -> {"inside", "across"}: the messages' payload bytes
    model: dict  # strategy -> bytes across, `calc.network.hierarchy.dp_step` (a MODEL)
    errors: dict  # collective -> largest |result − the plain one| over the ranks

    @property
    def ratio(self) -> float:
        """FSDP's bytes across over HSDP's: measured, or the payload's where the kernel could
        not count (NCCL)."""
        counted = self.measured if self.measured["fsdp"]["across"] is not None else self.payload
        return counted["fsdp"]["across"] / counted["hsdp"]["across"]

    def table(self) -> str:
        def show(v):
            return f"{v:>17,}" if v is not None else f"{'not measurable':>17}"

        rows = [f"{'':6} {'across, measured':>17} {'across, MODEL':>14} {'inside, measured':>17}"]
        for s in ("fsdp", "hsdp"):
            rows.append(f"{s.upper():6} {show(self.measured[s]['across'])} "
                        f"{self.model[s]:>14,.0f} {show(self.measured[s]['inside'])}")
        rows.append(f"FSDP / HSDP across: {self.ratio:.3f} "
                    f"{'measured' if self.measured['fsdp']['across'] is not None else 'payload'}, "
                    f"{self.model['fsdp'] / self.model['hsdp']:.3f} MODEL")
        return "\n".join(rows)


def two_level_bytes(n_values: int = 1 << 15) -> TwoLevelBytes:
    """One step of FSDP and of HSDP on 4 ranks made two simulated nodes (see the module)."""
    if n_values < 1 or n_values % (WORLD * PER_NODE):
        raise ValueError(f"n_values must be a positive multiple of {WORLD * PER_NODE}, "
                         f"got {n_values}")
    run = launch(_one_step, WORLD, n_values)
    measured, payload = {}, {}
    for s in ("fsdp", "hsdp"):
        for kind, out in (("", measured), ("payload ", payload)):
            out[s] = {w: _sum(run[r][s][f"{kind}{w}"] for r in range(WORLD))
                      for w in ("inside", "across")}
    model = {s: dp_step(SIMULATED, n_values, WORLD, s, bytes_per_value=8,
                        grad_bytes=8).crossing for s in ("fsdp", "hsdp")}
    errors = {k: max(run[r]["errors"][k] for r in range(WORLD)) for k in run[0]["errors"]}
    return TwoLevelBytes(n_values, measured, payload, model, errors)


def _sum(values):
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


# --- the same run in minitp's words and in PyTorch's ------------------------------------

TINY = dict(vocab_size=32, seq_len=16, n_layer=2, n_head=4, d_model=32)


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _side_by_side_here(steps: int, lr: float) -> dict:
    """Runs on every rank of Mesh(dp=2, tp=2): one device, minitp (TP + SP + ZeRO-3) and
    torch (DTensor TP + SequenceParallel + FSDP2) trained on the same batches, float64."""
    from ...data_parallel import make_optimizer
    from ...model import GPT, GPTConfig
    from ...parallelize import parallelize as minitp_parallelize
    from ...runtime.mesh import Mesh
    from ...step import train_step as minitp_step
    from ...torch_parallel import parallelize as torch_parallelize
    from ...torch_parallel import train_step as torch_step

    mesh, dev, cfg = Mesh(dp=2, tp=2), device(), GPTConfig(**TINY)
    torch.manual_seed(0)
    ref = GPT(cfg).double().to(dev)
    ours = minitp_parallelize(ref, mesh, sequence_parallel=True, zero_stage=3)
    theirs = torch_parallelize(ref, mesh, sequence_parallel=True)
    opts = (torch.optim.AdamW(ref.parameters(), lr=lr),
            make_optimizer(ours, mesh, torch.optim.AdamW, lr=lr),
            torch.optim.AdamW(theirs.parameters(), lr=lr))
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len + 1), generator=gen).to(dev)
        x, y = tokens[:, :-1], tokens[:, 1:]
        opts[0].zero_grad()
        _, loss = ref(x, y)
        loss.backward()
        opts[0].step()
        losses.append((loss.item(), minitp_step(ours, (x, y), mesh, opts[1]),
                       torch_step(theirs, (x, y), opts[2])))
    named = dict(theirs.named_parameters())
    param = max((_whole(named[n]).detach() - p.detach()).abs().max().item()
                for n, p in ref.named_parameters())
    return {"losses": losses, "torch params vs one device": param,
            "placements": {n: str(getattr(p, "placements", "")) for n, p in named.items()
                           if n.startswith("blocks.0.")}}


def side_by_side(steps: int = 3, lr: float = 1e-2) -> dict:
    """One device, minitp and torch trained side by side on Mesh(dp=2, tp=2) with SP
    (4 ranks, float64): each step's three losses, the largest loss difference, torch's
    parameters after the last AdamW step against one device's, and the DTensor placements
    of block 0's parameters on the ("dp", "tp") DeviceMesh (rank 0's view)."""
    run = launch(_side_by_side_here, WORLD, steps, lr)
    losses = run[0]["losses"]
    return {"losses": losses,
            "largest loss difference": max(max(s) - min(s) for r in range(WORLD)
                                           for s in run[r]["losses"]),
            "torch params vs one device": max(run[r]["torch params vs one device"]
                                              for r in range(WORLD)),
            "placements": run[0]["placements"]}


def hsdp_or_fsdp(clusters, n_params: int, nodes=(2, 16, 128), microbatches=(1, 8),
                 units: int = 32) -> list[dict]:
    """A MODEL (`calc.network.hierarchy.dp_step`): FSDP and HSDP's bytes each GPU sends across
    nodes and their seconds per step, for each cluster, node count and microbatch count,
    ``units`` FSDP units (a layer each), 16-bit parameters and gradients."""
    rows = []
    for cluster in clusters:
        for k in nodes:
            for m in microbatches:
                n = cluster.gpus_per_node * k
                f, h = (dp_step(cluster, n_params, n, s, m, units) for s in ("fsdp", "hsdp"))
                rows.append({"cluster": cluster.name, "nodes": k, "m": m, "fsdp": f, "hsdp": h})
    return rows
