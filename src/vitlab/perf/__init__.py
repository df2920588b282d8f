"""Runtime settings that make a step fast on the machine at hand (measured in ``benchmarks/README.md``), one module
per thing decided:

- :mod:`~vitlab.perf.cpu`: what the CPU is (``cpu_cores``, ``cpu_model``, ``cpu_id``), the tensor memory a function
  allocates (``cpu_peak_bytes``), and denormal floats flushed to zero (``flush_denormals``);
- :mod:`~vitlab.perf.threads`: how a run spends the cores, intra-op threads against concurrent batch slices
  (``cpu_plan``, ``thread_plan``, ``plan_training``);
- :mod:`~vitlab.perf.slices`: the sliced steps themselves (``sliced_backward`` / ``sliced_forward``), the batch as
  concurrent slices on a thread pool, summed in slice order.

None of them changes the mathematics: thread counts and slices only change how the same arithmetic is scheduled.
The AdamW kernel choice is the optimiser's, :func:`vitlab.train.optim.adamw`. The public names of the three modules
are re-exported here.
"""

from vitlab.perf.cpu import cpu_cores, cpu_id, cpu_model, cpu_peak_bytes, flush_denormals, flushes_denormals
from vitlab.perf.slices import batch_coupled, rng_is_thread_safe, slice_bounds, sliced_backward, sliced_forward
from vitlab.perf.threads import (
    MIN_TOKENS_PER_PROC,
    SMALL_MODEL_MACS,
    CpuPlan,
    ThreadPlan,
    cpu_plan,
    plan_training,
    set_threads,
    thread_plan,
    why_not_sliced,
)
from vitlab.slice_rng import slice_generator

__all__ = ["MIN_TOKENS_PER_PROC", "SMALL_MODEL_MACS", "CpuPlan", "ThreadPlan", "batch_coupled", "cpu_cores",
           "cpu_id", "cpu_model", "cpu_peak_bytes", "cpu_plan", "flush_denormals", "flushes_denormals",
           "plan_training", "rng_is_thread_safe", "set_threads", "slice_bounds", "slice_generator", "sliced_backward",
           "sliced_forward", "thread_plan", "why_not_sliced"]
