"""Knowledge distillation on the LM tasks (distill.teacher on task=gpt_lm or sft): a frozen teacher, loaded from
any zoo.load source, runs in the same jitted step as the student, on the same rows.

The loss per target token t of weight w_t (gpt_lm: every target; sft: the answer tokens alone), with z the
student's logits, u the teacher's, T = distill.temperature, beta = distill.beta, alpha = distill.alpha:

    p = softmax(u / T), q = softmax(z / T)
    D_beta(p, q) = KL(p || q)                                   beta = 0 (forward KL: Hinton et al. 2015)
                 = KL(q || p)                                   beta = 1 (reverse KL)
                 = beta KL(p || m) + (1 - beta) KL(q || m),     m = beta p + (1 - beta) q (GKD, Agarwal et al.
                                                                2024, arXiv:2306.13649; TRL's generalized_jsd_loss)
    loss_t = alpha T^2 D_beta(p, q) + (1 - alpha) CE(z, target)

summed over the tokens with their weights (the trainer divides by the summed weights, as for the plain loss).
T^2 keeps the divergence's gradients the size of the cross-entropy's as T grows (Hinton's scaling; TRL's GKD
leaves it out: at T = 1 the two agree). The training metrics carry kl (the T^2-scaled divergence per token) and
ce (the student's cross-entropy per token) beside the mixed loss.

The teacher: its params ride in the train state (zoo.training.step.TrainState.teacher), laid out over the mesh by
the rules table that lays out the student's (zoo.load(source, mesh=...)), frozen (no gradient, no optimizer
state), and never written to the run's checkpoints: a resumed run loads it again from distill.teacher. It must
share the student's vocabulary (same model.vocab_size and tokenizer size). Evaluation runs the student alone:
eval_loss is its cross-entropy, comparable with a run trained without a teacher.

On-policy distillation (distill.on_policy > 0, task=sft: zoo.tasks.gkd): on a share of the steps the rows hold the
student's own sampled answers, flagged by the batch's `on_policy` row key (ON_POLICY); those rows take alpha = 1, the
divergence alone, as TRL's GKDTrainer trains them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from zoo.errors import ConfigError
from zoo.nn import lora
from zoo.nn.layers import einsum_f32, softcap


def divergence(student_BTV, teacher_BTV, temperature: float = 1.0, beta: float = 0.0):
    """float32[B, T]: D_beta(teacher, student) per token of the temperature-scaled logits (the module's docstring;
    no T^2)."""
    s = jax.nn.log_softmax(student_BTV.astype(jnp.float32) / temperature, -1)
    t = jax.nn.log_softmax(teacher_BTV.astype(jnp.float32) / temperature, -1)

    def kl(a, b):  # KL(exp a || exp b) over the last axis
        return jnp.sum(jnp.exp(a) * (a - b), -1)
    if beta == 0:
        return kl(t, s)
    if beta == 1:
        return kl(s, t)
    m = jnp.logaddexp(s + jnp.log1p(-beta), t + jnp.log(beta))
    return beta * kl(t, m) + (1 - beta) * kl(s, m)


class Cached(NamedTuple):
    """The teacher's k largest logits at each position and their ids, and the log-normaliser of all its logits at the
    run's temperature, read from its cache (zoo.tasks.teacher_cache) instead of run in the step."""

    ids_BTK: jax.Array  # int32
    logits_BTK: jax.Array  # float32, the raw logits (before the temperature)
    lse_BT: jax.Array  # float32, logsumexp over the whole vocabulary of the logits / distill.temperature


