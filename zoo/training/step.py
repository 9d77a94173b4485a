"""The training state and the pure step functions the trainer jits: `train_step(state, batch)` and
`eval_step(params, batch)`, built from a Task, an optax transform and a schedule (closed over, never
static arguments)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from zoo.training import freeze


class TrainState(struct.PyTreeNode):
    """`params` are what trains (gradients and optimizer moments exist for them alone); `frozen` the rest of
    the model's params (LoRA's base, a partial fine-tune's frozen layers; empty when everything trains),
    joined with `params` for the loss (zoo.training.freeze). `teacher` a distilled run's frozen teacher params
    (zoo.tasks.distill; empty without one), handed to the loss apart from the model's and never checkpointed."""
    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array
    frozen: Any = struct.field(default_factory=dict)
    teacher: Any = struct.field(default_factory=dict)


def make_train_step(task, tx, schedule, grad_accum: int):
    def grads_of(params, frozen, teacher, batch, rng):
        kw = {"teacher": teacher} if teacher else {}  # no teacher: the task's loss called as it always was

        def loss(p):
            return task.loss(freeze.join(p, frozen), batch, rng, True, **kw)
        (loss_sum, aux), grads = jax.value_and_grad(loss, has_aux=True)(params)
        return grads, {"loss_sum": loss_sum, **aux}

    def train_step(state: TrainState, batch):
        rng = jax.random.fold_in(state.rng, state.step)
        if grad_accum == 1:
            grads, sums = grads_of(state.params, state.frozen, state.teacher, batch, rng)
        else:
            # Microbatch i takes rows i::A, so every device keeps an equal share of each microbatch.
            micro = jax.tree.map(lambda x: x.reshape(x.shape[0] // grad_accum, grad_accum, *x.shape[1:])
                                 .swapaxes(0, 1), batch)

            def body(acc, i_mb):
                i, mb = i_mb
                g, s = grads_of(state.params, state.frozen, state.teacher, mb, jax.random.fold_in(rng, i))
                return jax.tree.map(jnp.add, acc, (g, s)), None
            zero = jax.eval_shape(grads_of, state.params, state.frozen, state.teacher,
                                  jax.tree.map(lambda x: x[0], micro), rng)
            zero = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), zero)
            (grads, sums), _ = jax.lax.scan(body, zero, (jnp.arange(grad_accum), micro))
        # The loss is a sum over tokens; one division by the token count gives the mean's gradient.
        grads = jax.tree.map(lambda g: g / sums["weight"], grads)
        grad_norm = optax.tree.norm(grads)
        # A non-finite step is not applied, so the state stays the last good one; the host stops. A
        # cond rather than a select per leaf: the update then writes the donated buffers in place,
        # where a select keeps both versions alive and XLA copies every param and moment first.
        finite = jnp.isfinite(sums["loss_sum"]) & jnp.isfinite(grad_norm)

        def apply(params, opt_state):
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        params, opt_state = jax.lax.cond(finite, apply, lambda p, o: (p, o), state.params, state.opt_state)
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        param_norm = optax.tree.norm(params)
        # An update can overflow although its gradients were finite (a huge lr): the params' norm, computed
        # anyway, flags it, and the host stops before anything saves this state.
        metrics = {**sums, "grad_norm": grad_norm, "param_norm": param_norm,
                   "lr": schedule(state.step), "finite": finite & jnp.isfinite(param_norm)}
        return new_state, metrics
    return train_step


def make_eval_step(task):
    def eval_step(params, batch):
        loss_sum, aux = task.loss(params, batch, jax.random.PRNGKey(0), False)
        return {"loss_sum": loss_sum, **aux}
    return eval_step


def state_init(task, tx, trainable=None, quantize: str = "none", scanned: bool = False):
    """rng -> TrainState with boxed params and optimizer state (logical axis names kept; nn.unbox to train):
    the paths in `trainable` (None: all) train, the rest is frozen (held quantized as `quantize` says)."""
    def init(rng) -> TrainState:
        params_rng, state_rng = jax.random.split(rng)
        params, frozen = freeze.split(task.init(params_rng), trainable)
        frozen = freeze.quantize_frozen(frozen, params, quantize, scanned)
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=state_rng,
                          frozen=frozen)
    return init
