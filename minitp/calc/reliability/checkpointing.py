"""How often to save: the work a failure throws away against the time a save costs.

A MODEL, every number here: failures are taken as a Poisson process (independent, at a
constant rate), so a job of n units, each failing at rate λ, fails at rate n·λ and its
mean time between failures is M = 1/(n·λ). A save takes C seconds, a restart R.

* The first-order cost (Young 1974): saving every τ seconds of work costs C/τ of the
  time, and a failure, at a uniformly random moment of a period of τ + C, throws away
  (τ + C)/2 on average, plus the restart. The fraction of the run lost is

      lost(τ) = C/τ + (τ + C)/(2M) + R/M,

  smallest at Young's interval τ = √(2·C·M) (J. W. Young, "A first order approximation
  to the optimum checkpoint interval", CACM 17(9), 1974, doi:10.1145/361147.361115).
* Daly's higher-order estimate (J. T. Daly, "A higher order estimate of the optimum
  checkpoint interval for restart dumps", Future Generation Computer Systems 22(3),
  2006, Eq. 37; as LLNL/scr's scripts/python/scr_ckpt_interval.py computes it):
  τ = √(2CM)·[1 + ⅓·√(C/2M) + ⅑·(C/2M)] − C while C < 2M, else τ = M.
* The exact expectation under the same Poisson failures (`expected_seconds`), by a
  renewal argument: a segment of t seconds (work τ and its save C) restarts from its
  beginning at each failure, R seconds after it. With rate 1/M, E = t·e^{−t/M} +
  ∫₀ᵗ (x + R + E)·e^{−x/M}/M dx, so E = (M + R)·(e^{t/M} − 1). The tests find its minimum
  numerically and set Young's and Daly's intervals beside it.

Failures of a real cluster (`LLAMA3_405B`): the Llama 3 paper (Dubey et al. 2024,
arXiv:2407.21783) §3.3.4 and its Table 5 count 419 unexpected interruptions in a 54-day
snapshot of pre-training on 16K H100 GPUs (16,384 in its Table 4); §3.3.1 says a save
writes 1 MB to 4 GB per GPU to storage that sustains 2 TB/s (7 TB/s at peak). Read as a
per-GPU rate, that is λ = 419 / (16,384 · 1,296 h): the job's M is about 3.1 hours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HOUR = 3600.0


@dataclass(frozen=True)
class FailureRecord:
    """`failures` that stopped a job of `units` (GPUs or nodes) over `hours`, and where
    the numbers come from."""

    failures: int
    units: int
    hours: float
    source: str

    @property
    def rate_per_unit_hour(self) -> float:
        """λ: failures per unit per hour (the job's failures shared by its units)."""
        return failure_rate(self.failures, self.units, self.hours)


LLAMA3_405B = FailureRecord(
    failures=419, units=16384, hours=54 * 24,
    source="Llama 3 (arXiv:2407.21783) §3.3.4, Table 5: 419 unexpected interruptions in a "
           "54-day snapshot on 16,384 H100 GPUs (Table 4)")


def failure_rate(failures: int, units: int, hours: float) -> float:
    """λ, failures per unit per hour, from `failures` seen on `units` over `hours`."""
    for name, value in (("units", units), ("hours", hours)):
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    if failures < 0:
        raise ValueError(f"failures must be >= 0, got {failures!r}")
    return failures / (units * hours)


def job_mtbf_seconds(units: int, rate_per_unit_hour: float) -> float:
    """M: the mean seconds between failures of a job of `units`, each failing at
    `rate_per_unit_hour` (independent failures: the job fails at units·λ)."""
    if units < 1 or not rate_per_unit_hour > 0:
        raise ValueError(f"need units >= 1 and a positive rate, got {units!r}, "
                         f"{rate_per_unit_hour!r}")
    return HOUR / (units * rate_per_unit_hour)


def save_seconds(checkpoint_bytes: float, write_bytes_per_s: float) -> float:
    """C: seconds to write `checkpoint_bytes` at `write_bytes_per_s` (the storage's
    sustained bandwidth for the whole job, shared by every writer)."""
    if checkpoint_bytes < 0 or not write_bytes_per_s > 0:
        raise ValueError(f"need bytes >= 0 and a positive bandwidth, got {checkpoint_bytes!r}, "
                         f"{write_bytes_per_s!r}")
    return checkpoint_bytes / write_bytes_per_s


def _check(save_s: float, mtbf_s: float) -> None:
    if not save_s > 0 or not mtbf_s > 0:
        raise ValueError(f"the save time and the MTBF must be positive, got {save_s!r}, "
                         f"{mtbf_s!r}")


def young_interval(save_s: float, mtbf_s: float) -> float:
    """Young's interval √(2·C·M): seconds of work between saves."""
    _check(save_s, mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s)


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly's higher-order interval (2006, Eq. 37): √(2CM)·[1 + ⅓√(C/2M) + ⅑(C/2M)] − C
    while C < 2M; M once a save takes twice the MTBF or more."""
    _check(save_s, mtbf_s)
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    f = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(f) / 3 + f / 9) - save_s


def lost_fraction(interval_s: float, save_s: float, mtbf_s: float,
                  restart_s: float = 0.0) -> float:
    """The first-order fraction of the run lost (Young's cost): C/τ + (τ + C)/(2M) + R/M."""
    _check(save_s, mtbf_s)
    if not interval_s > 0:
        raise ValueError(f"the interval must be positive, got {interval_s!r}")
    return save_s / interval_s + (interval_s + save_s) / (2 * mtbf_s) + restart_s / mtbf_s


def expected_seconds(work_s: float, interval_s: float, save_s: float, mtbf_s: float,
                     restart_s: float = 0.0) -> float:
    """Expected wall seconds to finish `work_s` of work saving every `interval_s`, under
    Poisson failures of mean `mtbf_s`: work/τ segments, each (M + R)(e^{(τ+C)/M} − 1)."""
    _check(save_s, mtbf_s)
    if not interval_s > 0:
        raise ValueError(f"the interval must be positive, got {interval_s!r}")
    segment = (mtbf_s + restart_s) * math.expm1((interval_s + save_s) / mtbf_s)
    return work_s / interval_s * segment


@dataclass(frozen=True)
class SavePlan:
    """How often a job should save, and what each choice loses (a MODEL)."""

    mtbf_s: float     # M: the job's mean time between failures
    save_s: float     # C: one save
    young_s: float    # Young's interval
    daly_s: float     # Daly's interval
    lost_young: float  # first-order fraction lost at Young's interval
    lost_daly: float   # and at Daly's

    def lost_at(self, interval_s: float, restart_s: float = 0.0) -> float:
        return lost_fraction(interval_s, self.save_s, self.mtbf_s, restart_s)


def save_plan(checkpoint_bytes: float, write_bytes_per_s: float, units: int,
              rate_per_unit_hour: float) -> SavePlan:
    """Young's and Daly's intervals for a job of `units` failing at `rate_per_unit_hour`
    each, whose save writes `checkpoint_bytes` at `write_bytes_per_s` (restart time 0)."""
    mtbf = job_mtbf_seconds(units, rate_per_unit_hour)
    save = save_seconds(checkpoint_bytes, write_bytes_per_s)
    young, daly = young_interval(save, mtbf), daly_interval(save, mtbf)
    return SavePlan(mtbf, save, young, daly, lost_fraction(young, save, mtbf),
                    lost_fraction(daly, save, mtbf))