def cached_divergence(student_BTV, teacher: Cached, temperature: float = 1.0):
    """float32[B, T]: KL(p || q) per token between the teacher's and the student's distributions at temperature T,
    coarsened to the teacher's k ids plus one bucket for the rest of the vocabulary:

        sum_i p_i (log p_i - log q_i) + p_rest (log p_rest - log q_rest),   i over the k ids,

    p_i = exp(u_i / T - lse) the teacher's true probabilities (lse cached over its whole vocabulary), p_rest = 1 -
    sum p_i, q the student's softmax(z / T) over the whole vocabulary, q_rest = 1 - sum q_i. By the log-sum
    inequality it is at most the full KL, and with k = the vocabulary it is the full KL (divergence(beta=0))."""
    s_BTV = jax.nn.log_softmax(student_BTV.astype(jnp.float32) / temperature, -1)
    s_BTK = jnp.take_along_axis(s_BTV, teacher.ids_BTK, -1)
    t_BTK = teacher.logits_BTK.astype(jnp.float32) / temperature - teacher.lse_BT[..., None]
    p_BTK = jnp.exp(t_BTK)
    kl_BT = jnp.sum(p_BTK * (t_BTK - s_BTK), -1)
    if teacher.ids_BTK.shape[-1] == student_BTV.shape[-1]:  # the whole vocabulary: no rest (only rounding's)
        return kl_BT
    # The rest's masses, 1 - sums of float32 probabilities: known to float32's epsilon, below which q_rest is held
    eps = jnp.finfo(jnp.float32).eps
    p_rest_BT = jnp.maximum(1.0 - jnp.sum(p_BTK, -1), 0.0)
    q_rest_BT = jnp.maximum(1.0 - jnp.sum(jnp.exp(s_BTK), -1), eps)
    return kl_BT + jax.scipy.special.xlogy(p_rest_BT, p_rest_BT) - jax.scipy.special.xlogy(p_rest_BT, q_rest_BT)


def cross_entropy(logits_BTV, targets_BT, smoothing: float = 0.0):
    """(float32[B, T] token cross-entropies, float32[B, T] 1 where the target is the argmax), label smoothing as
    zoo.nn.losses.linear_cross_entropy applies it."""
    lse_BT = jax.nn.logsumexp(logits_BTV, -1)
    target_BT = jnp.take_along_axis(logits_BTV, targets_BT[..., None], -1)[..., 0]
    ce_BT = lse_BT - target_BT
    if smoothing:
        ce_BT = ce_BT + smoothing * (target_BT - jnp.mean(logits_BTV, -1))
    return ce_BT, (target_BT >= jnp.max(logits_BTV, -1)).astype(jnp.float32)


# The batch key of on-policy distillation's rows (zoo.tasks.gkd): float32[B], 1 where a row's answer is the student's
# own sample, trained on the divergence alone. Absent from every other batch.
ON_POLICY = "on_policy"


def mixed_loss(dcfg, student_BTV, teacher_BTV, targets_BT, weights_BT, smoothing: float = 0.0, on_policy_B=None):
    """(loss sum, correct sum, {"kl_sum", "ce_sum"}) over the weighted tokens; dcfg a DistillConfig. `on_policy_B`
    (zoo.tasks.gkd's rows): where 1, alpha is taken as 1, the divergence alone, as TRL's GKD trains the student's own
    samples (no cross-entropy toward them); None: every row mixes with distill.alpha. teacher_BTV: the teacher's
    logits, or its cached top-k (Cached)."""
    w_BT = weights_BT.astype(jnp.float32)
    ce_BT, correct_BT = cross_entropy(student_BTV, targets_BT, smoothing)
    teacher_BTV = jax.tree.map(jax.lax.stop_gradient, teacher_BTV)
    d_BT = (cached_divergence(student_BTV, teacher_BTV, dcfg.temperature) if isinstance(teacher_BTV, Cached) else
            divergence(student_BTV, teacher_BTV, dcfg.temperature, dcfg.beta))
    kl_BT = dcfg.temperature ** 2 * d_BT
    kl, ce = jnp.sum(kl_BT * w_BT), jnp.sum(ce_BT * w_BT)
    if on_policy_B is None:
        loss = dcfg.alpha * kl + (1 - dcfg.alpha) * ce
    else:
        alpha_B1 = jnp.where(on_policy_B[:, None] > 0, 1.0, dcfg.alpha)
        loss = jnp.sum(w_BT * (alpha_B1 * kl_BT + (1 - alpha_B1) * ce_BT))
    return loss, jnp.sum(correct_BT * w_BT), {"kl_sum": kl, "ce_sum": ce}


def student_logits(h_BTD, w_VD, cap: float = 0.0):
    """float32[B, T, V]: the student's logits from its final hidden states (soft-capped as the fused loss caps)."""
    logits_BTV = einsum_f32("BTD,VD->BTV", h_BTD, w_VD.astype(h_BTD.dtype))
    return softcap(logits_BTV, cap) if cap else logits_BTV


