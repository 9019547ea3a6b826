"""Model states per rank, measured: parameters, gradients and optimizer state, summed
over the tensors this rank actually holds, each storage counted once (ZeRO's 2 + 2 +
12 bytes per parameter for mixed-precision Adam is the model it is set beside). One
of `minitp.memory`'s instruments, reached as ``mt.memory.measure_model_states``."""

from __future__ import annotations

import torch
import torch.nn as nn


def local(t: torch.Tensor) -> torch.Tensor:
    """What this rank stores of `t`: a DTensor's local shard (PyTorch's own parallelism,
    `minitp.torch_parallel`), any other tensor itself."""
    return getattr(t, "_local_tensor", t)


def storage_key(t: torch.Tensor) -> tuple[str, int]:
    t = local(t)
    return str(t.device), t.untyped_storage().data_ptr()


def _unique_storage_bytes(tensors, seen: set) -> int:
    total = 0
    for t in tensors:
        key = storage_key(t)
        if key not in seen:
            seen.add(key)
            total += local(t).untyped_storage().nbytes()
    return total


def measure_model_states(model: nn.Module, optimizer=None) -> dict:
    """Bytes this rank holds for `model`'s states, read from the tensors themselves:
    ``{"parameters", "gradients", "optimizer", "total", "optimizer_state": {key: bytes}}``.

    What is counted is what stays alive between two steps:

    * "parameters": the model's parameters, and any tensor the optimizer steps
      that is not one of them — ZeRO-1's flat shard (`Zero1Optimizer.shard`), the
      optimizer's own copy of this rank's 1/N_d of the parameters;
    * "gradients": their ``.grad`` (the model's, kept until the next step's
      ``zero_grad``, and the shard's, the reduce-scattered slice);
    * "optimizer": the optimizer's state (``optimizer.state``), per key in
      "optimizer_state".

    So a ZeRO-1 rank holding Ψ parameters of e bytes shows e·Ψ/N_d more
    parameters and gradients each (Ψ padded to a multiple of N_d) than the model
    alone; plain optimizers, which step the model's own tensors, add nothing
    there. At ZeRO-2 the model's gradients are gone (only the shards' remain); at
    ZeRO-3 the model's parameters are its shards (`minitp.data_parallel.zero`; the counts per
    stage beside the paper's: tests/data_parallel/test_zero.py). Each storage is counted once,
    so tied parameters (GPT's input and output embedding) count once. Compare
    Rajbhandari et al. 2020 (ZeRO): 2 + 2 + 12 bytes per parameter for
    mixed-precision Adam; here, in one dtype of e bytes, Adam keeps exp_avg and
    exp_avg_sq (2e per parameter) and a 4-byte step per parameter tensor it steps.

    Under bf16 mixed precision (`minitp.mixed_precision`) "gradients" are the
    float32 ``main_grad`` buffers and the optimizer's float32 master weights are
    optimizer state ("master", as the ZeRO paper counts them in its K = 12):
    2 + 4 + (4 + 4 + 4) = 18 bytes per parameter at stage 0.
    """
    params = {id(p): p for p in model.parameters()}
    masters = list(getattr(optimizer, "masters", []))  # mixed precision's float32 copies
    if optimizer is not None:  # what the optimizer steps: the model's tensors, or its own
        for group in getattr(optimizer, "param_groups", ()):
            params.update((id(p), p) for p in group["params"])
    for master in masters:
        params.pop(id(master), None)
    params = list(params.values())
    seen: set = set()
    grads = [g for p in params for g in (p.grad, getattr(p, "main_grad", None)) if g is not None]
    grads += [m.grad for m in masters if m.grad is not None]  # ZeRO-1's reduce-scattered slice
    result = {
        "parameters": _unique_storage_bytes(params, seen),
        "gradients": _unique_storage_bytes(grads, seen),
    }
    per_key: dict[str, int] = {}
    if masters:
        per_key["master"] = _unique_storage_bytes(masters, seen)
    if optimizer is not None:
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    per_key[key] = per_key.get(key, 0) + _unique_storage_bytes([value], seen)
    result["optimizer"] = sum(per_key.values())
    result["total"] = result["parameters"] + result["gradients"] + result["optimizer"]
    result["optimizer_state"] = per_key
    return result
