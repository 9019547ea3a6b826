"""Context parallelism's attention variants, by the name `mt.parallelize(cp_comm=...)`
takes, and what each needs of the mesh and the heads. Megatron-LM's
``--cp-comm-type p2p|a2a|allgather|a2a+p2p`` (megatron/training/arguments.py) names the
same four; its hierarchical sizes put the all-to-all on adjacent ranks, as here.
Megatron's ``allgather`` runs TransformerEngine's ``AttnFuncWithCPAndKVAllGather``, which is
minitp's "allgather-regather"; minitp's "allgather" keeps what it gathered instead.

* "ring": K and V travel the cp ring, one rank's block per step (`context_parallel.ring`);
* "allgather": K and V gathered once over cp, their gradients reduce-scattered back; the
  gathered K and V are kept for backward (whole s);
* "allgather-regather": the same, but only the rank's own K and V are kept and they are
  gathered again in backward (TransformerEngine's ``AttnFuncWithCPAndKVAllGather``, in
  transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py): 1.5 times
  the bytes, 1/cp of the K and V kept;
* "a2a": Ulysses (DeepSpeed's ``ulysses_sp.py``): an all-to-all trades the sequence split
  for a head split, attention runs whole on 1/cp of the heads, an all-to-all trades back;
* "a2a+ring": USP's hybrid — the all-to-all inside groups of `cp_a2a_size` consecutive cp
  ranks, the ring across the cp/cp_a2a_size groups.
"""

from __future__ import annotations

from .heads import check_ulysses_heads
from .sizes import check_positive_int

CP_COMMS = ("ring", "allgather", "a2a", "a2a+ring", "allgather-regather")
NO_CP = "without context parallelism no attention is split"


def ulysses_size(cp_comm: str, cp: int, cp_a2a_size: int | None = None) -> int:
    """How many ranks one all-to-all spans: cp for "a2a", cp_a2a_size for "a2a+ring", one
    (no all-to-all) for the ring and the all-gathers."""
    if cp_comm == "a2a":
        return cp
    return cp_a2a_size if cp_comm == "a2a+ring" else 1


def check_cp_comm(cfg, cp: int, tp: int, cp_comm: str = "ring",
                  cp_a2a_size: int | None = None) -> None:
    """A context-parallel attention this model and mesh can run: a known name, the hybrid's
    group size given and dividing cp, and heads the all-to-all can split (after tp)."""
    if cp_comm not in CP_COMMS:
        raise ValueError(f"cp_comm must be one of {', '.join(CP_COMMS)}, got {cp_comm!r}")
    if cp_comm != "a2a+ring":
        if cp_a2a_size is not None:
            raise ValueError(f"cp_a2a_size={cp_a2a_size} is the all-to-all group of "
                             f"cp_comm='a2a+ring' (a2a's is cp itself), not of {cp_comm!r}")
    else:
        if cp_a2a_size is None:
            raise ValueError("cp_comm='a2a+ring' needs cp_a2a_size: how many consecutive cp "
                             "ranks share one all-to-all (the ring runs across the groups)")
        check_positive_int("cp_a2a_size", cp_a2a_size)
        if cp % cp_a2a_size:
            raise ValueError(f"cp_a2a_size={cp_a2a_size} does not divide cp={cp}: the ring "
                             "runs across cp/cp_a2a_size equal all-to-all groups")
    check_cp_comm_has_cp(cp, cp_comm, cp_a2a_size)
    ulysses = ulysses_size(cp_comm, cp, cp_a2a_size)
    if ulysses > 1:
        check_ulysses_heads(cfg, tp, ulysses)


def check_cp_comm_has_cp(cp: int, cp_comm: str, cp_a2a_size: int | None = None, *,
                         flags: bool = False) -> None:
    """An attention other than the ring (or an all-to-all group) asked for at cp = 1 is
    refused rather than ignored: nothing is split, so the request is a mistake, and a run
    that silently did not do it would report on what it never ran. flags=True words it as
    `python -m minitp.train`'s flags (its parent checks it before anything else)."""
    if cp != 1 or (cp_comm == "ring" and cp_a2a_size is None):
        return
    if flags:
        asked = f"--cp-comm {cp_comm}" + (f" --cp-a2a-size {cp_a2a_size}"
                                          if cp_a2a_size is not None else "")
    else:
        asked = f"cp_comm={cp_comm!r}" + (f", cp_a2a_size={cp_a2a_size}"
                                          if cp_a2a_size is not None else "")
    raise ValueError(f"{asked} needs {'--cp' if flags else 'cp'} > 1: {NO_CP}")
