"""Parameter tags: what a parallel parameter declares about itself.

Megatron-Core sets these with `set_tensor_model_parallel_attributes` over a
table of defaults; minitp does the same. A tag is set once, when the layer that
owns the parameter is built, and read by the code that must treat the parameter
specially: gathering dense state (`minitp.sharding.dense`), summing partial gradients
(`minitp.tensor_parallel.partial_grads`), checkpoints. A parameter with no tags is replicated:
every rank of the tensor-parallel group holds the same whole tensor.
"""

from __future__ import annotations

TAG_DEFAULTS = {
    # the dimension along which this parameter is split over the tensor-parallel
    # axis; None: not split (replicated)
    "tp_split_dim": None,
    # that dimension's size in the dense model, where the shards are padded to
    # equal sizes (the vocabulary); None: no padding
    "tp_true_size": None,
    # the gradient on each rank is one term of a sum over the tensor-parallel axis:
    # the parameter is applied to this rank's slice of the sequence (sequence
    # parallelism), so the true gradient is the sum over the group
    "grad_partial_over_tp": False,
    # expert parallelism (`minitp.expert_parallel`): the dimension (the experts') along
    # which this parameter is split over the ep axis; its gradient is then summed over
    # the expert-data-parallel group, not over dp. None: not an expert shard
    "ep_split_dim": None,
    # folded expert tensor parallelism (`Mesh.etp`): the dimension (an expert's hidden
    # width) along which an expert shard is split over the etp axis; None: whole over it
    "etp_split_dim": None,
}


def set_tags(param, **tags) -> None:
    """Declare tags on `param`; each name must be in TAG_DEFAULTS and set only once."""
    for name, value in tags.items():
        if name not in TAG_DEFAULTS:
            raise KeyError(f"unknown parameter tag {name!r}; known: {sorted(TAG_DEFAULTS)}")
        if hasattr(param, name):
            raise RuntimeError(f"parameter tag {name!r} is already set (to "
                               f"{getattr(param, name)!r}); a tag is declared once")
        setattr(param, name, value)


def tag(param, name: str):
    """The value of tag `name` on `param` (its default where it was never set)."""
    return getattr(param, name, TAG_DEFAULTS[name])


def is_expert_shard(param) -> bool:
    """A run of experts under expert parallelism: its gradient is summed (and ZeRO-sharded)
    over the ranks holding the same experts, not over all of dp."""
    return tag(param, "ep_split_dim") is not None


def dense_and_experts(params) -> tuple[list, list]:
    """`params` split into (the rest, the expert shards), each in the given order."""
    params = list(params)
    return ([p for p in params if not is_expert_shard(p)],
            [p for p in params if is_expert_shard(p)])
