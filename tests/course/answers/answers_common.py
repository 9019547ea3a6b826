"""What every answers test uses: the seeds, the question's own draws, and a closeness rule.

The answers tests recompute every question's marked answer independently over many seeds:
from `mt.layout`, the calculator (`mt.calc`), the rules, or the papers' arithmetic, never
by calling the question's own formula. A question whose right answer the library
contradicts fails there (issue 36: "00.replica-nodes" marked tp·pp/8 nodes, wrong for
every seed). Pure arithmetic, no processes: they run in the quick loop. Each file lists
the questions of its lessons that are not checked (`NOT_CHECKED`) and says why."""

import math

import minitp as mt

SEEDS = [f"seed-{i}" for i in range(50)]
MiB, GiB = 2**20, 2**30


def asked(key):
    for seed in SEEDS:
        q = mt.question(key, seed=seed)
        yield q, q.params, q.right(q.params)


def close(a, b, rel=1e-6):
    return math.isclose(float(a), float(b), rel_tol=rel)
