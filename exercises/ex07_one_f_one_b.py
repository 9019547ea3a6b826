# Fill in the blanks (the NotImplementedError lines), then grade: python -m minitp.grade ex07
# Generated from solutions/ex07_one_f_one_b.py by `python -m minitp.make_exercises`.
"""Exercise 07: the 1F1B pipeline schedule (PipeDream-Flush), for one rank.

With p stages and m microbatches, rank r (stage r, 0 first) runs its forwards
"F" and backwards "B" of the microbatches 0 … m−1 in this order:

* warm-up: p − r − 1 forwards (but never more than m), which fill the stages
  below this one — the last stage (r = p − 1) has no warm-up at all;
* steady state: one forward of the next microbatch, then one backward of the
  oldest microbatch still waiting for its backward, until every forward is done;
* cool-down: the backwards that are left, oldest first.

So stage r never holds more than p − r microbatches' activations at once,
whatever m (GPipe, all forwards then all backwards, holds m).

Return the order as a list of ("F" or "B", microbatch). For example p = 4, m = 6:

    rank 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5
    rank 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5

Grade it with `mt.grade("ex07")` in a notebook or `python -m minitp.grade ex07`:
the order is compared with the reference for several (p, m), and a real
4-stage pipeline is run with it (the loss must equal the plain GPT's, and no
rank may wait forever).
"""


def one_f_one_b(p: int, r: int, m: int) -> list[tuple[str, int]]:
    """The order in which rank r of p runs the forwards and backwards of m microbatches."""
    # hint: warmup = min(p - r - 1, m) forwards; then for each remaining microbatch a
    # hint: forward of it and a backward of the oldest; then the backwards left.
    raise NotImplementedError(
        'warmup = min(p - r - 1, m) forwards; then for each remaining microbatch a forward of'
        ' it and a backward of the oldest; then the backwards left.'
    )
