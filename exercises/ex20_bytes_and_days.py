# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex20
# Made from solutions/ex20_bytes_and_days.py by `python -m minitp.course.make_exercises`.
"""Exercise 20: check two claims yourself — the memory of a model's states, and the days
a training run takes.

Lesson 20 checked popular claims with `mt.calc`. Most of them rest on two numbers;
compute both from first principles:

* ``model_states_gb(n_params, optimizer)``: the model states of ``n_params``
  parameters trained with Adam in mixed precision, in GB (10**9 bytes, as the claims
  and the GPU makers count): the 16-bit weights, Adam's fp32 master copy, its two
  fp32 moments, and the gradients — kept in 16 bits for ``optimizer="adam-mixed"``
  (ZeRO's count), accumulated in fp32 for ``optimizer="megatron"`` (Megatron-LM with
  bf16 weights).
* ``training_days(tokens, n_params, n_gpus, peak_flops, efficiency, recompute)``:
  the days to train ``n_params`` parameters on ``tokens`` tokens with ``n_gpus``
  GPUs, each running at ``efficiency`` × ``peak_flops`` FLOP/s, by the FLOPs rule of
  Narayanan et al. 2021 (their Eq. 3 and 4): 6 FLOPs per parameter per token, 8 when
  ``recompute`` is True (full activation recomputation runs the forward again).

The grader compares your numbers with `calc.model_state_bytes` and
`calc.training_seconds` (and its 6/8 without recomputation) for GPT-3 and other runs,
and names the usual slips. So build them yourself: a solution that calls those two
functions or reads `calc.OPTIMIZERS` is told so.
Grade it with `mt.grade("ex20")` in a notebook or `python -m minitp.course.grade ex20`.
"""


def model_states_gb(n_params: int, optimizer: str) -> float:
    """GB (10**9 bytes) of weights, gradients and Adam's state for ``n_params`` parameters."""
    # hint: list what mixed-precision Adam keeps for every parameter, and in how many bytes
    # hint: (lesson 20's table): only the gradients differ between the two layouts.
    # hint: Then a GB is 10**9 bytes.
    raise NotImplementedError(
        'list what mixed-precision Adam keeps for every parameter, and in how many bytes '
        "(lesson 20's table): only the gradients differ between the two layouts. Then a GB is"
        ' 10**9 bytes.'
    )


def training_days(tokens: float, n_params: int, n_gpus: int, peak_flops: float,
                  efficiency: float, recompute: bool) -> float:
    """Days to train ``n_params`` parameters on ``tokens`` tokens with ``n_gpus`` GPUs."""
    # hint: FLOPs per parameter per token: the forward 2, the backward twice the forward,
    # hint: and recomputation runs the forward again. The GPUs share the work, each at
    # hint: the FLOP/s it achieves, not its peak. That gives seconds; a day has 86,400.
    raise NotImplementedError(
        'FLOPs per parameter per token: the forward 2, the backward twice the forward, and '
        'recomputation runs the forward again. The GPUs share the work, each at the FLOP/s it'
        ' achieves, not its peak. That gives seconds; a day has 86,400.'
    )
