"""BERT (`BertModel`, `BertForMaskedLM`, `BertForSequenceClassification`, `BertForPreTraining`, and
BERT-architecture checkpoints such as MiniLM) <-> zoo BERT: config and weight mapping.

The Hugging Face head picks the zoo task, and with it the zoo model:

  BertForMaskedLM, BertForPreTraining  -> bert_mlm      (BertMlm; the NSP head is reported unused)
  BertForSequenceClassification       -> bert_cls      (BertClassifier; id2label -> data.label_names)
  BertModel (MiniLM, ...)              -> bert_encoder  (BertEncoder: encoder + pooler, fine-tuned
                                                         through init_from into bert_cls / bert_mlm)

Hugging Face keeps every projection as a torch Linear [out, in]; zoo keeps kernels input-major with
heads split out: query/key/value [D, N, H], attention output [N, H, D], MLP [D, F] and [F, D]. The
MLM decoder is tied to the word embedding (a checkpoint's decoder.weight, if saved, must equal it).
Import and export are both derived from `key_table` (see zoo.hf.table). D width, N heads, H head
dim, F MLP width.
"""

from __future__ import annotations

import json
import os

import numpy as np

from zoo.models.bert import BertConfig
from zoo.errors import ConversionError
from zoo.hf import table
from zoo.hf.io import Keys

ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForSequenceClassification", "BertForPreTraining")
TASKS = {"BertModel": "bert_encoder", "BertForMaskedLM": "bert_mlm", "BertForPreTraining": "bert_mlm",
         "BertForSequenceClassification": "bert_cls"}
EXPORT = {"bert_encoder": "BertModel", "bert_mlm": "BertForMaskedLM", "bert_cls": "BertForSequenceClassification"}
PREFIXES = ("bert.",)
IGNORED = ("position_ids",)  # the position-index buffer older checkpoints save


def task_for(hf: dict, keys: Keys) -> str:
    """The zoo task of a checkpoint: from its architecture, else from the heads its weights hold."""
    for arch in hf.get("architectures") or []:
        if arch in TASKS:
            return TASKS[arch]
    if any(k.startswith("cls.predictions.") for k in keys.tensors):
        return "bert_mlm"
    return "bert_cls" if "classifier.weight" in keys else "bert_encoder"


def config_from_hf(hf: dict, keys: Keys) -> BertConfig:
    act = hf.get("hidden_act", "gelu")
    if act != "gelu":
        raise ConversionError(f"BERT hidden_act={act!r} is not supported (zoo BERT uses exact erf GELU, \"gelu\")")
    pos = hf.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ConversionError(f"BERT position_embedding_type={pos!r} is not supported (zoo BERT learns absolute "
                              f"positions)")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise ConversionError("BERT as a decoder (is_decoder, add_cross_attention) is not supported")
    if hf.get("problem_type") in ("regression", "multi_label_classification"):
        raise ConversionError(f"BERT problem_type={hf['problem_type']!r} is not supported (zoo bert_cls is "
                              f"single-label classification)")
    num_classes = len(hf.get("id2label") or {}) or hf.get("num_labels") or 2
    return BertConfig(vocab_size=hf["vocab_size"], max_len=hf["max_position_embeddings"],
                      type_vocab_size=hf.get("type_vocab_size", 2), num_layers=hf["num_hidden_layers"],
                      d_model=hf["hidden_size"], num_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
                      dropout=hf.get("hidden_dropout_prob", 0.1), ln_eps=hf.get("layer_norm_eps", 1e-12),
                      num_classes=num_classes)


def data_fields(hf: dict, task: str) -> dict:
    """DataConfig fields of the converted run: a classifier's class names, for zoo-classify."""
    names = [str(v) for _, v in sorted((hf.get("id2label") or {}).items(), key=lambda kv: int(kv[0]))]
    if task == "bert_cls" and names and not any("," in n for n in names):
        return {"label_names": ",".join(names)}
    return {}


def config_to_hf(cfg: BertConfig) -> dict:
    if cfg.pre_ln:
        raise ConversionError("the run uses model.pre_ln=True; Hugging Face BERT is post-LN")
    return {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.max_len, "type_vocab_size": cfg.type_vocab_size,
            "num_hidden_layers": cfg.num_layers, "hidden_size": cfg.d_model, "num_attention_heads": cfg.num_heads,
            "intermediate_size": cfg.d_ff, "hidden_act": "gelu", "hidden_dropout_prob": cfg.dropout,
            "attention_probs_dropout_prob": 0.0, "layer_norm_eps": cfg.ln_eps, "position_embedding_type": "absolute",
            "initializer_range": 0.02, "pad_token_id": 0, "tie_word_embeddings": True, "dtype": "float32",
            "num_labels": cfg.num_classes}  # model.num_classes travels with every head (a classifier's: id2label)


