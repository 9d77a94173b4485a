"""task=embed on a decoder (the gpt family): the encoder's task (zoo.tasks.embed: the same pairs, MNRL over the
global batch, gradient cache, sentence-transformers files kept in the run) with a causal model's hidden states.

A text is framed as `Pretrained.embed` frames a decoder's: its tokens as given, no token added, cut to
data.seq_len, padded on the right (a causal model's real positions never see the padding). Pooling is the
checkpoint's sentence-transformers files' (Qwen3-Embedding's and other decoder embedders': the last token, and
normalised), else the last token unnormalised; embed.pooling may ask for last, mean, max or mean_sqrt_len. The
language-model head is not read: an untied head gets no gradient (weight decay still shrinks it).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from zoo.models.gpt import Gpt
from zoo.tasks.embed import EmbedTask
from zoo.tasks.lm import check_vocab, decoder_flops


class DecoderEmbedTask(EmbedTask):
    """Contrastive sentence embeddings of a decoder's pooled final hidden states."""

    EXCLUDE = ("wpe", "['wte']", "lm_head")  # lookups and the unused head: no matmul of the loss reads them

    def __init__(self, cfg):
        self.cfg, self.model = cfg, Gpt(cfg.model)

    def init(self, rng):
        return self.model.init(rng, jnp.zeros((1, self.cfg.data.seq_len), jnp.int32))["params"]

    def hidden_states(self, params, ids_NT, valid_NT, train: bool, rng):
        """x_NTD: the decoder's final hidden states (after its last norm) of the right-padded rows."""
        return self.model.apply({"params": params}, ids_NT, deterministic=not train, hidden=True,
                                rngs={"dropout": rng})

    @classmethod
    def check_vocab(cls, cfg, tokenizer):
        check_vocab(cfg, tokenizer)
        return None

    @staticmethod
    def frame(tokenizer, specials, texts: list[str], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids [N, T], lengths [N]): each text's own tokens cut to T = seq_len, 0 after them."""
        ids = np.zeros((len(texts), seq_len), np.int32)
        lengths = np.zeros(len(texts), np.int64)
        for i, x in enumerate(tokenizer.encode_batch(texts)):
            row = x[:seq_len]
            ids[i, :len(row)], lengths[i] = row, len(row)
        return ids, lengths

    def flops_per_token(self, seq_len):
        return decoder_flops(self, seq_len)
