"""Pipeline layouts: which layers each pipeline stage holds, when they do not cut evenly.

Without a layout, pp·v stages hold n_layer/(pp·v) layers each (`even_layout`). A layout names
them stage by stage, in model order (stage g is rank g % pp's chunk g // pp, or a V's:
`minitp.rules.schedules.rank_and_chunk`), the embedding on the first stage and the head on
the last, as Megatron-LM's ``--pipeline-model-parallel-layout`` does
(megatron/core/transformer/pipeline_parallel_layer_layout.py). Three forms:

* a string, Megatron's subset: ``E`` the embedding, ``t`` a transformer layer, ``L`` the
  head and loss, ``|`` between stages, ``x*n`` and ``(...)*n`` repeat (not nested), commas
  ignored: ``"Et*3|(tt|)*2,tL"`` is [E t t t] [t t] [t t] [t L]. Not read: Megatron's
  ``m`` (multi-token prediction; minitp has none) and its other layer types;
* a list of layer counts per stage, ``[3, 2, 2, 1]`` (the embedding and head implied);
* a list of each stage's layer indices, ``[[0, 1, 2], [3, 4], ...]``.

The rule all three meet (`check_every_layer_once`): every layer placed exactly once, in
order. mlx-lm #1688 is the trap it closes: an uneven split that silently dropped layers.
"""

from __future__ import annotations

import re

LAYOUT_SYMBOLS = {"E": "the embedding", "t": "a transformer layer", "L": "the head and loss",
                  "|": "a stage boundary"}
_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")   # (...)*n, not nested (Megatron's regex too)
_REPEAT = re.compile(r"([EtL|])\*(\d+)")      # x*n


def parse_layout(text: str) -> list[list[str]]:
    """The stages of a layout string, each a list of its symbols ("E", "t", "L")."""
    flat = _GROUP.sub(lambda m: m[1] * int(m[2]), text.replace(",", "").replace(" ", ""))
    flat = _REPEAT.sub(lambda m: m[1] * int(m[2]), flat)
    for symbol in flat:
        if symbol not in LAYOUT_SYMBOLS:
            known = ", ".join(f"{s} ({what})" for s, what in LAYOUT_SYMBOLS.items())
            raise ValueError(f"pipeline_layout {text!r}: cannot read {symbol!r}; minitp reads "
                             f"{known}, x*n and (...)*n unnested (Megatron's m, MTP, is not "
                             "supported)")
    return [list(stage) for stage in flat.split("|")]


def check_every_layer_once(placed: list[int], n_layer: int) -> None:
    """The layers the stages hold, concatenated in stage order, are 0..n_layer−1, each once and
    in order (each stage hands its activation to the next): else a ValueError in one line."""
    seen = set()
    for position, layer in enumerate(placed):
        if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
            raise ValueError(f"pipeline_layout places layer {layer!r}, but the model's layers "
                             f"are 0..{n_layer - 1}")
        if layer in seen:
            raise ValueError(f"pipeline_layout places layer {layer} twice: every layer is "
                             "placed exactly once")
        if layer != position:
            raise ValueError(f"pipeline_layout places layer {layer} where layer {position} "
                             "belongs: every layer is placed exactly once, in order, stage "
                             "after stage")
        seen.add(layer)
    if len(placed) != n_layer:
        raise ValueError(f"pipeline_layout places {len(placed)} layers, but the model has "
                         f"{n_layer}: every layer is placed exactly once (mlx-lm #1688: an "
                         "uneven split that silently dropped layers)")


def even_layout(n_layer: int, stages: int) -> list[range]:
    """n_layer/stages layers a stage (the caller has checked that they divide)."""
    per = n_layer // stages
    return [range(g * per, (g + 1) * per) for g in range(stages)]


def _counts_of_symbols(stages: list[list[str]], text) -> list[int]:
    """Each stage's number of "t", after checking that E opens the first stage and L closes
    the last, once each."""
    where = f"pipeline_layout {text!r}"
    flat = [s for stage in stages for s in stage]
    if flat.count("E") != 1 or stages[0][:1] != ["E"]:
        raise ValueError(f"{where}: the embedding E opens the first stage, once")
    if flat.count("L") != 1 or stages[-1][-1:] != ["L"]:
        raise ValueError(f"{where}: the head L closes the last stage, once")
    return [stage.count("t") for stage in stages]


def layout_stages(layout, n_layer: int, pp: int, virtual_stages: int = 1) -> list[range]:
    """Each of the pp·virtual_stages stages' layers, in model order, from a layout in any of
    its three forms (None: the even split); a ValueError in one line for one that cannot run."""
    stages = pp * virtual_stages
    if layout is None:
        return even_layout(n_layer, stages)
    if isinstance(layout, str):
        counts = _counts_of_symbols(parse_layout(layout), layout)
    elif isinstance(layout, list | tuple) and layout and all(
            isinstance(s, list | tuple) and all(isinstance(x, str) for x in s) for s in layout):
        counts = _counts_of_symbols([list(s) for s in layout], layout)  # Megatron's list form
    elif isinstance(layout, list | tuple) and layout and all(isinstance(s, list | tuple | range)
                                                             for s in layout):
        check_every_layer_once([x for s in layout for x in s], n_layer)
        counts = [len(s) for s in layout]
    elif isinstance(layout, list | tuple) and layout and all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in layout):
        counts = list(layout)
    else:
        raise ValueError(f"pipeline_layout must be a string like 'Et*3|t*2L', a list of layer "
                         f"counts per stage or of each stage's layers, got {layout!r}")
    if len(counts) != stages:
        raise ValueError(f"pipeline_layout has {len(counts)} stages, but pp*virtual_stages = "
                         f"{pp}*{virtual_stages} = {stages}: one entry per stage, in model order")
    starts = [sum(counts[:g]) for g in range(stages)]
    check_every_layer_once(list(range(sum(counts))), n_layer)
    for g, count in enumerate(counts):
        if count == 0 and 0 < g < stages - 1:
            raise ValueError(f"pipeline_layout's stage {g} holds nothing (no layer, neither the "
                             "embedding nor the head): minitp runs no empty stage")
    return [range(start, start + count) for start, count in zip(starts, counts, strict=True)]


def layout_text(stages: list[range]) -> str:
    """A layout in the string form (``"Et*3|t*2|ttL"``): what a run prints and records."""
    def run(count: int) -> str:
        return "t" * count if count < 3 else f"t*{count}"
    parts = [run(len(r)) for r in stages]
    parts[0] = "E" + parts[0]
    parts[-1] += "L"
    return "|".join(parts)
