"""Pretrained.batch: examples -> one batch in the layout the model's task trains on (its `loss` reads it), as
numpy arrays, for a training loop of one's own (`jax.grad(lm.loss_fn)`). One function per task; each uses the
task's own framing.

    decoders      texts, or conversations (lists of {"role", "content"}: rendered with the chat template, the
    (every task)  loss on the assistant's tokens): each one row, [BOS or end-of-text] + its tokens (+ end-of-text
                  for a text), right-padded; inputs_BT, targets_BT (the next ids), weights_BT (1 on trained
                  targets, 0 on padding), positions_BT, segment_ids_BT (1 on real tokens, 0 on padding). The
                  layout of gpt_lm and sft, whose loss_fn reads it; a dpo or grpo checkpoint's apply reads it too,
                  its loss_fn reads pairs or rollouts (zoo.tasks.preference.Pairs.rows, zoo.tasks.rl)
    bert_mlm      texts framed [CLS] text [SEP]; 15% of the tokens chosen (80/10/10) from `seed`; inputs_BT,
                  targets_BT, weights_BT (1 at chosen positions), positions_BK, segment_ids_BT, valid_BT
    bert_cls      texts (and `pairs`) with `labels` (class ids or names); inputs_BT, segment_ids_BT, valid_BT,
                  labels_B, weights_B
    bert_tokens   texts split on whitespace into words, `labels` one tag (id or name) per word; inputs_BT,
                  segment_ids_BT, valid_BT, labels_BT (tags on each word's first token), weights_B
    seq2seq       sources (texts) and `targets`; src_BS, src_valid_BS, tgt_in_BT, tgt_out_BT, weights_BT

The keys are those names without their shape suffix ("inputs", "targets", ...). Rows longer than `seq_len`
(default: the longest example, within the model's positions) are cut at its end.
"""

from __future__ import annotations

import numpy as np

from zoo.errors import ArgumentError, FamilyError


def batch(lm, examples, *, seq_len: int | None = None, labels=None, pairs=None, targets=None, seed: int = 0) -> dict:
    """See Pretrained.batch and the module's docstring."""
    if not isinstance(examples, (list, tuple)) or not examples:
        raise ArgumentError(f"examples: give a non-empty list (texts, or conversations for a decoder); got "
                            f"{type(examples).__name__}")
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2):
        raise ArgumentError(f"seq_len={seq_len!r} must be a whole number >= 2")
    task = lm.config.task
    if lm.config.model.family == "gpt":  # any decoder, whatever it trained on (a DPO run's, a GGUF file's)
        return lm_batch(lm, examples, seq_len)
    texts = _texts(examples)
    if task == "bert_mlm":
        return mlm_batch(lm, texts, seq_len, seed)
    if task == "bert_cls":
        return cls_batch(lm, texts, pairs, _labels(lm, labels, len(texts)), seq_len)
    if task == "bert_tokens":
        return tokens_batch(lm, texts, labels, seq_len)
    if task == "seq2seq":
        return seq2seq_batch(lm, texts, targets, seq_len)
    raise FamilyError(f".batch has no layout for task {task} (a bare encoder has no objective: load it as a "
                      f"classifier or masked LM)")


def _texts(examples) -> list[str]:
    if not all(isinstance(t, str) for t in examples):
        raise ArgumentError("examples: this task's examples are texts (strings)")
    return list(examples)


