"""Mixture of experts: the MLP variant of Mixtral and Qwen3-MoE, and its load-balancing loss.

Dimension key beside layers.py's: E experts, R experts each token is routed to (top-k), M tokens of the
batch flattened (B * T), A token-expert assignments (M * R).

`MoeMlp` routes each token to its R most probable experts (softmax over E router logits in float32, top-R,
renormalised to sum to 1 unless `norm_topk` is off: transformers' MixtralSparseMoeBlock and Qwen3-MoE's
norm_topk_prob) and returns the routing-weighted sum of those experts' SwiGLU outputs, capacity-free: no
token is dropped, and the result does not depend on how the batch is split. Three dispatches, the same
numbers (to float rounding), picked per platform (the one traced for, zoo.nn.layers.target_platform) as
attention's backend is:

- "gmm" (TPU): the sorted assignments through megablox's grouped matmul, a Pallas kernel, and its transpose
  (tgmm) for the kernels' gradient, per shard of the batch under a mesh (zoo.nn.tpu_kernels.gmm_experts).
  Not "sorted" there: XLA:TPU runs ragged_dot itself as a grouped kernel but its kernel gradient (a ragged
  contraction) as a dense masked product over all E experts.
- "sorted" (GPU): the A assignments are sorted by expert, each expert's contiguous group goes through
  its own kernels with `jax.lax.ragged_dot`, and the results are put back in token order (the inverse
  permutation, no scatter) and summed with their weights: R/E of the FLOPs of every expert on every token.
- "dense" (CPU): every expert on every token ([M, E, F]), the unchosen ones weighted 0: E/R times the
  sorted FLOPs, but XLA:CPU lowers `ragged_dot` to a masked product over all E experts for each of the A
  assignments (E * R per token, R times more still), so on CPU this is the cheaper one (1.5x per MoE
  layer step at moe_tiny's sizes).

Under a mesh the experts' kernels are stored split over the `expert` logical axis; GSPMD gathers them to
the devices that use them, as FSDP does. All-to-all token exchange (compute split by expert, each device
running only its own experts) is not implemented.

Each layer sows, into the "moe" collection, the per-expert sums that transformers' load_balancing_loss_func
pools over layers: how many assignments each expert received and the sum of its router probability.
`load_balancing_loss` turns what a model sowed into the Switch/Mixtral auxiliary loss.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.nn import tpu_kernels
from zoo.nn.layers import Dtype, constrain, einsum_f32, normal, target_platform

COLLECTION = "moe"  # the variable collection the router's statistics are sown into
IMPLEMENTATIONS = ("sorted", "dense", "gmm")  # gmm off TPU: Pallas interpret mode (checks, not speed)


def default_implementation() -> str:
    """gmm on TPU; sorted on GPUs; dense on CPU, where ragged_dot is a masked product over all experts."""
    return {"cpu": "dense", "tpu": "gmm"}.get(target_platform(), "sorted")


class MoeMlp(nn.Module):
    """x_BTD -> sum over the R chosen experts of weight * proj(act(x gate) * (x fc)). Parameters: `router`
    [D, E], `gate` and `fc` [E, D, F], `proj` [E, F, D]."""

    num_experts: int  # E
    experts_per_token: int  # R
    d_ff: int  # F: each expert's hidden width
    activation: Callable = nn.silu
    norm_topk: bool = True  # renormalise the R chosen probabilities to sum to 1 (Mixtral; Qwen3-MoE's norm_topk_prob)
    out_std: float = 0.02
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str | None = None  # sorted | dense | gmm; None: default_implementation() (per platform)

    @nn.compact
    def __call__(self, x_BTD):
        B, T, D = x_BTD.shape
        E, R, F = self.num_experts, self.experts_per_token, self.d_ff
        router_DE = self.param("router", normal(0.02, ("embed", None)), (D, E), self.param_dtype)
        gate_EDF, fc_EDF = (self.param(n, normal(0.02, ("expert", "embed", "mlp")), (E, D, F), self.param_dtype)
                            for n in ("gate", "fc"))
        proj_EFD = self.param("proj", normal(self.out_std, ("expert", "mlp", "embed")), (E, F, D), self.param_dtype)
        x_MD = x_BTD.reshape(B * T, D).astype(self.dtype)
        # Routing in float32 (as transformers: softmax of the float logits) so the choice does not hinge on bf16.
        probs_ME = jax.nn.softmax(einsum_f32("MD,DE->ME", x_MD, router_DE.astype(self.dtype)), axis=-1)
        top_MR, expert_MR = jax.lax.top_k(probs_ME, R)
        if self.norm_topk:
            top_MR = top_MR / jnp.sum(top_MR, axis=-1, keepdims=True)
        count_E = jnp.zeros((E,), jnp.float32).at[expert_MR.reshape(-1)].add(1.0)
        self.sow(COLLECTION, "router", jnp.stack([count_E, jnp.sum(probs_ME, axis=0)]))  # [2, E]
        kernels = tuple(w.astype(self.dtype) for w in (gate_EDF, fc_EDF, proj_EFD))
        implementation = self.implementation or default_implementation()
        if implementation == "dense":
            y_MD = self.dispatch_dense(x_MD, top_MR, expert_MR, *kernels)
        elif implementation == "gmm":
            y_MD = tpu_kernels.gmm_experts(x_MD, top_MR, expert_MR, *kernels, self.activation)
        else:
            y_MD = self.dispatch_sorted(x_MD, top_MR, expert_MR, count_E.astype(jnp.int32), *kernels)
        return constrain(y_MD.reshape(B, T, D), ("batch", "length", "embed"))

    def dispatch_dense(self, x_MD, top_MR, expert_MR, gate_EDF, fc_EDF, proj_EFD):
        """Every expert on every token, weighted by the routing ([M, E]: 0 where not chosen)."""
        weight_ME = jnp.einsum("MR,MRE->ME", top_MR, jax.nn.one_hot(expert_MR, self.num_experts)).astype(self.dtype)
        h_MEF = self.activation(jnp.einsum("MD,EDF->MEF", x_MD, gate_EDF)) * jnp.einsum("MD,EDF->MEF", x_MD, fc_EDF)
        return jnp.einsum("MEF,EFD->MD", h_MEF * weight_ME[..., None], proj_EFD)

    def dispatch_sorted(self, x_MD, top_MR, expert_MR, sizes_E, gate_EDF, fc_EDF, proj_EFD):
        """Each expert on its own tokens: assignments sorted by expert, one ragged_dot per kernel."""
        R, D = self.experts_per_token, x_MD.shape[-1]
        # Sort the A = M * R assignments by expert (stable: token order within a group); group e is rows
        # sum(count[:e]) .. sum(count[:e+1]) of the sorted list.
        order_A = jnp.argsort(expert_MR.reshape(-1), stable=True)
        xs_AD = jnp.take(x_MD, order_A // R, axis=0)

        def grouped(h, w):
            return jax.lax.ragged_dot(h, w, sizes_E)
        h_AF = self.activation(grouped(xs_AD, gate_EDF)) * grouped(xs_AD, fc_EDF)
        ys_AD = grouped(h_AF, proj_EFD)
        # Back to token order (the inverse permutation, no scatter-add), weighted sum over each token's R experts.
        y_MRD = jnp.take(ys_AD, jnp.argsort(order_A), axis=0).reshape(-1, R, D)
        return jnp.einsum("MRD,MR->MD", y_MRD, top_MR.astype(self.dtype))


def router_stats(variables) -> tuple[jax.Array, int]:
    """(stats_2E, layers): the sown [2, E] sums of a model's MoE layers added up (count of assignments,
    sum of router probabilities, per expert), and how many layer calls they cover. A scanned stack sows
    [L, 2, E]; a Python loop one [2, E] per layer."""
    leaves = jax.tree.leaves(variables.get(COLLECTION, {}) if hasattr(variables, "get") else variables)
    if not leaves:
        raise ValueError("no MoE router statistics were sown: apply the model with mutable=['moe']")
    stats = [x.reshape(-1, *x.shape[-2:]) for x in leaves]
    return sum(jnp.sum(s, axis=0) for s in stats), sum(s.shape[0] for s in stats)


def load_balancing_loss(variables, tokens: int) -> jax.Array:
    """Switch Transformer's auxiliary loss as transformers' load_balancing_loss_func computes it (every token
    counted): E * sum_e f_e * P_e, where f_e is the share of (token, layer) rows that picked expert e among
    their R (so sum_e f_e = R) and P_e the mean router probability of e, both pooled over all MoE layers.
    Balanced routing gives R; `tokens` is B * T of the batch the model was applied to."""
    stats_2E, layers = router_stats(variables)
    rows = tokens * layers
    E = stats_2E.shape[-1]
    return E * jnp.sum((stats_2E[0] / rows) * (stats_2E[1] / rows))
