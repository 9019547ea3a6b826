"""Hardware and communication: the clusters (`cluster`), bytes per axis (`comm`), a small
all-reduce two ways (`allreduce`), the two-level network (`hierarchy`), 1D vs 2D tensor
parallelism (`two_d`), overlapped TP communication (`tp_overlap`), and context parallelism's
attentions and what their ring hides (`context_parallel`, `cp_overlap`), and a refit's bytes and
seconds from a training layout onto serving nodes (`refit_cost`)."""
