"""The explorer's numbers (lesson 17): `explore` checks a configuration, calls
`calc.memory_per_gpu` and `calc.step_time` and keeps their answers in an `Exploration`;
`figure` draws them. Every number is a MODEL (the papers' formulas), none measured.
The widget that drives `explore` is explorer_ui.py; both are read through explorer.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ... import calc
from ...calc.network.cluster import Cluster, GiB
from ...model import GPTConfig
from ...rules import check_parallel_config, check_positive_int


def _gpt(h: int, a: int, layers: int, s: int = 2048) -> GPTConfig:
    return GPTConfig(vocab_size=51200, seq_len=s, n_layer=layers, n_head=a, d_model=h)


# name -> (what the dropdown shows, the shape). Vocabulary 51,200 throughout.
MODELS = {
    # Shoeybi et al. 2019 (Megatron-LM), Table 1 (sequence 1024)
    "megatron-1.2b": ("Megatron-LM 1.2B", _gpt(1536, 16, 40, s=1024)),
    "megatron-8.3b": ("Megatron-LM 8.3B", _gpt(3072, 32, 72, s=1024)),
    "gpt-1.7b": ("GPT 1.7B", _gpt(2304, 24, 24)),  # Narayanan et al. 2021, Table 1
    "gpt-18b": ("GPT 18.4B", _gpt(6144, 48, 40)),  # Narayanan et al. 2021, Table 1
    "gpt-22b": ("GPT 22B", _gpt(6144, 64, 48)),  # Korthikanti et al. 2022, Table 3
    "gpt-39b": ("GPT 39.1B", _gpt(8192, 64, 48)),  # Narayanan et al. 2021, Table 1
    "gpt-76b": ("GPT 76.1B", _gpt(10240, 80, 60)),  # Narayanan et al. 2021, Table 1
    "gpt3-175b": ("GPT-3 175B", _gpt(12288, 96, 96)),  # Korthikanti et al. 2022, Table 3
    "gpt-310b": ("GPT 310.1B", _gpt(16384, 128, 96)),  # Narayanan et al. 2021, Table 1
    # Korthikanti et al. 2022, Table 3 (also Narayanan et al. 2021's 529.6B and 1008B rows)
    "mt-nlg-530b": ("MT-NLG 530B", _gpt(20480, 128, 105)),
    "gpt-1t": ("GPT 1T", _gpt(25600, 160, 128)),
}

GPUS = {"v100-32gb": calc.DGX2H_V100, "a100-80gb": calc.A100_80GB, "h100-80gb": calc.H100_80GB}


@dataclass(frozen=True, repr=False)
class Exploration:
    """One configuration, as `minitp.calc` predicts it.

    ``memory``: bytes on the busiest GPU (`calc.memory_per_gpu`: parameters,
    gradients, optimizer, activations, total); ``time``: seconds per iteration
    (`calc.step_time`: compute, tp, pp, dp, bubble); ``comm``: bytes one GPU sends
    per axis (`calc.comm_bytes`). It fits when the total is at most ``usable`` ×
    the GPU's memory (the rest is left to the framework, buffers and fragmentation).
    """

    name: str
    cfg: GPTConfig
    cluster: Cluster
    n_gpus: int
    dp: int
    pp: int
    tp: int
    sp: bool
    recompute: str | None
    micro_batch: int
    microbatches: int
    global_batch: int
    virtual: int
    optimizer: str
    zero_stage: int
    efficiency: float
    usable: float
    memory: dict
    time: calc.StepTime
    comm: dict
    params: int  # the whole model (Narayanan et al. Eq. 2)
    params_per_gpu: int  # on the busiest GPU

    @property
    def limit(self) -> float:
        """Bytes a GPU may fill: ``usable`` × its memory."""
        return self.usable * self.cluster.memory

    @property
    def fits(self) -> bool:
        return self.memory["total"] <= self.limit

    @property
    def bubble(self) -> int | float:
        """(p − 1)/(v·m), as a fraction of the ideal time."""
        return calc.bubble(self.pp, self.microbatches, self.virtual)

    @property
    def mfu(self) -> float:
        """Model FLOPs (no recomputation) over the predicted time and the GPUs' peak."""
        flops = calc.model_flops(self.cfg, self.global_batch)
        return calc.mfu(flops, self.time.total, self.n_gpus, self.cluster.peak_flops)

    @property
    def spans(self) -> dict[str, int]:
        """How many consecutive GPUs one group of each axis spans (tp fastest, then dp, pp)."""
        return {"tp": self.tp, "dp": self.tp * self.dp, "pp": self.n_gpus}

    def summary(self) -> str:
        """Short lines (at most `SUMMARY_WIDTH` characters for the catalogued models), so
        they stay whole in the widget's output area down to a 1024-px browser window."""
        c, g = self.cfg, self.cluster.gpus_per_node
        mem, t = self.memory, self.time
        lines = [
            f"{self.name}: {self.params / 1e9:.1f}B parameters",
            f"  l={c.n_layer} layers, h={c.d_model}, a={c.n_head} heads, s={c.seq_len}, "
            f"V={c.vocab_size}",
            f"on {self.n_gpus} GPUs: {self.cluster.name}",
            f"dp={self.dp} x pp={self.pp} x tp={self.tp}, sequence parallel "
            f"{'on' if self.sp else 'off'}, recompute {self.recompute or 'none'}",
        ]
        if self.virtual > 1:
            lines.append(f"  interleaved schedule: v={self.virtual} chunks per stage")
        lines += [
            f"global batch {self.global_batch} = dp {self.dp} x {self.microbatches} microbatches"
            f" x micro-batch {self.micro_batch}",
            f"memory on the busiest GPU: {mem['total'] / GiB:.1f} GiB of {self.limit / GiB:.1f}"
            f" usable: " + ("fits" if self.fits else "DOES NOT FIT"),
            "  " + ", ".join(f"{k} {mem[k] / GiB:.1f}"
                             for k in ("parameters", "gradients", "optimizer")) + " GiB",
            f"  activations {mem['activations'] / GiB:.1f} GiB",
            f"step time: {_seconds(t.total)} s; MFU {100 * self.mfu:.1f}% if compute runs at "
            f"{100 * self.efficiency:.0f}% of peak",
            "  " + " + ".join(f"{k} {_seconds(v)}" for k, v in t.as_dict().items()
                              if k != "total"),
            f"  bubble (p-1)/(v*m) = {self.bubble:.3f} of the ideal time",
        ]
        for axis, span in self.spans.items():
            size = getattr(self, axis)
            if size > 1:
                where = "inside a node" if span <= g else "across nodes"
                lines.append(f"  {axis} groups of {size} span {span} GPUs: {where} ({g} per node)")
        return "\n".join(lines)

    __str__ = summary

    def __repr__(self) -> str:
        return self.summary()


