"""Causal language modelling (gpt_lm): next-token loss through the fused output cross-entropy, on
windows of the token store."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from zoo.data import batches, corpus, store, stream
from zoo.data.tokenizers import encode_text, get_tokenizer
from zoo.errors import ZooDataError
from zoo.infer.sample import generate
from zoo.models import mtp
from zoo.models.gpt import Gpt, output_embedding
from zoo.nn import losses, moe
from zoo.tasks import distill, teacher_cache
from zoo.tasks.base import BaseTask, Data, attention_flops, count


def check_vocab(cfg, tokenizer) -> None:
    if tokenizer.n_vocab > cfg.model.vocab_size:
        raise ZooDataError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the vocabulary of "
                           f"data.tokenizer={cfg.data.tokenizer!r} ({tokenizer.n_vocab}); set model.vocab_size >= "
                           f"{tokenizer.n_vocab} (e.g. {-(-tokenizer.n_vocab // 128) * 128})")


def decoder_flops(task, seq_len: int) -> int:
    """6N + attention FLOPs a token of a decoder task's model (N: its params less task.EXCLUDE, and an MoE's
    experts a token does not run; multi-token prediction's modules run one block each and the output head again)."""
    m = task.cfg.model
    n = count(jax.eval_shape(task.init, jax.random.PRNGKey(0)), exclude=task.EXCLUDE)
    if m.num_experts:  # active params: a token runs R of the E experts (3 D x F kernels each) in every layer
        n -= m.num_layers * 3 * m.d_model * m.d_ff * (m.num_experts - m.experts_per_token)
    mtp_head = 6 * m.vocab_size * m.d_model * m.mtp_depth  # the shared head, counted once in n, run D times more
    return 6 * n + mtp_head + attention_flops(m.num_layers + m.mtp_depth, m.num_heads, m.head_dim, seq_len)


class LmTask(BaseTask):
    """Loss on every target token (weight = their count)."""

    name = "gpt_lm"
    UNIFORM_OVER_VOCAB = True
    def __init__(self, cfg):
        self.cfg, self.model = cfg, Gpt(cfg.model)
        # distill.teacher: a frozen teacher whose params the state carries (zoo.tasks.distill); None: none
        self.teacher = distill.Teacher(cfg) if cfg.distill.teacher else None
        # Lookups, not matmuls: learned positions, and the token embedding when the output has its own lm_head.
        self.EXCLUDE = ("wpe",) if cfg.model.tie_embeddings else ("wpe", "['wte']")

    def init(self, rng):
        return self.model.init(rng, jnp.zeros((1, self.cfg.data.seq_len), jnp.int32))["params"]

    def loss(self, params, batch, rng, train, teacher=None):
        m = self.cfg.model
        ahead = {"mtp_ids_BT": batch["targets"]} if m.mtp_depth and train else {}  # evaluation: the main loss
        out, balance = self.hidden(params, batch["inputs"], train, rng, **ahead)
        h_BTD, hs = out if ahead else (out, None)
        loss_sum, correct, extra = self.token_loss(params, h_BTD, batch, train, teacher)
        if hs:  # model.mtp_depth: the multi-token prediction modules' loss added (zoo.models.mtp)
            scaled, extra["mtp_sum"] = mtp.aux_loss(m, hs, output_embedding(m, params), batch["targets"],
                                                    batch["weights"])
            loss_sum = loss_sum + scaled
        weight = jnp.sum(batch["weights"])
        return self.add_balance(loss_sum, {"weight": weight, "correct": correct, "tokens": weight, **extra}, balance,
                                train)

    def token_loss(self, params, h_BTD, batch, train, teacher=None, **forward):
        """(loss sum, correct sum, extra sums) over the weighted targets: the fused cross-entropy, or with the
        teacher's params (distill.teacher) the distillation loss of zoo.tasks.distill (`forward`: what the teacher's
        forward pass takes beside the ids, sft's packing)."""
        w_VD, cap = output_embedding(self.cfg.model, params), self.cfg.model.final_softcap
        smoothing = self.cfg.train.label_smoothing if train else 0.0
        if "teacher_ids" in batch:  # distill.top_k: the teacher's top-k read from its cache (zoo.tasks.teacher_cache)
            teacher_out = distill.Cached(batch["teacher_ids"], batch["teacher_logits"], batch["teacher_lse"])
        elif teacher is not None:
            teacher_out = self.teacher.logits(teacher, batch["inputs"], **forward)
        else:
            loss_sum, correct = losses.linear_cross_entropy(h_BTD, w_VD, batch["targets"], batch["weights"],
                                                            label_smoothing=smoothing, logit_cap=cap)
            return loss_sum, correct, {}
        return distill.mixed_loss(self.cfg.distill, distill.student_logits(h_BTD, w_VD, cap), teacher_out,
                                  batch["targets"], batch["weights"], smoothing, batch.get(distill.ON_POLICY))

    def train_metrics(self, totals: dict) -> dict:
        out = distill.train_metrics(totals)
        if "mtp_sum" in totals:  # the modules' summed cross-entropy per token (zoo.models.mtp)
            out["mtp_loss"] = totals["mtp_sum"] / max(totals.get("weight", 0.0), 1e-9)
        return out

    def prepare(self, params, data: Data, workdir: str, resume: bool, mesh) -> None:
        """distill.top_k: the training rows with the teacher's cached top-k logits (built first when missing)."""
        if self.teacher is not None and self.cfg.distill.top_k:
            teacher_cache.attach(self, data, mesh, say=print if jax.process_index() == 0 else (lambda _: None))

    def hidden(self, params, ids_BT, train, rng, **kw):
        """(final hidden states, the MoE load-balancing loss: None for a dense model) of the model on ids_BT."""
        kw = dict(deterministic=not train, hidden=True, rngs={"dropout": rng}, **kw)
        if not self.cfg.model.num_experts:
            return self.model.apply({"params": params}, ids_BT, **kw), None
        h_BTD, sown = self.model.apply({"params": params}, ids_BT, mutable=[moe.COLLECTION], **kw)
        return h_BTD, moe.load_balancing_loss(sown, ids_BT.size)

    def add_balance(self, loss_sum, aux: dict, balance, train: bool):
        """A MoE model's load-balancing loss, as a sum like the loss (times the token weight, which the host
        divides by): `moe_aux_sum` in the metrics, and router_aux_loss_coef times it in the training loss (as
        transformers' MixtralForCausalLM adds it; evaluation reports the language-model loss alone)."""
        if balance is None:
            return loss_sum, aux
        scaled = balance * aux["weight"]
        if train:
            loss_sum = loss_sum + self.cfg.model.router_aux_loss_coef * scaled
        return loss_sum, {**aux, "moe_aux_sum": scaled}

    def flops_per_token(self, seq_len):
        return decoder_flops(self, seq_len)

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
        data = Data(train=train, eval=evals, tokenizer=tokenizer, rows=len(tokens.train) // cfg.data.seq_len)
        return teacher_cache.deferred(cfg, data, process_index, process_count)  # distill.top_k's rows

    def sample(self, params, tokenizer, prompt: str, max_new_tokens: int) -> str:
        """A sampled continuation (temperature 0.8, top-k 40, seed 0), its context cropped to the trained length."""
        out = generate(self.model, params, encode_text(tokenizer, prompt), max_new_tokens, temperature=0.8, top_k=40, seed=0,
                       eos_id=tokenizer.eot_token, vocab_limit=tokenizer.n_vocab, window=self.cfg.window)[0]
        return tokenizer.decode(out)