def train_metrics(totals: dict) -> dict:
    """kl and ce per weighted token, from the summed aux of the steps logged (nothing without a teacher)."""
    if "kl_sum" not in totals:
        return {}
    n = max(totals.get("weight", 0.0), 1e-9)
    return {"kl": totals["kl_sum"] / n, "ce": totals["ce_sum"] / n}


class Teacher:
    """The frozen teacher of distill.teacher: its module once `load` has read it."""

    def __init__(self, cfg):
        self.cfg, self.source, self.model = cfg, cfg.distill.teacher, None
        self.loader = None  # distill.top_k: mesh -> the teacher's params, called only when its cache is built

    def load(self, mesh, load):
        """The teacher's params laid out over `mesh` (zoo's rules table, as the student's), its vocabulary checked
        against the student's. `load` is zoo.load (handed down by zoo.train: the tasks sit below zoo.api)."""
        from zoo.data.tokenizers import get_tokenizer
        check_source(self.source)
        pre = load(self.source, mesh=mesh)
        where = f"distill.teacher={self.source!r}"
        if pre.config.model.family != "gpt":
            raise ConfigError(f"{where} holds a {pre.config.model.family} model; a teacher of gpt_lm or sft is a gpt "
                              f"(decoder) model")
        mine, theirs = self.cfg.model.vocab_size, pre.config.model.vocab_size
        if mine != theirs:
            raise ConfigError(f"{where} has model.vocab_size={theirs} but the student's model.vocab_size={mine}; "
                              f"a teacher must share the student's tokenizer and vocabulary (set "
                              f"model.vocab_size={theirs} and the teacher's data.tokenizer)")
        n_mine, n_theirs = get_tokenizer(self.cfg.data.tokenizer).n_vocab, pre.tokenizer.n_vocab
        if n_mine != n_theirs:
            raise ConfigError(f"{where} has a tokenizer of {n_theirs} tokens but the student's data.tokenizer="
                              f"{self.cfg.data.tokenizer!r} has {n_mine}; a teacher must share the student's tokenizer")
        if pre.config.model.max_len < self.cfg.data.seq_len:
            raise ConfigError(f"{where} reads {pre.config.model.max_len} positions (model.max_len) but "
                              f"data.seq_len={self.cfg.data.seq_len}; set data.seq_len <= {pre.config.model.max_len}")
        self.model = pre.model
        return pre.params

    def logits(self, params, ids_BT, **kw):
        """float32[B, T, V] of the teacher on ids_BT (no dropout, no gradient; a LoRA student's adapters off)."""
        with lora.adapters_off():
            out = self.model.apply({"params": params}, ids_BT, deterministic=True, **kw)
        return jax.lax.stop_gradient(out.astype(jnp.float32))


def check_source(source: str) -> None:
    """Refuse (ConfigError) a distill.teacher that names nothing zoo.load reads, before anything is built."""
    from zoo.errors import CheckpointError
    from zoo.sources import kind_of
    try:
        kind_of(source)
    except CheckpointError as e:
        raise ConfigError(f"distill.teacher: {e}") from None


def attach(s, state, load=None):
    """`state` with the teacher's params (s.task.teacher, read by `load`, zoo.load, and laid out over s.mesh) and
    s.state_shardings saying where they lie; the state as it is when the task has no teacher, or reads the teacher's
    cached top-k (distill.top_k: the teacher is read, by `load`, only to build the cache)."""
    teacher = getattr(s.task, "teacher", None)
    if teacher is None:
        return state
    if load is None:
        raise ConfigError(f"distill.teacher={teacher.source!r}: the teacher is read by zoo.train (train.py), which "
                          f"hands the trainer zoo.load; call zoo.train, or trainer.train(..., teacher_of=zoo.load)")
    if s.cfg.distill.top_k:  # the step reads the teacher's cached top-k (LmTask.prepare): no params in the state
        teacher.loader = lambda mesh: teacher.load(mesh, load)
        return state
    params = teacher.load(s.mesh, load)
    s.state_shardings = s.state_shardings.replace(teacher=jax.tree.map(lambda x: x.sharding, params))
    return state.replace(teacher=params)
