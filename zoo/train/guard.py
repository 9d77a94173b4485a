"""What stops a run that went wrong, step by step, on the host: a non-finite step (loss, gradients or params
NaN/Inf), or a finite blow-up (`train.spike_guard`).

A blow-up is a step whose loss exceeds max(spike_guard x, spike_guard nats +) the median loss of the
WINDOW steps before it in this process, or, once GRAD_HISTORY steps are in, whose gradient norm exceeds
GRAD_FACTOR x spike_guard x their median. Both bounds are wide (defaults: 4x and +4 nats on the loss, 1000x
on the gradient norm) because a
stop is expensive: ordinary batch-to-batch noise, even a near-zero classification loss meeting a hard batch
(0.05 -> 1.5), or a classifier head that starts at zero (its first gradient norm 1e-4, its second 0.05:
hence no gradient bound over fewer than GRAD_HISTORY steps), stays below them, while a learning rate far too high (1e6: 5.9 -> 1.7e5 in one step; 30
with no clipping: 5.9 -> 7.3e6 in ten) crosses them within a few steps.

The checkpoint of step k holds the params that the loss of step k + 1 is computed from, so a blow-up (or a
NaN loss) seen at step S means the checkpoints from step S - 1 on may hold the blown-up params: the trainer moves those aside
(zoo.train.trainer) and names the newest one before them, the last good one.
"""

from __future__ import annotations

import collections
import math
import statistics

WINDOW = 32  # steps the medians are taken over
GRAD_FACTOR = 250.0  # the gradient-norm bound is GRAD_FACTOR x spike_guard x its median
GRAD_HISTORY = 8  # steps of history before the gradient-norm bound applies


class Guard:
    def __init__(self, spike_guard: float):
        self.factor = spike_guard
        self.losses: collections.deque = collections.deque(maxlen=WINDOW)
        self.grads: collections.deque = collections.deque(maxlen=WINDOW)

    def check(self, host) -> tuple[int, str, bool, bool] | None:
        """(step, what happened, finite, whether its params came in blown up) of the first bad step of `host`
        ((step, metrics) pairs), or None. A step whose loss or gradients are NaN/Inf came in with bad params;
        one whose update alone overflowed (finite loss and gradients) did not."""
        for step, m in host:
            if not bool(m["finite"]):
                came_in_bad = not (math.isfinite(float(m["loss_sum"])) and math.isfinite(float(m["grad_norm"])))
                return step, "loss, gradients or params became non-finite (NaN/Inf)", False, came_in_bad
            weight = float(m["weight"])
            if weight <= 0:
                continue
            loss, grad = float(m["loss_sum"]) / weight, float(m["grad_norm"])
            if self.factor and self.losses:
                ml, mg = statistics.median(self.losses), statistics.median(self.grads)
                n = len(self.losses)
                if loss > max(self.factor * ml, ml + self.factor):
                    return step, (f"the loss {loss:.4g} is over {self.factor:g}x (and {self.factor:g} nats above) the "
                                  f"median {ml:.4g} of the {n} steps before (train.spike_guard)"), True, True
                if n >= GRAD_HISTORY and mg > 0 and grad > GRAD_FACTOR * self.factor * mg:
                    return step, (f"the gradient norm {grad:.4g} is over {GRAD_FACTOR * self.factor:g}x the median "
                                  f"{mg:.4g} of the {n} steps before (train.spike_guard)"), True, True
            self.losses.append(loss)
            self.grads.append(grad)
        return None
