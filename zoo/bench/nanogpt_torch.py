"""The nanoGPT recipe (re-implemented in torch): karpathy/nanoGPT's model.py and train.py, written out again for the
tokens-to-loss bench (zoo.bench.tokens_to_loss), not imported: nanoGPT is a repository, not a package.

Model (model.py): a GPT-2 block, pre-LayerNorm with biases, causal self-attention through
`F.scaled_dot_product_attention`, a 4x MLP with the exact GELU (`nn.GELU()`), learned positions, the output head tied
to the token embedding; init normal(0.02), biases zero, each residual projection (`c_proj`) normal(0.02 / sqrt(2L)).
Recipe (train.py): AdamW with betas (0.9, 0.95) and weight decay 0.1 on the parameters of rank >= 2 only, the learning
rate warmed up linearly for `warmup` steps then cosine down to lr / 10 at the last step, gradients clipped to norm
1.0, no dropout. It reads the batches zoo's trainer reads (zoo.data.batches), so every row sees the same tokens.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class NanoGptConfig:
    vocab_size: int = 384  # rows of the token embedding (nanoGPT pads GPT-2's 50257 to 50304 alike)
    block_size: int = 256  # rows of the position table
    n_layer: int = 4  # blocks (L)
    n_head: int = 4  # attention heads (N)
    n_embd: int = 128  # residual width (D); the MLP is 4 D wide


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: NanoGptConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x_BTD):
        B, T, D = x_BTD.shape
        q, k, v = self.c_attn(x_BTD).split(D, dim=2)
        q, k, v = (t.view(B, T, self.n_head, D // self.n_head).transpose(1, 2) for t in (q, k, v))  # [B, N, T, H]
        y_BNTH = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y_BNTH.transpose(1, 2).contiguous().view(B, T, D))


class Mlp(nn.Module):
    def __init__(self, cfg: NanoGptConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: NanoGptConfig):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(cfg.n_embd), CausalSelfAttention(cfg)
        self.ln_2, self.mlp = nn.LayerNorm(cfg.n_embd), Mlp(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGpt(nn.Module):
    def __init__(self, cfg: NanoGptConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as nanoGPT's "weight tying"
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # residual projections: GPT-2's scaled init
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, ids_BT, targets_BT):
        """The mean next-token cross-entropy of ids_BT against targets_BT."""
        x = self.wte(ids_BT) + self.wpe(torch.arange(ids_BT.shape[1]))
        for block in self.h:
            x = block(x)
        logits_BTV = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits_BTV.view(-1, logits_BTV.size(-1)), targets_BT.reshape(-1))


def configure_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.1, betas=(0.9, 0.95)):
    """nanoGPT's: decay the rank >= 2 parameters (matrices, embeddings), not biases or norms."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def lr_at(it: int, lr: float, warmup: int, decay_iters: int, min_lr: float) -> float:
    """nanoGPT's get_lr: linear warmup, then cosine from lr down to min_lr at decay_iters."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup) / max(decay_iters - warmup, 1)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def _tensors(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(np.asarray(batch["inputs"], np.int64)), torch.from_numpy(np.asarray(batch["targets"], np.int64))


@torch.no_grad()
def eval_loss(model: NanoGpt, evals: list[dict]) -> float:
    model.eval()
    losses = [model(*_tensors(b)).item() for b in evals]  # equal batches: the mean of means is the token mean
    model.train()
    return float(np.mean(losses))


def train(cfg: NanoGptConfig, batches, evals: list[dict], steps: int, eval_every: int, seed: int, lr: float,
          warmup: int, threads: int) -> list[dict]:
    """Train `steps` steps on batches(step) (zoo.data.batches.Batches) and return the curve: one
    {step, eval_loss, seconds} per evaluation, seconds the wall time since the first step ended (evaluations
    included, as zoo's records count it)."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model = NanoGpt(cfg)
    opt = configure_optimizer(model, lr)
    curve, t0 = [], None
    for it in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(it, lr, warmup, steps, lr / 10)
        loss = model(*_tensors(batches(it)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step = it + 1
        if t0 is None:
            t0 = time.perf_counter()
        if step % eval_every == 0 or step == steps:
            curve.append({"step": step, "eval_loss": eval_loss(model, evals), "seconds": time.perf_counter() - t0})
    return curve
