"""Pictures of what a launched run did.

    mt.viz.timeline(run)                       # every rank's events over time, one swimlane each
    mt.viz.before_after(before, after, op=...) # a collective's data, rank by rank, before and after
    mt.viz.bandwidth(sizes, seconds)           # time vs message size, with t = α + n·β fitted

Each function draws with matplotlib's object API and returns the `Figure`: a
notebook displays it (once) when it is a cell's last expression; a script saves
it with ``fig.savefig("picture.png")``. Nothing here calls ``plt.show()``.

Colours are the Okabe–Ito palette, which stays distinguishable under the common
kinds of colour blindness; shapes and text carry the same information as colour.

One module per kind of picture: timeline, collectives (before/after,
bandwidth), tensor_parallel, memory (lessons 04, 05 and 07), pipeline (the Gantt chart),
mesh (the 3D mesh), planning, scaling, zero (ZeRO-3's parameter memory), ring
(context parallelism: the ring from a trace, causal work, memory vs length), moe (a
mixture of experts: routing per step, expert load, tokens dropped, the all-to-all);
_style holds the palette and units they share. Everything is importable from here.
"""

from ._style import (  # noqa: F401
    COMPUTE_COLOR,
    OKABE_ITO,
    OP_COLORS,
    PHASE_COLORS,
    PHASE_NAMES,
    _tint,
    human_bytes,
    human_seconds,
    op_name,
    rank_color,
)
from .collectives import (  # noqa: F401
    AlphaBeta,
    bandwidth,
    before_after,
    fit_alpha_beta,
)
from .memory import (  # noqa: F401
    masks,
    memory_vs_t,
    tradeoff,
    tradeoff_panels,
    wire_bytes,
)
from .mesh import (  # noqa: F401
    mesh_3d,
)
from .moe import (  # noqa: F401
    all_to_all,
    dropped,
    expert_load,
    routing_steps,
)
from .pipeline import (  # noqa: F401
    pipeline_bubble,
    pipeline_gantt,
)
from .planning import (  # noqa: F401
    MEMORY_COLORS,
    TIME_COLORS,
    memory_and_time,
    plan_candidates,
)
from .ring import (  # noqa: F401
    causal_work,
    memory_vs_length,
    ring,
)
from .run import (  # noqa: F401
    run_losses,
    run_memory,
    run_wire_bytes,
)
from .scaling import (  # noqa: F401
    SPLIT_COLORS,
    scaling_efficiency,
    speedup,
    step_split,
)
from .split_matmul import (  # noqa: F401
    split_matmul,
)
from .tensor_parallel import (  # noqa: F401
    tp_dataflow,
)
from .timeline import (  # noqa: F401
    timeline,
)
from .zero import (  # noqa: F401
    zero3_param_memory,
)

__all__ = [
    "AlphaBeta",
    "COMPUTE_COLOR",
    "MEMORY_COLORS",
    "OKABE_ITO",
    "OP_COLORS",
    "PHASE_COLORS",
    "PHASE_NAMES",
    "SPLIT_COLORS",
    "TIME_COLORS",
    "all_to_all",
    "bandwidth",
    "before_after",
    "causal_work",
    "dropped",
    "expert_load",
    "fit_alpha_beta",
    "human_bytes",
    "human_seconds",
    "masks",
    "memory_and_time",
    "memory_vs_length",
    "memory_vs_t",
    "mesh_3d",
    "op_name",
    "pipeline_bubble",
    "pipeline_gantt",
    "plan_candidates",
    "rank_color",
    "ring",
    "routing_steps",
    "run_losses",
    "run_memory",
    "run_wire_bytes",
    "scaling_efficiency",
    "speedup",
    "split_matmul",
    "step_split",
    "timeline",
    "tp_dataflow",
    "tradeoff",
    "tradeoff_panels",
    "wire_bytes",
    "zero3_param_memory",
]