def _length(longest: int, seq_len, max_len: int) -> int:
    """The padded length: seq_len if given, else the longest row rounded up to a multiple of 8; within max_len."""
    want = seq_len if seq_len is not None else -(-longest // 8) * 8
    return min(want, max_len)


def lm_batch(lm, examples, seq_len) -> dict:
    from zoo.data import chat
    from zoo.eval.loglik import prefix_token
    tok, d = lm.tokenizer, lm.config.data
    rows = []
    for i, ex in enumerate(examples):
        if isinstance(ex, str):
            ids = [prefix_token(tok), *tok.encode(ex), tok.eot_token]
            mask = [True] * len(ids)
        elif isinstance(ex, (list, tuple)):
            chat.check_messages(ex, f"example {i}")
            ids, mask = chat.encode_conversation(tok, chat.template_for(d.tokenizer, lm.run_dir), list(ex),
                                                 chat.specials(tok, d.tokenizer))
        else:
            raise ArgumentError(f"example {i} is {type(ex).__name__}; give a text or a conversation (a list of "
                                f"{{'role', 'content'}} dicts)")
        rows.append((ids, mask))
    T = _length(max(len(ids) for ids, _ in rows) - 1, seq_len, lm.config.window)
    out = {k: np.zeros((len(rows), T), np.int32) for k in ("inputs", "targets", "positions", "segment_ids")}
    out["weights"] = np.zeros((len(rows), T), np.float32)
    for b, (ids, mask) in enumerate(rows):
        ids, mask = ids[:T + 1], mask[:T + 1]
        n = len(ids) - 1
        out["inputs"][b, :n], out["targets"][b, :n] = ids[:-1], ids[1:]
        out["weights"][b, :n] = np.asarray(mask[1:], np.float32)
        out["positions"][b, :n], out["segment_ids"][b, :n] = np.arange(n), 1
    return out


def mlm_batch(lm, texts: list[str], seq_len, seed: int) -> dict:
    from zoo.tasks import mlm
    sp = mlm.bert_specials(lm.tokenizer)
    enc = lm.tokenizer.encode_batch(texts)
    T = _length(max(map(len, enc)) + 2, seq_len, lm.model.cfg.max_len)
    ids_BT = np.full((len(texts), T), sp.pad, np.int64)
    valid_BT = np.zeros((len(texts), T), bool)
    for b, ids in enumerate(enc):
        row = [sp.cls, *ids[:T - 2], sp.sep]
        ids_BT[b, :len(row)], valid_BT[b, :len(row)] = row, True
    mlm.check_ids(ids_BT, lm.model.cfg.vocab_size, lm.tokenizer, "examples")
    masked = mlm.mask_tokens(np.random.default_rng([seed, 1]), ids_BT, sp)
    return {**masked, "positions": mlm.chosen_positions(masked["weights"], mlm.max_predictions(T)),
            "segment_ids": np.zeros((len(texts), T), np.int32), "valid": valid_BT}


def _labels(lm, labels, n: int) -> np.ndarray:
    from zoo.api.encoder import class_names
    if labels is None or len(labels) != n:
        raise ArgumentError(f"labels: give one label (a class id or name) per text ({n})")
    names = class_names(lm)
    out = []
    for i, y in enumerate(labels):
        if isinstance(y, str) and y in names:
            out.append(names.index(y))
        elif isinstance(y, (int, np.integer)) and not isinstance(y, bool) and 0 <= y < lm.config.model.num_classes:
            out.append(int(y))
        else:
            raise ArgumentError(f"labels[{i}]={y!r} is not a class of this model: {', '.join(names)} (or 0.."
                                f"{lm.config.model.num_classes - 1})")
    return np.asarray(out, np.int64)


def cls_batch(lm, texts, pairs, labels, seq_len) -> dict:
    from zoo.tasks import classify
    from zoo.tasks.mlm import bert_specials, check_ids
    if pairs is not None and len(pairs) != len(texts):
        raise ArgumentError(f"pairs: {len(pairs)} given for {len(texts)} texts; give one per text")
    sp = bert_specials(lm.tokenizer)
    enc = lm.tokenizer.encode_batch(texts)
    extra = 0 if pairs is None else max(map(len, lm.tokenizer.encode_batch(list(pairs))))
    T = _length(max(map(len, enc)) + sp.n_framing(pairs is not None) + extra, seq_len, lm.model.cfg.max_len)
    ex, _ = classify.encode(lm.tokenizer, sp, texts, pairs, labels, T)
    check_ids(ex.ids, lm.model.cfg.vocab_size, lm.tokenizer, "examples")
    return ex.rows(np.arange(len(texts)))


def tokens_batch(lm, texts, labels, seq_len) -> dict:
    from zoo.api.encoder import class_names
    from zoo.tasks import token_classify
    from zoo.tasks.mlm import bert_specials, check_ids
    words = [t.split() for t in texts]
    names = class_names(lm)
    if labels is None or len(labels) != len(words) or any(len(t) != len(w) for t, w in zip(labels, words)):
        raise ArgumentError("labels: give one list of tags per text, one tag (an id or name) per whitespace word")
    tags = [np.asarray([names.index(t) if isinstance(t, str) and t in names else t for t in row]) for row in labels]
    bad = [t for row in tags for t in row if not isinstance(t, (int, np.integer)) or not 0 <= t < len(names)]
    if bad:
        raise ArgumentError(f"labels: tag {bad[0]!r} is not one of this model's: {', '.join(names)}")
    T = _length(max(len(w) for w in words) * 4 + 2, seq_len, lm.model.cfg.max_len)
    ex, _ = token_classify.encode(lm.tokenizer, bert_specials(lm.tokenizer), words, tags, T)
    check_ids(ex.ids, lm.model.cfg.vocab_size, lm.tokenizer, "examples")
    return ex.rows(np.arange(len(words)))


def seq2seq_batch(lm, sources, targets, seq_len) -> dict:
    from zoo.tasks.seq2seq_data import check_framing, encode_pairs, make_batch
    if targets is None or len(targets) != len(sources) or not all(isinstance(t, str) for t in targets):
        raise ArgumentError(f"targets: give one target text per source ({len(sources)})")
    sp = check_framing(lm.config.model, lm.tokenizer)
    T = seq_len or lm.config.data.seq_len
    pairs, _, _ = encode_pairs(lm.tokenizer, sp, list(sources), list(targets), T)
    return make_batch(pairs, np.arange(len(sources)), slice(None), sp, T)
