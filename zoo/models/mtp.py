"""Multi-token prediction (model.mtp_depth = D > 0): DeepSeek-V3's sequential MTP modules (arXiv:2412.19437, section
2.2) as an auxiliary loss of gpt_lm pretraining, on the one training step.

Module k (1..D) predicts the token k + 1 places ahead. With h^0 the main stack's last hidden states (before its final
norm) and x the row's tokens:

    h'^k_t = W^k [norm_h(h^{k-1}_t); norm_e(Emb(x_{t+k}))]         W^k: [2D, D], held as proj_h and proj_e
    h^k    = Block^k(h'^k)                                          one causal block of the model's own kind
    p^k_t  = softmax(Head(ln_f^k(h^k_t)))   predicting x_{t+k+1}    Emb and Head: the model's own (shared)

and the training loss is the main cross-entropy plus (model.mtp_weight / D) times the sum of the D modules'
cross-entropies (DeepSeek-V3's lambda: 0.3 early in training, 0.1 later), over the positions whose target lies inside
the row. Evaluation, sampling, serving and export run the main model alone: the modules' params ride beside it
(mtp_0 .. mtp_{D-1}) and are ignored there. gpt_lm trains them; the other tasks of a GPT leave them as they are.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from zoo.nn import layers, losses
from zoo.nn.block import Block
from zoo.nn.stack import stack_blocks


class MtpModule(nn.Module):
    """(h^k before its norm: the next module's input, ln_f^k(h^k): the hidden states the head reads) from h^{k-1}
    and the embeddings of the tokens k places ahead."""

    cfg: object  # the GptConfig
    block_kw: dict

    @nn.compact
    def __call__(self, h_BTD, ahead_BTD, deterministic: bool, positions, segment_ids_BT):
        cfg = self.cfg
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        norm = layers.make_norm(cfg.norm)
        D = cfg.d_model

        def proj(name, x_BTD):  # W^k's two halves, [D, D] each: hidden kernels (Muon's, under optim.name=muon)
            return layers.Einsum((D, D), ("embed", "mlp"), "BTD,DE->BTE", dtype=dtype, param_dtype=param_dtype,
                                 name=name)(x_BTD)
        x_BTD = (proj("proj_h", norm(cfg.ln_eps, dtype, param_dtype, name="norm_h")(h_BTD)) +
                 proj("proj_e", norm(cfg.ln_eps, dtype, param_dtype, name="norm_e")(ahead_BTD)))
        x_BTD = layers.constrain(x_BTD, ("batch", "length", "embed"))
        block = stack_blocks(Block, 1, scan=False, remat=cfg.remat, remat_policy=cfg.remat_policy, name="h",
                             **self.block_kw)
        x_BTD = block(x_BTD, None, deterministic, False, positions, segment_ids_BT)
        return x_BTD, norm(cfg.ln_eps, dtype, param_dtype, name="ln_f")(x_BTD)


def run(gpt, h_BTD, ids_BT, embed, block_kw: dict, deterministic: bool, positions, segment_ids_BT) -> list:
    """The D modules' final hidden states (each [B, T, D]) from the main stack's h_BTD; ids_BT the tokens one place
    ahead of the inputs (the targets); embed the model's token embedding. Called inside Gpt's compact call."""
    outs = []
    block_kw = {k: v for k, v in block_kw.items() if k != "per_layer"}  # one block: no per-layer switches
    for k in range(gpt.cfg.mtp_depth):
        ahead_BT = jnp.roll(ids_BT, -k, axis=1)  # x_{t+1+k}; the last k positions wrap (their targets weigh 0)
        h_BTD, out_BTD = MtpModule(gpt.cfg, block_kw, name=f"mtp_{k}")(h_BTD, embed(ahead_BT), deterministic,
                                                                        positions, segment_ids_BT)
        outs.append(out_BTD)
    return outs


def aux_loss(cfg, hs: list, w_VD, targets_BT, weights_BT):
    """(model.mtp_weight / D times the sum of the modules' cross-entropy sums, that sum unscaled): module k (0-based)
    predicts targets k + 1 places on, weighted where that target lies in the row and both places weigh."""
    T = targets_BT.shape[1]
    total = jnp.zeros((), jnp.float32)
    for k, h_BTD in enumerate(hs, start=1):
        target_BT = jnp.roll(targets_BT, -k, axis=1)
        w_BT = weights_BT * jnp.roll(weights_BT, -k, axis=1) * (jnp.arange(T) < T - k)
        ce, _ = losses.linear_cross_entropy(h_BTD, w_VD, target_BT, w_BT, logit_cap=cfg.final_softcap)
        total = total + ce
    return cfg.mtp_weight / len(hs) * total, total
