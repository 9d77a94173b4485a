"""Scoring on zoo-serve's engine (`/v1/completions` with logprobs; zoo.engine.batching's docstring says how it shares
the loop with decoding): the fused log-probability of each target, zoo-eval's computation, and each position's
MAX_TOP likeliest tokens, in batches no larger than one prefill, compiled in the request's thread. `Scoring` is
mixed into `Engine`, which holds the model, params, tokenizer, `max_len`, `vocab`, the jitted `_score` and its
compiled `_scorers` (under the `_compiling` lock)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from zoo.eval.loglik import Row, pad_batch, prefix_token
from zoo.infer.encoder import bucket
from zoo.models.gpt import output_embedding
from zoo.nn.layers import einsum_f32, softcap
from zoo.nn.losses import token_logprobs

MAX_TOP = 5  # the most alternatives per position a scoring request may ask for (OpenAI's legacy limit)


class Scoring:
    def _score_fn(self, params, inputs_BT, targets_BT, *, top: bool):
        """log p of each target (zoo-eval's fused computation, so its numbers) and, with `top`, each position's
        MAX_TOP most likely tokens of the tokenizer's vocabulary (their log-probabilities and ids)."""
        cfg = self.model.cfg
        h_BTD = self.model.apply({"params": params}, inputs_BT, hidden=True)
        w_VD = output_embedding(cfg, params)
        lp_BT = token_logprobs(h_BTD, w_VD, targets_BT, logit_cap=cfg.final_softcap)
        if not top:
            return lp_BT, None, None
        B, T, D = h_BTD.shape
        C = math.gcd(B * T, 128)  # positions per step: [C, V] logits at a time, never [B, T, V]

        def chunk(h_CD):
            logits_CV = einsum_f32("CD,VD->CV", h_CD, w_VD.astype(h_CD.dtype))
            if cfg.final_softcap:
                logits_CV = softcap(logits_CV, cfg.final_softcap)
            lp_CV = jax.nn.log_softmax(logits_CV, -1)  # over every column, as token_logprobs normalises
            lp_CV = jnp.where(jnp.arange(lp_CV.shape[-1]) < self.vocab, lp_CV, -jnp.inf)  # padding is no token
            return jax.lax.top_k(lp_CV, MAX_TOP)
        vals, ids = jax.lax.map(chunk, h_BTD.reshape(B * T // C, C, D))
        return lp_BT, vals.reshape(B, T, MAX_TOP), ids.reshape(B, T, MAX_TOP)

    def score_groups(self, lengths: list[int]) -> list[np.ndarray]:
        """Indices of sequences of these lengths in scoring batches, longest first: each batch's rows times its
        padded length at most the cache's length (one row at least), so a batch costs no more than a prefill."""
        order = np.argsort(-np.asarray(lengths, np.int64), kind="stable")
        groups, i = [], 0
        while i < len(order):
            T = bucket(lengths[order[i]], self.max_len, least=8)
            rows = 1 << (max(1, self.max_len // T).bit_length() - 1)  # a power of two: few shapes to compile
            groups.append(order[i:i + rows])
            i += rows
        return groups

    def score_program(self, seqs: list[list[int]], top: bool):
        """A job (for `job`) scoring one batch of `score_groups`: padded and compiled here, in the caller's thread,
        so the engine's loop only runs it. Each sequence's tokens are scored as zoo-eval scores them (the first
        conditioned on the tokenizer's BOS, else its end-of-text); the job returns, per sequence, (float32[n]
        log-probabilities, and with `top` float32[n, MAX_TOP] and int[n, MAX_TOP] of the likeliest tokens)."""
        prefix = prefix_token(self.lm.tokenizer)
        # A prompt the tokenizer began with its own BOS (zoo.data.tokenizers.encode_text) is conditioned on that BOS,
        # which itself gets no log-probability (None in the answer, as vLLM gives the first token); any other
        # sequence is conditioned on the prefix token, as zoo-eval scores it.
        own = tuple(getattr(self.lm.tokenizer, "special_prefix", ()))
        lead = [len(own) if own and len(s) > len(own) and tuple(s[:len(own)]) == own else 0 for s in seqs]
        rows = [Row(tuple(s), len(s) - n) if n else Row((prefix, *s), len(s)) for s, n in zip(seqs, lead)]
        inputs_BT, targets_BT, _ = pad_batch(rows, 1 << (len(rows) - 1).bit_length(), self.max_len)
        key = (*inputs_BT.shape, top)
        with self._compiling:
            if key not in self._scorers:
                shape = jax.ShapeDtypeStruct(inputs_BT.shape, jnp.int32)
                self._scorers[key] = self._score.lower(self.params, shape, shape, top=top).compile()
        program = self._scorers[key]

        def run():
            lp_BT, vals_BTK, ids_BTK = program(self.params, inputs_BT, targets_BT)
            self.scored += 1
            lp_BT = np.asarray(lp_BT)
            vals_BTK, ids_BTK = (np.asarray(vals_BTK), np.asarray(ids_BTK)) if top else (None, None)

            def led(x, n, fill):  # the scored positions of a row, after n unscored leading ones
                return np.concatenate([np.full((n, *x.shape[1:]), fill, x.dtype), x]) if n else x
            return [(led(lp_BT[b, :len(s) - n], n, np.nan),
                     *((led(vals_BTK[b, :len(s) - n], n, np.nan), led(ids_BTK[b, :len(s) - n], n, -1)) if top
                       else (None, None)))
                    for b, (s, n) in enumerate(zip(seqs, lead))]
        return run
