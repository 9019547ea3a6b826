"""`bench/gpt_step.py --profile`: where each row's step time goes, from torch.profiler.

Three timed steps of each row after two of warm-up, then one table a row: the top kernels
by self time (device time on a GPU, CPU time on the CPU), with their calls, and the total
of kernels launched. The same numbers issue 37 read off an H200 to find the loss's float32
log-softmax and the wrapper's masking."""

from __future__ import annotations

from torch.profiler import ProfilerActivity, profile

from minitp.runtime._device import synchronize

TOP = 12


def profile_rows(steps_of: dict, x, y, device, steps: int = 3, top: int = TOP) -> None:
    """Print each row's top `top` ops by self time over `steps` steps."""
    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    for row, step in steps_of.items():
        for _ in range(2):  # warm-up: allocator, kernels, AdamW state
            step(x, y)
        synchronize(device)
        with profile(activities=activities) as prof:
            for _ in range(steps):
                step(x, y)
            synchronize(device)
        events = prof.key_averages()
        field = "self_device_time_total" if on_gpu else "self_cpu_time_total"
        ranked = sorted((e for e in events if getattr(e, field) > 0),
                        key=lambda e: getattr(e, field), reverse=True)
        total = sum(getattr(e, field) for e in ranked)
        calls = sum(e.count for e in ranked if not on_gpu or e.device_type.name == "CUDA")
        print(f"\n{row}: {total / 1e3 / steps:.1f} ms a step in "
              f"{'kernels' if on_gpu else 'ops (self CPU time)'}, {calls / steps:.0f} calls a "
              f"step; top {top} over {steps} steps:")
        for e in ranked[:top]:
            print(f"  {e.key[:60]:60} {getattr(e, field) / 1e3:9.2f} ms {e.count:7d} calls")
