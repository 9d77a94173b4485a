"""Pretrained: what zoo.load returns. One object per loaded model, whatever its family, holding the Flax linen
module (`model`), its `params`, `tokenizer` and `config`, with the calls a user of that family makes:

    decoders (GPT family)     generate, chat, logprobs, loss
    BERT                      classify (bert_cls), fill_mask (bert_mlm), tag (bert_tokens)
    encoder-decoders          translate
    every family              apply, loss_fn, batch (a training loop of one's own), save, tokenize, detokenize

`apply` and `loss_fn` are pure functions of (params, batch): `jax.jit`, `jax.grad` and shardings apply to
them as to any. The methods are thin: the work is in zoo.api.decoder, encoder, seq2seq, batches and save, the
same functions the commands call. A call the model cannot answer (a BERT asked to generate) raises
zoo.errors.FamilyError naming what it offers; a bad argument raises zoo.errors.ArgumentError naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Iterator

import numpy as np

from zoo.api import batches, decoder, encoder, save, seq2seq
from zoo.configuration import Config
from zoo.errors import ArgumentError

# What each task's model answers (besides apply, loss_fn, batch, save, tokenize).
OFFERS = {"gpt_lm": ("generate", "chat", "logprobs", "loss", "embed"),
          "sft": ("generate", "chat", "logprobs", "loss", "embed"),
          "dpo": ("generate", "chat", "logprobs", "loss", "embed"),
          "grpo": ("generate", "chat", "logprobs", "loss", "embed"),
          "bert_cls": ("classify", "rerank", "embed"), "bert_mlm": ("fill_mask", "embed"),
          "bert_tokens": ("tag", "embed"),
          "seq2seq": ("translate",), "bert_encoder": ("embed",), "embed": ("embed",)}


@dataclasses.dataclass(eq=False, repr=False)
class Pretrained:
    """A loaded model: `model` (the Flax linen module), `params` (its parameter tree, a dict of jax arrays),
    `tokenizer` (encode / decode; `n_vocab`, `eot_token`), `config` (the run's zoo.configuration.Config).

    `source` is what was loaded, `kind` which kind it was (run, hf, adapter, gguf, preset), `step` the
    checkpoint's step (a zoo run), `run_dir` the zoo run its chat template and class names come from, and
    `lora_run` the LoRA run whose adapters `save(format="peft")` writes (its params here are merged).
    Unpacks as the old tuple: `model, params, tokenizer, config = zoo.load(...)`.
    """

    model: Any
    params: Any
    tokenizer: Any
    config: Config
    source: str = ""
    kind: str = ""
    step: int | None = None
    run_dir: str | None = None
    lora_run: str | None = None

    def __iter__(self) -> Iterator:
        return iter((self.model, self.params, self.tokenizer, self.config))

    def __repr__(self) -> str:
        from zoo.hf.convert import count
        return (f"Pretrained({self.source!r}: {self.config.model.family} model, task {self.config.task}, "
                f"{count(self.params):,} params" + (f", step {self.step}" if self.step is not None else "") + ")")

    def offers(self) -> list[str]:
        """The task-specific methods this model answers (e.g. ['generate', 'chat', 'logprobs', 'loss'])."""
        return list(OFFERS.get(self.config.task, ())) + ["apply", "loss_fn", "batch", "save"]

    # ---- decoders ------------------------------------------------------------------------------------
    def generate(self, prompts: str | list[str], *, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 0, stop: str | list[str] | None = None,
                 n: int = 1, json_schema: dict | None = None) -> str | list:
        """The continuation (new text only) of a prompt, or of each prompt of a list, decoded together in one
        KV-cached batch. temperature 0 is greedy; top_k 0 and top_p 1 are off; `seed` makes sampling repeatable;
        `n` samples per prompt (a list of n for one prompt, a list of lists for several). A row stops at the
        tokenizer's end-of-text or end-of-turn token or after max_new_tokens; `stop` strings cut the text after.
        A string in gives a string out; a list gives a list in the same order. `json_schema` (a JSON schema, a dict;
        {"type": "object"} for any object) keeps each text to it: the tokens off the schema's grammar are masked out
        (zoo.infer.grammar, on zoo-serve's engine), and a text ends when its JSON is complete (it parses unless cut
        by max_new_tokens)."""
        return decoder.generate(self, prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                top_p=top_p, seed=seed, stop=stop, n=n, json_schema=json_schema)

    def chat(self, messages: str | list, *, system: str | None = None, max_new_tokens: int = 256,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
             stop: str | list[str] | None = None, n: int = 1, json_schema: dict | None = None,
             tools: list | None = None) -> str | dict | list:
        """The assistant's answer, rendered with the checkpoint's chat template (a chat run's own, else its
        tokenizer's, else zoo's default): to a user message (a string), to a conversation (a list of {"role":
        "system" | "user" | "assistant", "content": ...} dicts, multi-turn), or to each of a list of user messages
        or of conversations (decoded in one batch, a list back, as generate does with a list of texts). `system` is put first where a conversation has no system message; the other
        arguments are generate's. `tools` (OpenAI's function tools): rendered by the chat template, and each answer
        an assistant message {"role", "content", "tool_calls"} with its calls parsed (zoo.api.tool_answers)."""
        return decoder.chat(self, messages, system=system, max_new_tokens=max_new_tokens, temperature=temperature,
                            top_k=top_k, top_p=top_p, seed=seed, stop=stop, n=n, json_schema=json_schema, tools=tools)

    def logprobs(self, texts: str | list, *, answers=None, batch_size: int = 8):
        """Each token's log-probability (natural log, float32 numpy array of the text's token count) under
        zoo-eval's conventions: the first token conditioned on the tokenizer's BOS (else its end-of-text token),
        every token scored once, a text longer than the context scored in windows every half context. One text
        gives one array, a list a list. Their sums are zoo-eval's per-document log-likelihoods.

        With `answers`, `texts` are prompts and the arrays hold the log-probabilities of each answer's tokens
        only, given its prompt, as a DPO run (task=dpo) scores a pair's answer: a text prompt is followed by
        its answer as plain text (+ end-of-text); a conversation (a list of {"role", "content"} dicts) by the
        assistant's answer (a string, or a list of messages), rendered with the checkpoint's chat template, its
        end-of-turn token scored. One prompt and one answer give one array, lists (one answer per prompt) a list;
        an array's sum is DPO's summed log-probability of that answer (logps/chosen). zoo.api.answers."""
        if answers is not None:
            from zoo.api.answers import answer_logprobs
            decoder.require_decoder(self, "logprobs")
            return answer_logprobs(self, texts, answers, batch_size)
        return decoder.logprobs(self, texts, batch_size=batch_size)

    def loss(self, texts: str | list[str], *, batch_size: int = 8) -> float:
        """The mean next-token loss (negative log-likelihood per token, nats) of the texts together: zoo-eval's
        NLL/token (the logprobs of every token of every text, summed, over their count)."""
        return decoder.loss(self, texts, batch_size=batch_size)

    # ---- BERT ----------------------------------------------------------------------------------------
    def classify(self, texts: str | list[str], pairs: str | list[str] | None = None, *,
                 batch_size: int = 32) -> dict | list[dict]:
        """A classifier's (task bert_cls) prediction for a text, or each of a list: {"label": the most likely
        class, "probs": {class: probability}}; `pairs` the second texts of sentence pairs. Class names come from
        the run's labels.json, else its config."""
        return encoder.classify(self, texts, pairs, batch_size=batch_size)

    def rerank(self, query: str, documents: list[str], *, top_k: int | None = None, batch_size: int = 32) -> list:
        """A cross-encoder's (a bert_cls model with one output, e.g. ms-marco-MiniLM) ranking of `documents` for
        `query`: [{"corpus_id": index in documents, "score": sigmoid of the logit of ([CLS] query [SEP] document
        [SEP])}], best first, the first `top_k`; as sentence-transformers' CrossEncoder.rank."""
        return encoder.rerank(self, query, documents, top_k=top_k, batch_size=batch_size)

    def fill_mask(self, texts: str | list[str], *, top_k: int = 5, batch_size: int = 32) -> list:
        """A masked LM's (task bert_mlm) top_k tokens at each "[MASK]" of a text: a list (one per [MASK]) of
        (token text, probability) pairs, most likely first; for a list of texts, a list of those."""
        return encoder.fill_mask(self, texts, top_k=top_k, batch_size=batch_size)

    def tag(self, texts: str | list[str], *, batch_size: int = 32) -> list:
        """A token classifier's (task bert_tokens) tag of each whitespace-separated word: [(word, tag), ...], read
        at each word's first token; for a list of texts, a list of those."""
        return encoder.tag(self, texts, batch_size=batch_size)

    def embed(self, texts: str | list[str], *, batch_size: int = 32, normalize: bool | None = None,
              prompt: str | None = None, prompt_name: str | None = None, progress: bool | None = None,
              dimensions: int | None = None) -> np.ndarray:
        """Sentence embeddings: float32[D] for a text, [N, D] for a list, as `SentenceTransformer.encode` gives them
        on the same checkpoint (zoo.api.embed): an encoder's last hidden states pooled as its
        1_Pooling/config.json says (mean over the real tokens by default; cls, max, mean_sqrt_len), a decoder's last
        token's; L2-normalised when its modules.json has a Normalize module (`normalize` overrides); texts cut to
        its max_seq_length. `prompt` goes before every text; `prompt_name` takes one of the checkpoint's named
        prompts (config_sentence_transformers.json, e.g. "query"). A progress bar shows for 1,024 texts or more
        (`progress` forces it on or off). `dimensions`: each vector's first components, normalised again when the
        checkpoint normalises (a Matryoshka model's shorter embedding; encode(truncate_dim=...))."""
        from zoo.api import embed
        return embed.embed(self, texts, batch_size=batch_size, normalize=normalize, prompt=prompt,
                           prompt_name=prompt_name, progress=progress, dimensions=dimensions)

    # ---- encoder-decoders ----------------------------------------------------------------------------
    def translate(self, texts: str | list[str], *, beam: int = 4, length_penalty: float | None = None,
                  max_len: int | None = None) -> str | list[str]:
        """An encoder-decoder's output for a text, or each of a list (one batch): greedy with beam=1, else beam
        search ranked as the run says; length_penalty None takes the run's (zoo: 0.6; a converted T5/BART: the
        checkpoint's); max_len caps the output tokens (default: the run's data.seq_len)."""
        return seq2seq.translate(self, texts, beam=beam, length_penalty=length_penalty, max_len=max_len)

    # ---- a training loop of one's own ----------------------------------------------------------------
    def apply(self, params, batch: dict):
        """The model's output on a batch (Pretrained.batch's layout), a pure function of (params, batch): a
        decoder's logits_BTV (float32) of batch["inputs"] (with batch["positions"] and batch["segment_ids"] when
        given: packed rows); a BERT's logits of batch["inputs"], ["segment_ids"], ["valid"] (an MLM's [B, T, V],
        a classifier's [B, C], a tagger's [B, T, C]); an encoder-decoder's logits_BTV of batch["src"],
        ["src_valid"] and ["tgt_in"]."""
        family, variables = self.config.model.family, {"params": params}
        if family == "gpt":
            return self.model.apply(variables, batch["inputs"], positions_BT=batch.get("positions"),
                                    segment_ids_BT=batch.get("segment_ids"))
        if family == "bert":
            return self.model.apply(variables, batch["inputs"], batch["segment_ids"], batch["valid"])
        return self.model.apply(variables, batch["src"], batch["src_valid"], batch["tgt_in"])

    def loss_fn(self, params, batch: dict, rng=None) -> tuple[Any, dict]:
        """(loss, metrics) of the task the model trains on: the mean loss over the batch's weighted targets,
        exactly the trainer's (zoo.tasks: the same function), and {"accuracy", "weight" (the targets counted),
        "tokens", ...}. A pure function of (params, batch, rng): `rng` (a jax PRNG key) turns training mode on
        (dropout, label smoothing as the config says); None evaluates. jax.grad(lambda p: lm.loss_fn(p, b)[0])."""
        import jax
        check_layout(self.config.task, batch)
        train = rng is not None
        loss_sum, aux = self._task().loss(params, batch, rng if train else jax.random.PRNGKey(0), train)
        weight = aux["weight"]
        metrics = {**aux, "loss": loss_sum / weight, "accuracy": aux["correct"] / weight}
        return loss_sum / weight, metrics

    def batch(self, examples: list, *, seq_len: int | None = None, labels: list | None = None,
              pairs: list[str] | None = None, targets: list[str] | None = None, seed: int = 0) -> dict:
        """A batch (numpy arrays) in the layout loss_fn and apply read, from examples: texts, or for any decoder
        conversations (rendered with its chat template, the loss on the assistant's tokens; a dpo or grpo model's
        apply reads it, its loss_fn reads pairs or rollouts); a classifier's `labels` (and `pairs`), a tagger's
        `labels` (a tag per word), an encoder-decoder's `targets`; a masked LM masks from `seed`. Rows are padded
        (or cut) to `seq_len`, default the longest. The layouts: zoo.api.batches."""
        return batches.batch(self, examples, seq_len=seq_len, labels=labels, pairs=pairs, targets=targets, seed=seed)

    def save(self, out_dir: str, format: str = "zoo", *, params=None, verbose: bool = True) -> str:
        """Write the model into a new or empty directory: "zoo" a weights-only zoo run (zoo.load, --init-from and
        every command read it), "hf" a transformers directory (config.json, model.safetensors, tokenizer files),
        "peft" a LoRA run's adapters as a PEFT adapter (adapter_config.json + adapter_model.safetensors),
        "sentence-transformers" a BERT-family encoder as a folder SentenceTransformer(out_dir) loads and encodes
        as .embed does (the transformer, modules.json, 1_Pooling, 2_Normalize when normalised, its
        max_seq_length). `params` (default: self.params) saves other weights of the same model, e.g. those a loop
        of one's own trained. Returns out_dir; prints one `wrote` line unless verbose=False."""
        return save.save(self, out_dir, format, params=params, verbose=verbose)

    def tokenize(self, text: str) -> list[int]:
        """The token ids of `text` (no special tokens added: generate, logprobs and training rows put the
        checkpoint's BOS first where transformers' `tokenizer(text)` does, zoo.data.tokenizers.encode_text)."""
        if not isinstance(text, str):
            raise ArgumentError(f"text={text!r:.80}: give a string")
        return self.tokenizer.encode(decoder.utf8(text, "text"))

    def detokenize(self, ids) -> str:
        """The text of token ids."""
        return self.tokenizer.decode(list(ids))

    def decoding(self, scan: bool = True, fuse: bool = True):
        """(model, params) that generation and scoring run, made on first use and kept; the same outputs as
        (model, params). scan True: the layers as one scan (zoo.infer.sample.scanned: one layer compiled instead of
        L); False: one layer after another (zoo.infer.sample.unscanned: faster decoding steps, longer compiles;
        zoo-serve's engine). On a CPU a decoder's kernels are kept transposed, [out, in], for decoding's few rows,
        with query, key and value one weight unless `fuse` is False (zoo.nn.decode_layout: a copy of the weights,
        the same outputs up to float rounding)."""
        key = ("_decoding_" if scan else "_decoding_looped_") + ("" if fuse else "apart_")
        if key not in self.__dict__:
            from zoo.infer.sample import scanned, unscanned
            from zoo.nn import decode_layout
            model, params = (scanned if scan else unscanned)(self.model, self.params)
            if self.config.model.family == "gpt":  # on a CPU, the kernels as [out, in] (zoo.nn.decode_layout)
                params = decode_layout.transposed(model, params, fuse=fuse)
            self.__dict__[key] = (model, params)
        return self.__dict__[key]

    def _task(self):
        if "_task_" not in self.__dict__:
            from zoo import tasks
            self.__dict__["_task_"] = tasks.build(self.config)
        return self.__dict__["_task_"]

    def with_params(self, params) -> "Pretrained":
        """The same model with other params (e.g. after a loop of one's own), sharing everything else. They must
        be a tree of this model's: the same keys and shapes as `params` (dtypes may differ); else ArgumentError."""
        check_params(self.params, params)
        return dataclasses.replace(self, params=params)


