"""RoBERTa and XLM-R (`RobertaModel`, `RobertaForMaskedLM`, `RobertaForSequenceClassification`,
`RobertaForTokenClassification` and their `XLMRoberta*` twins, one architecture) <-> zoo BERT with RoBERTa's
options: config and weight mapping.

RoBERTa is BERT's encoder (zoo.hf.bert, whose layer rows and helpers this module shares) with:
  - positions numbered from pad_token_id + 1 over real tokens only: zoo's `position_offset`, the table
    keeping its max_position_embeddings rows (max_len = max_position_embeddings - offset);
  - usually one token type (type_vocab_size 1: every token gets it);
  - its own heads: `lm_head` (dense -> GELU -> layer_norm -> decoder tied to the word embedding, + bias:
    zoo's MlmHead) and `classifier` (dropout -> dense + tanh -> dropout -> out_proj on <s>: zoo's
    ClsHead with classifier="roberta"; no pooler). The bare RobertaModel keeps BERT's pooler; the token
    classifier is BERT's (dropout -> `classifier` at every position: zoo's token_head).

XLM-R converts the same way and exports as RoBERTa (transformers runs either class on the same
weights alike).
"""

from __future__ import annotations

from zoo.errors import ConversionError
from zoo.hf import bert, table
from zoo.hf.io import Keys
from zoo.models.bert import BertConfig

ARCHITECTURES = ("RobertaModel", "RobertaForMaskedLM", "RobertaForSequenceClassification",
                 "RobertaForTokenClassification", "XLMRobertaModel", "XLMRobertaForMaskedLM",
                 "XLMRobertaForSequenceClassification", "XLMRobertaForTokenClassification")
TASKS = {a: t for a, t in zip(ARCHITECTURES, ("bert_encoder", "bert_mlm", "bert_cls", "bert_tokens") * 2)}
EXPORT = {t: a for a, t in TASKS.items() if not a.startswith("XLM")}  # XLM-R exports as RoBERTa
PREFIXES = ("roberta.",)
IGNORED = bert.IGNORED
data_fields, seq2seq_framing = bert.data_fields, bert.seq2seq_framing

HEADS = {"bert_mlm": [*table.linear("mlm_head/transform", "lm_head.dense"), *table.ln("mlm_head/ln", "lm_head.layer_norm"),
                      ("mlm_head/bias", "lm_head.bias", table.SAME)],
         "bert_cls": [*table.linear("cls_head/pooler", "classifier.dense"),
                      *table.linear("cls_head/out", "classifier.out_proj")],
         "bert_tokens": table.linear("token_head/out", "classifier"),
         "bert_encoder": table.linear("cls_head/pooler", "pooler.dense")}
OUTSIDE = ("lm_head.", "classifier.")  # head keys beside the "roberta." wrapper


def task_for(hf: dict, keys: Keys) -> str:
    """The zoo task of a checkpoint: from its architecture, else from the heads its weights hold."""
    for arch in hf.get("architectures") or []:
        if arch in TASKS:
            return TASKS[arch]
    if any(k.startswith("lm_head.") for k in keys.tensors):
        return "bert_mlm"
    if "classifier.out_proj.weight" in keys:
        return "bert_cls"
    return "bert_tokens" if "classifier.weight" in keys else "bert_encoder"


def config_from_hf(hf: dict, keys: Keys) -> BertConfig:
    bert.check_encoder(hf, "RoBERTa")
    pad = hf.get("pad_token_id", 1)
    if not isinstance(pad, int) or pad < 0 or hf["max_position_embeddings"] <= pad + 1:
        raise ConversionError(f"RoBERTa pad_token_id={pad!r} is not supported: positions start at pad_token_id + 1, "
                              f"inside max_position_embeddings={hf['max_position_embeddings']}")
    return BertConfig(**{**bert.encoder_fields(hf), "max_len": hf["max_position_embeddings"] - pad - 1},
                      position_offset=pad + 1, type_vocab_size=hf.get("type_vocab_size", 2), classifier="roberta")


def config_to_hf(cfg: BertConfig) -> dict:
    # The position offset is pad_token_id + 1 in transformers: the pad id follows from it.
    return {**bert.encoder_to_hf(cfg, "RobertaModel", "roberta", "RoBERTa"), "pad_token_id": cfg.position_offset - 1,
            "bos_token_id": 0, "eos_token_id": 2}


def head_config(cfg, run_dir: str) -> dict:
    return bert.head_config(cfg, run_dir, EXPORT)


def run_fields(cfg) -> dict:
    """None: the pad id is the position offset's (config_to_hf), whatever the run's tokenizer pads with."""
    return {}


def key_table(cfg: BertConfig, task: str) -> list:
    """The two-way key table of the task's model (names without the "roberta." wrapper): BERT's encoder
    rows, then RoBERTa's head for the task."""
    return [*bert.embed_rows(cfg), *table.layers(cfg.num_layers, "bert/encoder/layer_{i}", "encoder.layer.{i}.",
                                                 bert.LAYER), *HEADS[task]]


def params_from_hf(keys: Keys, cfg: BertConfig, task: str) -> dict:
    params = table.from_hf(keys, key_table(cfg, task), cfg)
    if task == "bert_mlm":
        bert.check_tied(keys, params, "lm_head.decoder", "RoBERTa")
    return params


def params_to_hf(params: dict, cfg: BertConfig) -> dict:
    """The state dict of RobertaModel (no prefix), RobertaForMaskedLM, RobertaForSequenceClassification or
    RobertaForTokenClassification (under "roberta."); the tied decoder is left out (transformers re-ties it on load)."""
    task = bert.task_of(params)
    return table.to_hf(params, key_table(cfg, task), cfg, prefix="" if task == "bert_encoder" else "roberta.",
                       outside=OUTSIDE)


def exports(model_cfg) -> bool:
    """RoBERTa: position_offset > 0, type_vocab_size >= 1, classifier=roberta"""
    return model_cfg.position_offset > 0 and model_cfg.type_vocab_size >= 1 and model_cfg.classifier == "roberta"