# The summary's longest line for the catalogued models and GPUs (tests check it): at
# JupyterLab's 13-px monospace, ~530 px; the output area is ~590 px wide in a 1024-px
# window with the file browser open.
SUMMARY_WIDTH = 68


def _seconds(x: float) -> str:
    """Seconds to the millisecond, fewer digits past 100 s (a huge run's line stays short)."""
    return f"{x:.3f}" if x < 100 else f"{x:.1f}" if x < 10_000 else f"{x:,.0f}"




def _model(model) -> tuple[str, GPTConfig]:
    if isinstance(model, GPTConfig):
        same = [label for label, cfg in MODELS.values() if cfg == model]
        return (same[0] if same else "GPT", model)
    if model not in MODELS:
        raise ValueError(f"model must be a GPTConfig or one of {', '.join(MODELS)}; "
                         f"got {model!r}")
    return MODELS[model]


def _cluster(gpu, gpu_memory) -> Cluster:
    if isinstance(gpu, Cluster):
        cluster = gpu
    elif gpu in GPUS:
        cluster = GPUS[gpu]
    else:
        raise ValueError(f"gpu must be a calc.Cluster or one of {', '.join(GPUS)}; got {gpu!r}")
    if gpu_memory is None:
        return cluster
    if isinstance(gpu_memory, bool) or not isinstance(gpu_memory, (int, float)) or gpu_memory <= 0:
        raise ValueError(f"gpu_memory is in GiB and must be positive, got {gpu_memory!r}")
    memory = round(gpu_memory * GiB)
    if memory == cluster.memory:
        return cluster
    return dataclasses.replace(cluster, memory=memory,
                               name=f"{cluster.name}, memory set to {gpu_memory:g} GiB")