# The batches a decoder task's loss reads that Pretrained.batch (the next-token layout) does not make.
LAYOUTS = {"dpo": ("pairs: inputs [B, 2, T] (chosen, rejected), zoo.tasks.preference.Pairs.rows",
                   lambda b: getattr(b.get("inputs"), "ndim", 0) == 3),
           "grpo": ("rollouts with advantages (zoo.tasks.rl)", lambda b: "advantages" in b)}


def check_layout(task: str, batch) -> None:
    """ArgumentError in one line where a dpo or grpo model's loss_fn is given a batch its loss cannot read."""
    if task in LAYOUTS and isinstance(batch, Mapping) and not LAYOUTS[task][1](batch):
        raise ArgumentError(f"loss_fn of a {task} model reads {LAYOUTS[task][0]}; .batch gives the next-token layout, "
                            f"which apply reads")


def check_params(have, params) -> None:
    """ArgumentError in one line unless `params` has the keys and shapes of `have` (a model's parameter tree)."""
    import jax
    if not isinstance(params, Mapping) or not params:
        raise ArgumentError(f"params={type(params).__name__ if params is not None else None}"
                            f"{'' if params is None else ' ' + repr(params)[:40]}: give this model's parameter tree "
                            f"(a dict of arrays shaped as .params)")

    def shapes(tree) -> dict[str, tuple]:
        return {jax.tree_util.keystr(k): tuple(getattr(x, "shape", ())) for k, x in
                jax.tree_util.tree_flatten_with_path(tree)[0]}
    want, got = shapes(have), shapes(params)
    if got == want:
        return
    missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    shaped = [f"{k} {got[k]} (this model's: {want[k]})" for k in sorted(want.keys() & got.keys()) if got[k] != want[k]]
    said = [f"missing {len(missing)} ({', '.join(missing[:2])}{', ...' if len(missing) > 2 else ''})"] * bool(missing) + \
        [f"{len(extra)} not of this model ({', '.join(extra[:2])}{', ...' if len(extra) > 2 else ''})"] * bool(extra) + \
        [f"other shapes: {', '.join(shaped[:2])}{', ...' if len(shaped) > 2 else ''}"] * bool(shaped)
    raise ArgumentError(f"params are not a tree of this model's ({len(want)} arrays): {'; '.join(said)}")
