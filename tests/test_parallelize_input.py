"""`mt.parallelize` (and torch's, `minitp.torch_parallel.parallelize`) refuse in one line a
model that is already one rank's parallel part — before, the copy each makes failed on its
process groups: "cannot pickle 'ProcessGroup'" — and `mt.parallelize` refuses a
context-parallel attention at cp 1, as the CLI does. One launch of one rank makes the real
parallel models the checks must recognise."""

import pytest

import minitp as mt
import minitp.torch_parallel as tpar

CFG = dict(vocab_size=16, seq_len=8, n_layer=1, n_head=2, d_model=8)


def _refusals():
    mesh, ref = mt.Mesh(), mt.GPT(mt.GPTConfig(**CFG))
    ours, theirs = mt.parallelize(ref, mesh), tpar.parallelize(ref, mesh)
    tries = {"minitp's, again": lambda: mt.parallelize(ours, mesh),
             "torch's, by minitp": lambda: mt.parallelize(theirs, mesh),
             "minitp's, by torch": lambda: tpar.parallelize(ours, mesh),
             "a2a at cp 1": lambda: mt.parallelize(ref, mesh, cp_comm="a2a")}
    out = {}
    for name, attempt in tries.items():
        try:
            attempt()
        except (TypeError, ValueError) as error:
            out[name] = f"{type(error).__name__}: {error}"
    return out


@pytest.fixture(scope="module")
def refusals():
    return mt.launch(_refusals, 1)[0]


@pytest.mark.parametrize("case, kind", [("minitp's, again", "ParallelGPT"),
                                        ("torch's, by minitp", "GPT"),
                                        ("minitp's, by torch", "ParallelGPT")])
def test_an_already_parallel_model_is_refused_in_one_line(refusals, case, kind):
    assert refusals.get(case, "").endswith(
        f"takes the plain GPT, and this {kind} is already one rank's parallel part: pass "
        "the plain model it came from"), refusals


def test_the_library_refuses_a2a_at_cp_1_in_the_clis_words(refusals):
    assert refusals.get("a2a at cp 1") == (
        "ValueError: cp_comm='a2a' needs cp > 1: without context parallelism no attention "
        "is split"), refusals
