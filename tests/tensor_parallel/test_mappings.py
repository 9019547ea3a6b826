"""The conjugate pairs of minitp.tensor_parallel.mappings at world sizes 2, 3 and 4, in float64.

For every f in PAIRS, with its adjoint f* and the kinds of tensor it takes and
gives ("replicated": one value that every rank holds; "per-rank": each rank its
own), three things are checked against values computed here, independently of
the library, from the same seeded inputs:

* forward: f(x) is what f means (copy, sum, this rank's chunk, concatenation, ...);
* backward: x.grad from ``(f(x) * y).sum().backward()`` is f*(y), the partner's
  forward applied to y;
* adjoint: <f(x), y> = <x, f*(y)>, each inner product summed over ranks for a
  per-rank tensor and taken once for a replicated one.

Replicated inputs are seeded without the rank (identical everywhere), per-rank
ones with it. Each mapping must also use exactly the collectives its docstring
names, in the phase it names. Runs: the whole world of 2, 3 and 4 ranks, and the
dp axis of Mesh(dp=2, tp=2), whose groups ([0, 2], [1, 3]) are not contiguous and
where an axis index is not the global rank.
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import minitp as mt
from minitp.tensor_parallel import mappings

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

NAMES = list(mappings.PAIRS)
RTOL = 1e-12
SEQ = 1  # (batch, seq, hidden)

# What each wrapper communicates: (forward ops, backward ops).
COLLECTIVES = {
    "copy_to_parallel": ([], ["all_reduce"]),
    "reduce_from_parallel": (["all_reduce"], []),
    "scatter_to_parallel": ([], ["all_gather"]),
    "gather_from_parallel": (["all_gather"], []),
    "scatter_to_sequence": ([], ["all_gather"]),
    "gather_from_sequence": (["all_gather"], []),
    "reduce_scatter_to_sequence": (["reduce_scatter"], ["all_gather"]),
    "gather_from_sequence(partial)": (["all_gather"], ["reduce_scatter"]),
}


def input_shape(name: str, n: int) -> tuple[int, int, int]:
    """(batch, seq, hidden): full where f splits or sums, one rank's share where it gathers."""
    if name == "gather_from_parallel":
        return (2, 3 * n, 2)
    if name.startswith("gather_from_sequence"):
        return (2, 3, 2 * n)
    return (2, 3 * n, 2 * n)


def tensor(kind: str, rank: int, shape, salt: int) -> torch.Tensor:
    """A float64 normal tensor: the same on every rank if replicated, the rank's own if not."""
    seed = 7919 * salt + (97 if kind == "replicated" else rank)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# The meaning of each mapping, written without the library: every rank's input in,
# every rank's output out.
def _reference(name: str, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    n = len(xs)
    if name == "copy_to_parallel":
        return [x.clone() for x in xs]
    if name == "reduce_from_parallel":
        return [sum(xs)] * n
    if name == "scatter_to_parallel":
        return [x.chunk(n, dim=-1)[r] for r, x in enumerate(xs)]
    if name == "gather_from_parallel":
        return [torch.cat(xs, dim=-1)] * n
    if name == "scatter_to_sequence":
        return [x.chunk(n, dim=SEQ)[r] for r, x in enumerate(xs)]
    if name.startswith("gather_from_sequence"):
        return [torch.cat(xs, dim=SEQ)] * n
    if name == "reduce_scatter_to_sequence":
        return list(sum(xs).chunk(n, dim=SEQ))
    raise KeyError(name)


def _mappings_worker(on):
    """Every pair once, on the whole world or (on="dp") on the dp axis of Mesh(dp=2, tp=2):
    groups [0, 2] and [1, 3], where rank 1 is index 0 (so rank % size would be wrong)."""
    rank = dist.get_rank()
    axis = mt.world() if on == "world" else mt.Mesh(dp=2, pp=1, tp=2).dp
    n = axis.size
    out = {"group": list(axis.ranks)}
    for salt, (name, (f, adjoint, kind_in, kind_out)) in enumerate(mappings.PAIRS.items()):
        x = tensor(kind_in, rank, input_shape(name, n), 2 * salt).requires_grad_()
        start = len(mt.trace.events())
        fx = f(x, axis)
        middle = len(mt.trace.events())
        y = tensor(kind_out, rank, fx.shape, 2 * salt + 1)
        (fx * y).sum().backward()
        events = mt.trace.events()
        out[name] = {
            "adjoint": adjoint, "kinds": (kind_in, kind_out),
            "x": x.detach(), "y": y, "fx": fx.detach(), "grad": x.grad,
            "fx_dot_y": torch.dot(fx.detach().flatten(), y.flatten()).item(),
            "x_dot_grad": torch.dot(x.detach().flatten(), x.grad.flatten()).item(),
            "fwd_ops": [(e.op, e.phase, e.group_ranks) for e in events[start:middle]],
            "bwd_ops": [(e.op, e.phase, e.group_ranks) for e in events[middle:]],
        }
    # splitting a dimension the axis size does not divide is refused
    refusals = {}
    for f in (mappings.scatter_to_parallel, mappings.scatter_to_sequence):
        try:
            f(torch.zeros(2, 3 * n + 1, 2 * n + 1, dtype=torch.float64), axis)
            refusals[f.__name__] = None
        except ValueError as exc:
            refusals[f.__name__] = str(exc)
    out["refusals"] = refusals
    return out


RUNS = [("world", 2), ("world", 3), ("world", 4), ("dp", 4)]


@pytest.fixture(scope="module", params=RUNS, ids=lambda p: f"{p[0]}-of-world{p[1]}")
def mappings_run(request):
    """The run, and its groups: lists of global ranks that share one axis."""
    on, world = request.param
    run = mt.launch(_mappings_worker, world, on, timeout=30)
    groups = sorted({tuple(run[r]["group"]) for r in range(world)})
    assert sorted(r for g in groups for r in g) == list(range(world))
    return run, groups


def _close(actual, expected, what):
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=RTOL, msg=lambda m: f"{what}: {m}")


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.dot(a.flatten(), b.flatten()).item()


