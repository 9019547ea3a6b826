"""The trace's layer labels ("layer3", nested as "layer3.attn"), built and parsed by the
same two functions (the pipeline units' labels, "F3", "B3:1", are `minitp.rules.schedules`')."""

from __future__ import annotations

import re

LAYER_LABEL = "layer{}"
_LAYER = re.compile(r"(?:^|\.)layer(\d+)(?:\.|$)")


def layer_label(index: int) -> str:
    """The trace label of transformer layer `index` (in the whole model's numbering)."""
    return LAYER_LABEL.format(index)


def parse_layer_label(label: str) -> int | None:
    """The layer a (possibly nested, dot-joined) label belongs to, or None."""
    found = _LAYER.search(label or "")
    return int(found[1]) if found else None
