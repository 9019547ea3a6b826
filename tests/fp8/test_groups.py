"""The amax rule (`minitp.rules.fp8_groups`): which axes each tensor's amax is reduced over."""

import pytest

from minitp.rules.fp8_groups import amax_axes, amax_table, check_fp8_config


def test_sequence_parallelism_adds_tp_to_the_column_input_only():
    without = {(lay, role): axes for lay, role, axes in amax_table("tensorwise")}
    with_sp = {(lay, role): axes for lay, role, axes in amax_table("tensorwise", True)}
    changed = {key for key in without if without[key] != with_sp[key]}
    assert changed == {("column", "input")}
    assert with_sp["column", "input"] == ("dp", "cp", "tp")


def test_rowwise_reduces_only_where_a_row_is_split():
    """Forward casts and dgrad's gradient: a row's features (tp where split); the backward's
    re-casts: a weight's column over its rows (tp in a column layer), a feature over the
    tokens (dp, cp; the column input cast after SP's all-gather, so tp holds copies)."""
    rows = {(lay, role): axes for lay, role, axes in amax_table("rowwise", True)}
    assert rows == {("column", "input"): (), ("column", "weight"): (), ("column", "grad"): ("tp",),
                    ("row", "input"): ("tp",), ("row", "weight"): ("tp",), ("row", "grad"): (),
                    ("column", "weight_dgrad"): ("tp",), ("row", "weight_dgrad"): (),
                    ("column", "input_wgrad"): ("dp", "cp"), ("row", "input_wgrad"): ("dp", "cp"),
                    ("column", "grad_wgrad"): ("dp", "cp"), ("row", "grad_wgrad"): ("dp", "cp")}


def test_delayed_groups_are_tensorwise_groups():
    assert amax_table("delayed", True) == amax_table("tensorwise", True)


def test_local_scales_reduce_nothing():
    assert all(axes == () for *_, axes in amax_table("tensorwise", True, local_scales=True))
    assert amax_axes("row", "input", "tensorwise") == ("dp", "cp", "tp")


@pytest.mark.parametrize("kwargs, words", [
    (dict(scaling="blockwise"), "fp8 must be one of"),
    (dict(scaling=None, local_scales=True), "need an fp8 scaling"),
    (dict(scaling="tensorwise", param_dtype="bfloat16"), "cannot hold them exactly"),
    (dict(scaling="tensorwise", tp_overlap=True), "tp_overlap"),
    (dict(scaling="delayed", recompute="full"), "twice"),
])
def test_bad_combinations_are_refused(kwargs, words):
    with pytest.raises(ValueError, match=words):
        check_fp8_config(**kwargs)
