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
(zoo.training.trainer) and names the newest one before them.

A climb can also be slow: the loss rising for several saves, each under the blow-up bound, until it
crosses it (a linear warmup into a learning rate far too high: 3.5 -> 4.6 -> 5.5 -> 7.0 -> 9.3 -> 25 over
six steps). The checkpoints of those steps are finite but not good. So a checkpoint k is confirmed good only
when the loss of step k + 1 (computed from its params) is calm: at most CALM_NATS above the lowest running
median so far (a climb raises the median too, so the median of the moment would soon call climbing steps calm).
The newest confirmed step is the run's last good checkpoint, which rotation (`train.keep`) never deletes
(zoo.training.checkpoint.KeepLatestAndGood) and which a blow-up names.
"""

from __future__ import annotations

import collections
import math
import statistics

WINDOW = 32  # steps the medians are taken over
GRAD_FACTOR = 250.0  # the gradient-norm bound is GRAD_FACTOR x spike_guard x its median
GRAD_HISTORY = 8  # steps of history before the gradient-norm bound applies
CALM_NATS = 0.5  # a step's loss at most this far above the median before it is calm
# A model whose output went uniform (a learning rate far too high can leave one there, finite, its loss exactly
# ln(vocab) and its gradients near zero, so lowering the rate never moves it) is not good either: a step whose
# loss is within UNIFORM_NATS of the uniform-output loss after the run had been UNIFORM_BELOW nats under it, or,
# whatever came before, within COLLAPSED_NATS of it with a gradient norm under COLLAPSED_GRAD (a LoRA run at lr
# 1000 without clipping that started only 0.01 nats under ln(vocab): 5.940, 5.983, 6.015, then 5.9506427 and
# 5.9506414 against ln 384 = 5.9506426; the tiny Llama's LoRA run so sat at 5.9506669 with gradient norm 0.0),
# where a fresh model near ln(vocab) has a gradient norm of order 1 (the tiny GPT's first step: 3.9).
UNIFORM_NATS = 1e-3
UNIFORM_BELOW = 0.1
COLLAPSED_NATS = 1e-4
COLLAPSED_GRAD = 1e-3


class Guard:
    def __init__(self, spike_guard: float, uniform_loss: float | None = None):
        self.factor, self.uniform = spike_guard, uniform_loss
        self.lowest = math.inf  # the lowest loss so far
        self.losses: collections.deque = collections.deque(maxlen=WINDOW)
        self.grads: collections.deque = collections.deque(maxlen=WINDOW)
        self.low = math.inf  # the lowest running median so far
        self.calm: dict[int, bool] = {}  # step -> whether its loss was calm (kept for the steps not yet confirmed)

    def confirmed(self, steps) -> int | None:
        """The newest of `steps` (saved checkpoints) whose next step was seen and calm: the last good one."""
        good = [k for k in steps if self.calm.get(k + 1)]
        return max(good) if good else None

    def forget_before(self, step: int) -> None:
        self.calm = {k: v for k, v in self.calm.items() if k >= step}

    def check(self, host) -> tuple[int, str, bool, bool] | None:
        """(step, what happened, finite, whether its params came in blown up) of the first bad step of `host`
        ((step, metrics) pairs), or None. A step whose loss or gradients are NaN/Inf came in with bad params;
        one whose update alone overflowed (finite loss and gradients) did not."""
        for step, m in host:
            if not bool(m["finite"]):
                self.calm[step] = False
                came_in_bad = not (math.isfinite(float(m["loss_sum"])) and math.isfinite(float(m["grad_norm"])))
                return step, "loss, gradients or params became non-finite (NaN/Inf)", False, came_in_bad
            weight = float(m["weight"])
            if weight <= 0:
                continue
            loss, grad = float(m["loss_sum"]) / weight, float(m["grad_norm"])
            if self.losses:
                self.low = min(self.low, statistics.median(self.losses))
            stuck = self.uniform is not None and (
                (abs(loss - self.uniform) < UNIFORM_NATS and self.lowest < self.uniform - UNIFORM_BELOW) or
                (abs(loss - self.uniform) < COLLAPSED_NATS and grad < COLLAPSED_GRAD))
            self.calm[step] = loss <= self.low + CALM_NATS and not stuck
            self.lowest = min(self.lowest, loss)
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
