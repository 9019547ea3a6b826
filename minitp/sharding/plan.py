"""Plan tables: dotted module-name patterns, and replacing the modules they match.

A plan is a list of (pattern, make) pairs; ``*`` in a pattern stands for exactly
one name component, so "blocks.*.attn.qkv" is every layer's qkv projection. Each
axis (`tensor_parallel`, `recompute`) states its plan as such a table and
applies it with `replace_modules`; an entry that matches nothing is an error,
so a renamed module can never silently stay unparallelized.
"""

from __future__ import annotations

import re

import torch.nn as nn


def matches(name: str, pattern: str) -> bool:
    """Dotted-name match where * stands for exactly one component ("blocks.*" is a block)."""
    regex = r"\.".join("[^.]+" if part == "*" else re.escape(part) for part in pattern.split("."))
    return re.fullmatch(regex, name) is not None


def replace_modules(model: nn.Module, pattern: str, make) -> int:
    """Replace every submodule of `model` whose name matches `pattern` by
    ``make(module)``; return how many were replaced."""
    count = 0
    for name, module in list(model.named_modules()):
        if name and matches(name, pattern):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, make(module))
            count += 1
    return count


def apply_plan(model: nn.Module, plan, make_args=()) -> None:
    """Apply every (pattern, make) entry of `plan`, in order: ``make(module, *make_args)``."""
    for pattern, make in plan:
        if not replace_modules(model, pattern, lambda m, make=make: make(m, *make_args)):
            raise RuntimeError(f"plan entry {pattern!r} matched no module of the model")
