"""Lesson 01's questions: a ring all-reduce's bytes and time, and which collective to call."""

from __future__ import annotations

from ...rules import ring_wire_bytes
from .form import Question, Wrong

MiB = 2**20
# NVIDIA H100 SXM datasheet: 900 GB/s of NVLink per GPU, both directions together; a ring
# sends one way round, so 450 GB/s. The 5 µs per message is this question's assumption.
H100_LINK = 450e9
ALPHA = 5e-6


def ring_bytes(seed=None) -> Question:
    def draw(rng):
        return {"n": rng.choice((3, 4, 6, 8, 12, 16)), "mib": rng.choice((64, 128, 256, 512))}

    def size(p):
        return p["mib"] * MiB

    return Question(
        key="01.ring-bytes", seed=seed, draw=draw,
        text=lambda p: (f"A ring all-reduce sums a tensor of S = {p['mib']} MiB over n = "
                        f"{p['n']} ranks. How many bytes does each rank send? (A number of "
                        "bytes; within 1%.)"),
        right=lambda p: 2 * (p["n"] - 1) / p["n"] * size(p),
        wrong=[
            Wrong(lambda p: size(p), "that is the tensor's size S; in a ring each rank sends "
                                     "2(n-1) chunks of S/n, a little less than 2S"),
            Wrong(lambda p: (p["n"] - 1) / p["n"] * size(p),
                  "that is a reduce-scatter's bytes (or an all-gather's): an all-reduce is "
                  "both, one after the other, so twice that"),
            Wrong(lambda p: 2 * size(p), "that is the limit for many ranks; at n ranks each "
                                         "rank keeps one chunk of every pass: 2(n-1)/n·S"),
            Wrong(lambda p: 2 * (p["n"] - 1) * size(p),
                  "each of the 2(n-1) steps sends one chunk of S/n, not the whole tensor"),
        ],
        worked=lambda p: (
            f"cut S into n = {p['n']} chunks of S/n; the reduce-scatter takes n-1 steps, each "
            "rank sending one chunk per step, and the all-gather n-1 more: 2(n-1)·S/n = "
            f"2·{p['n'] - 1}·{p['mib']} MiB/{p['n']} = "
            f"{ring_wire_bytes('all_reduce', size(p), p['n']):,} bytes "
            "(`minitp.rules.ring_wire_bytes`, the ring model this lesson measured on gloo)."),
    )


def ring_time(seed=None) -> Question:
    def draw(rng):
        return {"n": rng.choice((4, 8)), "mib": rng.choice((1, 16, 64, 256))}

    def seconds(p, alpha=ALPHA, link=H100_LINK):
        n, chunk = p["n"], p["mib"] * MiB / p["n"]
        return 2 * (n - 1) * (alpha + chunk / link)

    return Question(
        key="01.ring-time", seed=seed, draw=draw, rel_tol=0.02,
        text=lambda p: (f"How long does a ring all-reduce of S = {p['mib']} MiB take on "
                        f"n = {p['n']} H100s of one node, as the α–β model of this lesson "
                        "prices it? Each ring step sends one chunk to the next GPU at "
                        "450 GB/s (NVLink, one direction: the H100 SXM datasheet's 900 GB/s "
                        "counts both) and pays α = 5 µs. Answer in microseconds (within 2%)."),
        right=lambda p: seconds(p) * 1e6,
        wrong=[
            Wrong(lambda p: seconds(p, alpha=0.0) * 1e6,
                  "that leaves out the latency: each of the 2(n-1) steps pays α"),
            Wrong(lambda p: seconds(p, link=float("inf")) * 1e6,
                  "that is the latency alone: each step also moves S/n bytes"),
            Wrong(lambda p: seconds(p, link=2 * H100_LINK) * 1e6,
                  "that uses 900 GB/s: a ring sends one way round, 450 GB/s"),
            Wrong(lambda p: (ALPHA + p["mib"] * MiB / H100_LINK) * 1e6,
                  "that is one message of the whole tensor: a ring sends 2(n-1) chunks of S/n"),
        ],
        worked=lambda p: (
            f"2(n-1) = {2 * (p['n'] - 1)} steps, each α + (S/n)/B = 5 µs + "
            f"{p['mib'] * MiB / p['n'] / 1e6:.3f} MB / 450 GB/s = "
            f"{(ALPHA + p['mib'] * MiB / p['n'] / H100_LINK) * 1e6:.2f} µs: "
            f"{seconds(p) * 1e6:.1f} µs in all, a MODEL. Small tensors are priced by α "
            "(latency-bound), large ones by B: compare 1 MiB with 256 MiB."),
    )


def which_collective(seed=None) -> Question:
    def draw(rng):
        return {"n": rng.choice((4, 8, 16))}

    return Question(
        key="01.which-collective", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"Each of n = {p['n']} ranks holds its own gradient of the whole "
                        "model. Rank r's optimizer will update only the r-th 1/n of the "
                        "parameters, and needs the sum of every rank's gradient for that part "
                        "only. Which collective gives each rank exactly that, with the fewest "
                        "bytes? Answer 'a', 'b', 'c' or 'd': (a) all-reduce, then keep your "
                        "part; (b) reduce-scatter; (c) all-gather; (d) broadcast from rank 0."),
        right=lambda p: "b",
        wrong=[
            Wrong(lambda p: "a", "the right numbers, at twice the bytes: the all-reduce's "
                                 "all-gather half delivers sums this rank throws away"),
            Wrong(lambda p: "c", "an all-gather concatenates the ranks' tensors; it sums "
                                 "nothing"),
            Wrong(lambda p: "d", "a broadcast copies rank 0's gradient to everyone; the "
                                 "other ranks' gradients are lost"),
        ],
        worked=lambda p: (
            "a reduce-scatter sums over the ranks and leaves rank r the r-th chunk: "
            "(n-1)/n·S bytes per rank, half of an all-reduce's 2(n-1)/n·S. This is ZeRO's "
            "first step (ahead: lesson 13), and sequence parallelism's (ahead: lesson 05)."),
    )


def ring_bytes_formula(seed=None) -> Question:
    return Question(
        key="01.ring-bytes-formula", seed=seed, draw=lambda rng: {}, kind="formula",
        points={"n": (2, 64), "S": (1e3, 1e9)}, rel_tol=1e-9,
        text=lambda p: ("Now in general: write the bytes each rank sends in a ring all-reduce "
                        "of S bytes over n ranks as a function, `lambda n, S: ...` (checked at "
                        "random n and S)."),
        right=lambda p: lambda n, S: 2 * (n - 1) / n * S,
        wrong=[
            Wrong(lambda p: lambda n, S: (n - 1) / n * S,
                  "that is a reduce-scatter's (or an all-gather's): an all-reduce is both"),
            Wrong(lambda p: lambda n, S: 2 * S, "that is the limit as n grows, not the bytes at n"),
            Wrong(lambda p: lambda n, S: S, "that is the tensor's size, not what a rank sends"),
            Wrong(lambda p: lambda n, S: 2 * (n - 1) * S,
                  "each of the 2(n-1) steps sends one chunk of S/n, not all of S"),
        ],
        worked=lambda p: ("2(n-1)·S/n: n-1 steps of reduce-scatter and n-1 of all-gather, one "
                          "chunk of S/n each; it tends to 2S as n grows, so the bytes per rank "
                          "hardly depend on n (`minitp.rules.ring_wire_bytes`)."),
    )


QUESTIONS = {"01.ring-bytes": ring_bytes, "01.ring-bytes-formula": ring_bytes_formula,
             "01.ring-time": ring_time, "01.which-collective": which_collective}
