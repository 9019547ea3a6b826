"""Lesson 25's lab: on 4 ranks made two simulated nodes, every ring collective of FSDP's and
HSDP's step gives the plain result, and the bytes the kernel counted crossing between the
nodes are the MODEL's (`calc.network.hierarchy.dp_step`) within gloo's headers: FSDP's 2.25 times
HSDP's."""

import pytest

from minitp.course.labs.pytorch_parallelism import two_level_bytes


def test_hsdp_crosses_the_simulated_node_boundary_as_the_model_says():
    got = two_level_bytes(1 << 12)
    assert max(got.errors.values()) <= 1e-12, got.errors
    for strategy in ("fsdp", "hsdp"):
        assert got.payload[strategy]["across"] == got.model[strategy]  # the messages' bytes
        measured = got.measured[strategy]["across"]
        assert got.model[strategy] <= measured <= 1.02 * got.model[strategy]  # + headers
    assert got.ratio == pytest.approx(2.25, rel=0.01)