def explore(model="gpt3-175b", n_gpus: int | None = None, gpu="a100-80gb", dp: int | None = None,
            pp: int = 1, tp: int = 1, sp: bool = False, recompute=None,
            microbatches: int | None = None, micro_batch: int = 1,
            global_batch: int | None = None, *, virtual: int = 1,
            gpu_memory: float | None = None, optimizer: str = "megatron", zero_stage: int = 0,
            efficiency: float = 0.5, usable: float = 0.9) -> Exploration:
    """Predict memory per GPU and step time of one (dp, pp, tp, sp, recompute) run.

    model: a `MODELS` name or a `GPTConfig`. gpu: a `GPUS` name or a `calc.Cluster`;
        gpu_memory (GiB) replaces its memory. n_gpus must equal dp·pp·tp; leave out
        dp to get n_gpus / (pp·tp), or n_gpus to get dp·pp·tp.
    The batch: global_batch = dp · microbatches · micro_batch. Give microbatches or
        global_batch (one microbatch when neither); both must agree.
    optimizer, zero_stage: as `calc.model_state_bytes` (default Megatron-LM's 18
        bytes per parameter, as `calc.plan`); efficiency: the share of peak FLOP/s
        compute reaches (`calc.step_time`); usable: the share of memory a run may fill.
    Raises ValueError, saying what is wrong, for a configuration that cannot run.
    """
    name, cfg = _model(model)
    cluster = _cluster(gpu, gpu_memory)
    pp, tp = check_positive_int("pp", pp), check_positive_int("tp", tp)
    micro_batch = check_positive_int("micro_batch", micro_batch)
    virtual = check_positive_int("virtual", virtual)
    if n_gpus is None:
        n_gpus = (1 if dp is None else check_positive_int("dp", dp)) * pp * tp
    n_gpus = check_positive_int("n_gpus", n_gpus)
    if dp is None:
        if n_gpus % (pp * tp):
            raise ValueError(f"n_gpus={n_gpus} is not divisible by pp*tp = {pp}*{tp} = "
                             f"{pp * tp}: there is no whole number of data-parallel replicas")
        dp = n_gpus // (pp * tp)
    dp = check_positive_int("dp", dp)
    if dp * pp * tp != n_gpus:
        raise ValueError(f"dp*pp*tp = {dp}*{pp}*{tp} = {dp * pp * tp}, but n_gpus={n_gpus}: "
                         "every GPU holds exactly one (dp, pp, tp) coordinate")
    if global_batch is not None:
        global_batch = check_positive_int("global_batch", global_batch)
        m = calc.microbatch_count(global_batch, dp, micro_batch)
        if microbatches is not None and microbatches != m:
            raise ValueError(f"global_batch={global_batch} with dp={dp} and micro_batch="
                             f"{micro_batch} is {m} microbatches, not microbatches={microbatches}")
        microbatches = m
    microbatches = check_positive_int("microbatches", 1 if microbatches is None else microbatches)
    global_batch = dp * microbatches * micro_batch
    check_parallel_config(cfg, dp=dp, pp=pp, tp=tp, sequence_parallel=sp, recompute=recompute,
                          virtual_stages=virtual, world_size=n_gpus, microbatches=microbatches)
    if not 0 < efficiency <= 1 or not 0 < usable <= 1:
        raise ValueError(f"efficiency and usable are fractions in (0, 1]; got {efficiency!r}, "
                         f"{usable!r}")
    memory = calc.memory_per_gpu(cfg, micro_batch, dp, pp, tp, sp, recompute, zero_stage,
                                 optimizer, virtual, microbatches)
    time = calc.step_time(cfg, cluster, dp, pp, tp, micro_batch, global_batch, sp, recompute,
                          virtual, efficiency)
    comm = calc.comm_bytes(cfg, micro_batch, dp, pp, tp, sp, recompute, zero_stage=zero_stage)
    return Exploration(name, cfg, cluster, n_gpus, dp, pp, tp, bool(sp), recompute, micro_batch,
                       microbatches, global_batch, virtual, optimizer, zero_stage, efficiency,
                       usable, memory, time, comm, calc.param_count(cfg),
                       calc.params_per_rank(cfg, tp, pp))


def figure(explorations, *, title: str | None = None, width: float = 10.0):
    """Memory per GPU by kind and step time by part, as stacked bars: one `Exploration`,
    or several side by side ({label: Exploration} or a list); `width` in inches.
    Returns the Figure."""
    from .. import viz

    if isinstance(explorations, Exploration):
        explorations = {explorations.name: explorations}
    elif not isinstance(explorations, dict):
        explorations = {f"{e.name}\ndp={e.dp} pp={e.pp} tp={e.tp}": e for e in explorations}
    if not explorations:
        raise ValueError("figure needs at least one Exploration")
    first = next(iter(explorations.values()))
    same_gpu = all(e.cluster.memory == first.cluster.memory and e.usable == first.usable
                   for e in explorations.values())
    return viz.memory_and_time(
        {k: e.memory for k, e in explorations.items()},
        {k: e.time.as_dict() for k, e in explorations.items()},
        capacity=first.cluster.memory if same_gpu else None,
        limit=first.limit if same_gpu else None,
        title=title, width=width)
