"""The one rule for where ranks run, checked on any machine by injecting what the
node has (its GPU count, whether torch has NCCL): a node never gets two ranks on
one GPU ("invalid device ordinal"), and falls back to gloo on the CPU saying why."""

from __future__ import annotations

import importlib

import pytest

from minitp.runtime._device import choose_backend, process_group_backend

# the module, not the function of the same name that minitp.runtime exports
launch = importlib.import_module("minitp.runtime.launch")


@pytest.mark.parametrize(
    "requested,ranks,gpus,nccl,expected",
    [
        ("auto", 2, 0, True, "gloo"),    # a laptop
        ("auto", 2, 1, True, "gloo"),    # one GPU, two ranks: the run that failed on an H100
        ("auto", 8, 8, True, "nccl"),    # the workshop node
        ("auto", 4, 8, True, "nccl"),    # fewer ranks than GPUs
        ("auto", 2, 2, False, "gloo"),   # GPUs but a torch without NCCL
        ("gloo", 2, 8, True, "gloo"),    # asked for
        ("nccl", 8, 8, True, "nccl"),
    ],
)
def test_auto_takes_the_gpus_only_when_every_rank_gets_its_own(requested, ranks, gpus, nccl,
                                                                expected):
    backend, why = choose_backend(requested, ranks, gpus, nccl)
    assert backend == expected
    assert why and "\n" not in why  # one line a learner can read


def test_the_fallback_says_why_when_a_gpu_goes_unused():
    _, why = choose_backend("auto", 2, 1, True)
    assert "2 ranks" in why and "1 GPU" in why and "CPU" in why


def test_the_notice_is_said_once_and_nbval_can_turn_it_off(monkeypatch, capsys):
    """A launch that leaves a GPU unused says why on stderr, once per reason; with
    MINITP_FALLBACK_NOTICE=0 (notebooks/conftest.py sets it for nbval) it says nothing."""
    monkeypatch.setattr(launch, "_said", set())
    monkeypatch.setattr(launch.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(launch.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(launch.dist, "is_nccl_available", lambda: True)
    monkeypatch.delenv(launch.NOTICE_ENV, raising=False)
    assert launch._choose_backend("auto", 2) == launch._choose_backend("auto", 2) == "gloo"
    assert capsys.readouterr().err == f"minitp: {choose_backend('auto', 2, 1, True)[1]}\n"
    monkeypatch.setattr(launch, "_said", set())
    monkeypatch.setenv(launch.NOTICE_ENV, "0")
    assert launch._choose_backend("auto", 4) == "gloo"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("ranks,gpus,nccl", [(2, 1, True), (2, 0, True), (2, 2, False)])
def test_nccl_with_too_few_gpus_is_refused(ranks, gpus, nccl):
    with pytest.raises(ValueError, match="one rank on each GPU"):
        choose_backend("nccl", ranks, gpus, nccl)


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend must be"):
        choose_backend("mpi", 2, 0, True)


def test_under_nccl_the_group_also_has_gloo_for_cpu_tensors():
    assert process_group_backend("nccl") == "cpu:gloo,cuda:nccl"
    assert process_group_backend("gloo") == "gloo"
