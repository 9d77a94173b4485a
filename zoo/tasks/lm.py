"""Causal language modelling (gpt_lm): next-token loss through the fused output cross-entropy, on
windows of the token store."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from zoo.data import batches, corpus, store, stream
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import ZooDataError
from zoo.infer.sample import generate
from zoo.models.gpt import Gpt, output_embedding
from zoo.nn import losses
from zoo.tasks.base import BaseTask, Data, attention_flops, count


def check_vocab(cfg, tokenizer) -> None:
    if tokenizer.n_vocab > cfg.model.vocab_size:
        raise ZooDataError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the vocabulary of "
                           f"data.tokenizer={cfg.data.tokenizer!r} ({tokenizer.n_vocab}); set model.vocab_size >= "
                           f"{tokenizer.n_vocab} (e.g. {-(-tokenizer.n_vocab // 128) * 128})")


class LmTask(BaseTask):
    """Loss on every target token (weight = their count)."""

    name = "gpt_lm"
    def __init__(self, cfg):
        self.cfg, self.model = cfg, Gpt(cfg.model)
        # Lookups, not matmuls: learned positions, and the token embedding when the output has its own lm_head.
        self.EXCLUDE = ("wpe",) if cfg.model.tie_embeddings else ("wpe", "['wte']")

    def init(self, rng):
        return self.model.init(rng, jnp.zeros((1, self.cfg.data.seq_len), jnp.int32))["params"]

    def loss(self, params, batch, rng, train):
        h_BTD = self.model.apply({"params": params}, batch["inputs"], deterministic=not train, hidden=True,
                                 rngs={"dropout": rng})
        loss_sum, correct = losses.linear_cross_entropy(
            h_BTD, output_embedding(self.cfg.model, params), batch["targets"], batch["weights"],
            label_smoothing=self.cfg.train.label_smoothing if train else 0.0)
        weight = jnp.sum(batch["weights"])
        return loss_sum, {"weight": weight, "correct": correct, "tokens": weight}

    def flops_per_token(self, seq_len):
        m = self.cfg.model
        n = count(jax.eval_shape(self.init, jax.random.PRNGKey(0)), exclude=self.EXCLUDE)
        return 6 * n + attention_flops(m.num_layers, m.num_heads, m.head_dim, seq_len)

    @classmethod
    def check_data(cls, cfg, vocab: bool = True):
        if vocab:
            check_vocab(cfg, get_tokenizer(cfg.data.tokenizer))
        if cfg.data.streaming:  # its first row, not the whole source
            stream.check_stream(cfg.data)
        elif cfg.data.source not in corpus.NAMED:  # the file or dataset opens and holds text in its column
            corpus.load_documents(cfg.data)
        return cfg

    def make_data(self, cfg, process_index: int, process_count: int) -> Data:
        tokenizer = get_tokenizer(cfg.data.tokenizer)
        check_vocab(cfg, tokenizer)  # before the corpus is tokenized
        if cfg.data.streaming:
            d, t = cfg.data, cfg.train
            train = stream.StreamBatches(stream.Cursor(d, tokenizer, process_index, process_count), d.seq_len,
                                         t.batch_size, t.seed, d.shuffle_rows, process_index, process_count)
            evals = stream.eval_batches(d, tokenizer, t.batch_size, t.eval_batches, process_index, process_count)
            return Data(train=train, eval=evals, tokenizer=tokenizer)
        tokenizer, tokens = store.prepare(cfg.data, tokenizer)
        train = batches.Batches(tokens.train, cfg.data.seq_len, cfg.train.batch_size, cfg.train.seed,
                                process_index, process_count)
        evals = batches.eval_batches(tokens.val, cfg.data.seq_len, cfg.train.batch_size, cfg.train.eval_batches,
                                     process_index, process_count)
        return Data(train=train, eval=evals, tokenizer=tokenizer)

    def sample(self, params, tokenizer, prompt: str, max_new_tokens: int) -> str:
        """A sampled continuation (temperature 0.8, top-k 40, seed 0), its context cropped to the trained length."""
        out = generate(self.model, params, tokenizer.encode(prompt), max_new_tokens, temperature=0.8, top_k=40, seed=0,
                       eos_id=tokenizer.eot_token, vocab_limit=tokenizer.n_vocab, window=self.cfg.window)[0]
        return tokenizer.decode(out)
