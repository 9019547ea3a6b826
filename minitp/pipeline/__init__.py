"""Pipeline parallelism: the layers cut into stages, microbatches flowing through.

* `schedules`: in which order each rank runs its forwards and backwards (GPipe,
  1F1B, interleaved 1F1B), as tables, and `simulate`, which times a schedule.
* `stages`: `PipelineGPT`, this rank's stage (or virtual stages) of a GPT, and
  `run_schedule`, which executes a schedule with real messages between ranks.
"""

from .schedules import SCHEDULES, simulate
from .stages import PipelineGPT, run_schedule, split_into_stages

__all__ = ["SCHEDULES", "PipelineGPT", "run_schedule", "simulate", "split_into_stages"]