def head_config(cfg, run_dir: str) -> dict:
    """The architecture (from the run's task) and, for a classifier, its labels (labels.json, else data.label_names)."""
    out = {"architectures": [EXPORT[cfg.task]]}
    if cfg.task == "bert_cls":
        C = cfg.model.num_classes
        path = os.path.join(run_dir, "labels.json")
        if os.path.isfile(path):
            with open(path) as f:
                names = json.load(f)
        else:
            names = [n.strip() for n in cfg.data.label_names.split(",")] if cfg.data.label_names else []
        names = (names + [f"LABEL_{i}" for i in range(len(names), C)])[:C]
        out.update(id2label={str(i): n for i, n in enumerate(names)}, label2id={n: i for i, n in enumerate(names)})
    return out


ATTN = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense")
LAYER = [*table.attention("attn", "", ATTN, bias=True), *table.ln("attn_ln", "attention.output.LayerNorm"),
         *table.linear("mlp/fc", "intermediate.dense"), *table.linear("mlp/proj", "output.dense"),
         *table.ln("mlp_ln", "output.LayerNorm")]
HEADS = {"bert_mlm": [*table.linear("mlm_head/transform", "cls.predictions.transform.dense"),
                      *table.ln("mlm_head/ln", "cls.predictions.transform.LayerNorm"),
                      ("mlm_head/bias", "cls.predictions.bias", table.SAME)],
         "bert_cls": [*table.linear("cls_head/pooler", "pooler.dense"), *table.linear("cls_head/out", "classifier")],
         "bert_encoder": table.linear("cls_head/pooler", "pooler.dense")}
OUTSIDE = ("cls.", "classifier.")  # head keys beside the "bert." wrapper, not under it


def key_table(cfg: BertConfig, task: str) -> list:
    """The two-way key table of the task's model (names without the "bert." wrapper): encoder rows,
    then the head the task picks (MLM transform + bias; pooler; pooler + classifier)."""
    return [("bert/embed/word/embedding", "embeddings.word_embeddings.weight", table.SAME),
            ("bert/embed/position", "embeddings.position_embeddings.weight", table.SAME),
            ("bert/embed/segment", "embeddings.token_type_embeddings.weight", table.SAME),
            *table.ln("bert/embed/ln", "embeddings.LayerNorm"),
            *table.layers(cfg.num_layers, "bert/encoder/layer_{i}", "encoder.layer.{i}.", LAYER), *HEADS[task]]


def params_from_hf(keys: Keys, cfg: BertConfig, task: str) -> dict:
    params = table.from_hf(keys, key_table(cfg, task), cfg)
    if task == "bert_mlm":  # explicit: the decoder is tied (a saved copy must equal what it is tied to)
        p, head = "cls.predictions.", params["mlm_head"]
        for name, tied in (("decoder.weight", params["bert"]["embed"]["word"]["embedding"]),
                           ("decoder.bias", head["bias"])):
            if p + name in keys and not np.array_equal(keys[p + name], tied):
                raise ConversionError(f"{p}{name} differs from the weight it is tied to: untied BERT MLM heads "
                                      f"are not supported")
    return params


def _task_of(params: dict) -> str:
    if "mlm_head" in params:
        return "bert_mlm"
    return "bert_cls" if "out" in params["cls_head"] else "bert_encoder"


def params_to_hf(params: dict, cfg: BertConfig) -> dict:
    """The Hugging Face state dict of the model the params are of: BertModel (bare encoder, no
    prefix), BertForMaskedLM or BertForSequenceClassification (both under "bert."). The MLM decoder
    is left out: transformers re-ties it to the word embedding on load."""
    task = _task_of(params)
    return table.to_hf(params, key_table(cfg, task), cfg, prefix="" if task == "bert_encoder" else "bert.",
                       outside=OUTSIDE)


def seq2seq_framing(hf: dict, gen: dict) -> None:
    return None


def run_fields(cfg) -> dict:
    """pad_token_id: the run's [PAD] (zoo.tasks.mlm: the vocabulary's own, else after it), when the
    model holds it (a converted checkpoint without tokenizer files keeps config_to_hf's 0)."""
    from zoo.data.tokenizers import get_tokenizer
    from zoo.tasks.mlm import bert_specials
    pad = int(bert_specials(get_tokenizer(cfg.data.tokenizer)).pad)
    return {"pad_token_id": pad} if pad < cfg.model.vocab_size else {}


def exports(model_cfg) -> bool:
    """BERT: every zoo BERT"""
    return True