def _inner(kind: str, per_rank_values: list[float]) -> float:
    """An inner product of the run: summed over ranks if per-rank, taken once if replicated."""
    if kind == "replicated":
        assert max(per_rank_values) - min(per_rank_values) <= RTOL * max(
            1.0, abs(per_rank_values[0])), f"a replicated inner product differs: {per_rank_values}"
        return per_rank_values[0]
    return sum(per_rank_values)


def test_pairs_table_is_complete_and_symmetric():
    assert sorted(NAMES) == sorted(COLLECTIVES)
    for name, (_, adjoint, kind_in, kind_out) in mappings.PAIRS.items():
        back, back_adjoint, back_in, back_out = mappings.PAIRS[adjoint]
        assert back_adjoint == name and (back_in, back_out) == (kind_out, kind_in)
        # the public wrapper's docstring names its adjoint (the pair's partner)
        public = getattr(mappings, name.partition("(")[0])
        assert public.__doc__ and adjoint.partition("(")[0] in public.__doc__, name
    functions = [v for v in vars(mappings).values()
                 if isinstance(v, type) and issubclass(v, torch.autograd.Function)
                 and v.__module__ == mappings.__name__]
    assert len(functions) == len(mappings.PAIRS)
    for function in functions:  # the house style: "fwd: ... · bwd: ..."
        assert "fwd:" in function.__doc__ and "bwd:" in function.__doc__, function.__name__


@pytest.mark.parametrize("name", NAMES)
def test_inputs_have_the_kinds_the_table_says(mappings_run, name):
    run, groups = mappings_run
    kind_in, kind_out = run[0][name]["kinds"]
    for group in groups:
        for key, kind in (("x", kind_in), ("y", kind_out)):
            values = [run[r][name][key] for r in group]
            same = all(torch.equal(values[0], v) for v in values[1:])
            assert same == (kind == "replicated"), f"{name}.{key} should be {kind}"


@pytest.mark.parametrize("name", NAMES)
def test_forward_value(mappings_run, name):
    run, groups = mappings_run
    for group in groups:
        expected = _reference(name, [run[r][name]["x"] for r in group])
        for i, r in enumerate(group):
            _close(run[r][name]["fx"], expected[i], f"{name} forward on rank {r}")


@pytest.mark.parametrize("name", NAMES)
def test_backward_is_the_partner_forward(mappings_run, name):
    run, groups = mappings_run
    partner = run[0][name]["adjoint"]
    for group in groups:
        expected = _reference(partner, [run[r][name]["y"] for r in group])
        for i, r in enumerate(group):
            _close(run[r][name]["grad"], expected[i], f"{name} backward ({partner}) on rank {r}")


@pytest.mark.parametrize("name", NAMES)
def test_adjoint_identity(mappings_run, name):
    run, groups = mappings_run
    kind_in, kind_out = run[0][name]["kinds"]
    for group in groups:
        lhs = _inner(kind_out, [run[r][name]["fx_dot_y"] for r in group])  # <f(x), y>
        rhs = _inner(kind_in, [run[r][name]["x_dot_grad"] for r in group])  # <x, f*(y)>
        assert abs(lhs - rhs) <= RTOL * max(1.0, abs(lhs), abs(rhs)), (name, group, lhs, rhs)
        # the same from the values computed here, without the library's gradients
        xs = [run[r][name]["x"] for r in group]
        ys = [run[r][name]["y"] for r in group]
        fxs = _reference(name, xs)
        adj = _reference(run[0][name]["adjoint"], ys)
        lhs_ref = _inner(kind_out, [_dot(a, b) for a, b in zip(fxs, ys, strict=True)])
        rhs_ref = _inner(kind_in, [_dot(a, b) for a, b in zip(xs, adj, strict=True)])
        assert abs(lhs_ref - rhs_ref) <= RTOL * max(1.0, abs(lhs_ref)), (name, lhs_ref, rhs_ref)
        assert abs(lhs - lhs_ref) <= RTOL * max(1.0, abs(lhs_ref)), (name, lhs, lhs_ref)


@pytest.mark.parametrize("name", NAMES)
def test_collectives_used_forward_and_backward(mappings_run, name):
    run, groups = mappings_run
    fwd, bwd = COLLECTIVES[name]
    for group in groups:
        for r in group:
            assert run[r][name]["fwd_ops"] == [(op, "fwd", group) for op in fwd], (name, r)
            assert run[r][name]["bwd_ops"] == [(op, "bwd", group) for op in bwd], (name, r)


def test_splitting_an_indivisible_dimension_is_refused(mappings_run):
    run, groups = mappings_run
    # The worker splits a (2, 3n+1, 2n+1) tensor: its last dimension (asked for as -1) and
    # its sequence dimension, neither divisible by the axis size n.
    for group in groups:
        n = len(group)
        axis_name = "world" if n == len(run) else "dp"
        split = {"scatter_to_parallel": (-1, 2 * n + 1), "scatter_to_sequence": (SEQ, 3 * n + 1)}
        for r in group:
            refusals = run[r]["refusals"]
            assert set(refusals) == set(split), refusals
            for name, (dim, size) in split.items():
                message = refusals[name]
                assert message is not None, f"rank {r}: {name} split a dimension of size {size}"
                assert f"dimension {dim} of size {size}" in message, (name, message)
                assert f"into {n} equal parts" in message, (name, message)
                assert f"axis {axis_name}" in message, (name, message)
