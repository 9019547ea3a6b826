"""The scaling lab's laws (lesson 16): weak and strong efficiency, Amdahl's law and the
speedup with an added overhead — the arithmetic a measured step time is read through.
Pure arithmetic, no run; read through scaling.py with the family and the measurement.
"""

from __future__ import annotations


def weak_efficiency(base_flops: float, base_seconds: float, flops: float, seconds: float,
                    tp: int) -> float:
    """FLOP/s per GPU at ``tp`` GPUs over FLOP/s on one: Megatron-LM's "% of linear
    scaling". Equal to base_seconds / seconds when each GPU's share of the work
    (flops / tp) is the same as the one-GPU run's."""
    return (flops / (tp * seconds)) / (base_flops / base_seconds)


def strong_efficiency(base_seconds: float, seconds: float, tp: int) -> float:
    """Speedup over one GPU, divided by the number of GPUs: T₁ / (t·T_t)."""
    return base_seconds / (tp * seconds)


def amdahl(t, serial: float):
    """Amdahl's law: the speedup on t workers when a fraction ``serial`` of the
    one-worker time cannot be split, 1 / (s + (1 − s)/t). Never above 1/s."""
    if not 0 <= serial <= 1:
        raise ValueError(f"the serial fraction must be in [0, 1], got {serial}")
    return 1.0 / (serial + (1.0 - serial) / t)


def speedup_with_overhead(t, overhead: float):
    """Speedup when all the work splits over t workers but a cost ``overhead``
    (a fraction of the one-worker time, e.g. communication) is added:
    T_t = T₁/t + c·T₁, so 1 / (1/t + c) — Amdahl's law with the serial part
    added rather than left over, below t and never above 1/c."""
    if overhead < 0:
        raise ValueError(f"the overhead must be at least 0, got {overhead}")
    return 1.0 / (1.0 / t + overhead)


def fitted_overhead(base_seconds: float, seconds: float, tp: int) -> float:
    """The overhead c that `speedup_with_overhead` needs to give T₁/T_t at t:
    c = (T_t − T₁/t) / T₁."""
    return (seconds - base_seconds / tp) / base_seconds
