"""The refit's plan turned into messages (`minitp.serving.refit`, `minitp.serving.kv_reshard`):
who takes each dense element from whom (`plan_sources`), the index lists of one rank's
sends and receives and its report's constants, drawn from that table once (`Routes`), and
the messages themselves (`post`: all posted at once, traced).

Everything in `Routes` depends on the plan alone, so a refit run every N trainer steps
computes it once, in `Refit(...)`: a call then only gathers, sends, receives and writes
back. Only ``received`` and ``messages`` are read per call, from the trace of the
messages actually received, and ``sent_measured`` from the kernel's counter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..runtime import _device, comm, io_counters, trace


@dataclass(frozen=True)
class RefitReport:
    """One rank's bytes in a refit: ``received`` (from its trace's refit receives),
    ``planned`` (the plan's count of the same), ``local`` (weights it kept from its own
    training shards, no message), ``minimum`` (each weight it serves, once: planned +
    local), ``broadcast`` (a naive refit: the whole dense model), ``messages`` (the
    receives it posted), ``sent`` (what the plan has it send) and ``sent_measured`` (what
    the kernel counted it writing meanwhile, headers included: `minitp.runtime.io_counters`;
    None where it cannot tell, e.g. NCCL)."""

    rank: int
    received: int
    planned: int
    local: int
    minimum: int
    broadcast: int
    messages: int
    sent: int
    sent_measured: int | None


def plan_sources(have: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """(W, n) int64: for receiver r and element i, the rank it takes i from (-1: not
    needed). Itself first where it holds i, then the holders after it in rank order.
    have, need: (W, n) masks. The same on every rank (a function of the masks alone)."""
    world_size, n = have.shape
    source = torch.full((world_size, n), -1, dtype=torch.int64)
    for r in range(world_size):
        for k in range(world_size):
            s = (r + k) % world_size
            take = need[r].bool() & have[s].bool() & (source[r] < 0)
            source[r][take] = s
        if bool((need[r].bool() & (source[r] < 0)).any()):
            raise RuntimeError(f"refit plan: rank {r} needs elements no rank holds")
    return source


@dataclass(frozen=True)
class Routes:
    """Rank ``me``'s part of a plan: ``outgoing`` and ``incoming`` as (family, peer,
    element indices within the family, ascending), one message each, in the order both
    ends post them; and its report's constants, in bytes."""

    me: int
    outgoing: list[tuple[int, int, torch.Tensor]]
    incoming: list[tuple[int, int, torch.Tensor]]
    planned: int
    local: int
    sent: int
    broadcast: int

    @classmethod
    def of(cls, source: torch.Tensor, me: int, families) -> Routes:
        """Read off the (W, n) table of `plan_sources`; families: (first id, end, dtype)."""
        outgoing, incoming, remote, local, sent, broadcast = [], [], 0, 0, 0, 0
        for f, (lo, hi, dtype) in enumerate(families):
            item, cols = torch.empty(0, dtype=dtype).element_size(), source[:, lo:hi]
            remote += int(((cols[me] >= 0) & (cols[me] != me)).sum()) * item
            local += int((cols[me] == me).sum()) * item
            sent += (int((cols == me).sum()) - int((cols[me] == me).sum())) * item
            broadcast += (hi - lo) * item
            for peer in range(source.shape[0]):
                if peer == me:
                    continue
                for out, row, giver in ((outgoing, peer, me), (incoming, me, peer)):
                    ids = torch.nonzero(cols[row] == giver).flatten()
                    if ids.numel():
                        out.append((f, peer, ids))
        return cls(me, outgoing, incoming, remote, local, sent, broadcast)

    def report(self, messages, wrote: int | None) -> RefitReport:
        """The report of one run: its receives' trace events and the kernel's count."""
        return RefitReport(rank=self.me, received=sum(e.nbytes for e in messages),
                           planned=self.planned, local=self.local,
                           minimum=self.planned + self.local, broadcast=self.broadcast,
                           messages=len(messages), sent=self.sent, sent_measured=wrote)


def post(routes: Routes, sends, families, via: str):
    """Send `sends` (one flat tensor per ``routes.outgoing``, on the device) and receive
    each of ``routes.incoming``: all posted at once (no rank waits on another's order), one
    message a family and peer, traced as `via` messages. Returns the received buffers (in
    ``routes.incoming``'s order, on the device) and the report."""
    device, me = _device.device(), routes.me
    log = trace.recorder().events
    first, started, written = len(log), trace.recorder().now(), io_counters.written()
    pending = [comm.isend(s, peer, tag=f, via=via)
               for (f, peer, _), s in zip(routes.outgoing, sends, strict=True)]
    buffers = [torch.empty(ids.numel(), dtype=families[f][2], device=device)
               for f, _, ids in routes.incoming]
    pending += [comm.irecv(b, peer, tag=f, via=via)
                for (f, peer, _), b in zip(routes.incoming, buffers, strict=True)]
    for p in pending:
        p.wait()
    after = io_counters.written()  # the kernel's count: what this rank wrote meanwhile
    wrote = None if written is None or after is None or device.type != "cpu" \
        else after - written
    # this call's events only: the log grows with every call, read from where it stood
    mine = [e for e in trace.recorder().events[first:] if e.rank == me and e.op == "recv"
            and e.axis == via and e.start >= started]
    return buffers, routes.report(mine, wrote)


def exchange_dense(values, source: torch.Tensor, me: int, families, via: str):
    """A one-off exchange of dense flat buffers (one a family, this rank's elements
    written where it holds them): (the same buffers with what it receives written in, its
    report)."""
    device, routes = _device.device(), Routes.of(source, me, families)
    sends = [values[f][ids].to(device) for f, _, ids in routes.outgoing]
    buffers, report = post(routes, sends, families, via)
    got = [v.clone() for v in values]
    for (f, _, ids), buffer in zip(routes.incoming, buffers, strict=True):
        got[f][ids] = buffer.cpu()
    return got, report
