"""Pipeline parallelism: the layers cut into stages, microbatches flowing through.

* `schedules`: in which order each rank runs its forwards and backwards (GPipe,
  1F1B, interleaved 1F1B, the zero-bubble ones), as tables;
* `on_paper`: `simulate`, which plays a schedule out with set unit costs.
* `stages`: `PipelineGPT`, this rank's stage (or virtual stages) of a GPT;
* `executor`: `run_schedule`, which executes a schedule with real messages between ranks.
"""

from .executor import run_schedule
from .on_paper import simulate
from .schedules import SCHEDULES
from .stages import PipelineGPT, split_into_stages

__all__ = ["SCHEDULES", "PipelineGPT", "run_schedule", "simulate", "split_into_stages"]
