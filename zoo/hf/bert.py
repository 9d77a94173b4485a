"""BERT (`BertModel`, `BertForMaskedLM`, `BertForSequenceClassification`, `BertForTokenClassification`,
`BertForPreTraining`, and BERT-architecture checkpoints such as MiniLM) <-> zoo BERT: config and weight mapping.

The Hugging Face head picks the zoo task, and with it the zoo model:

  BertForMaskedLM, BertForPreTraining  -> bert_mlm      (BertMlm; the NSP head is reported unused)
  BertForSequenceClassification       -> bert_cls      (BertClassifier; id2label -> data.label_names)
  BertForTokenClassification          -> bert_tokens   (BertTokenClassifier: `classifier` at every position,
                                                         no pooler; id2label -> data.label_names)
  BertModel (MiniLM, ...)              -> bert_encoder  (BertEncoder: encoder + pooler, fine-tuned
                                                         through init_from into bert_cls / bert_mlm)

Hugging Face keeps every projection as a torch Linear [out, in]; zoo keeps kernels input-major with
heads split out: query/key/value [D, N, H], attention output [N, H, D], MLP [D, F] and [F, D]. The
MLM decoder is tied to the word embedding (a checkpoint's decoder.weight, if saved, must equal it).
Import and export are both derived from `key_table` (see zoo.hf.table). D width, N heads, H head
dim, F MLP width. RoBERTa / XLM-R (zoo.hf.roberta) and DistilBERT (zoo.hf.distilbert) are options of
the same zoo model and share this module's helpers: the variant checks, the embedding and layer rows,
the tied-decoder check, config.json and head fields.
"""

from __future__ import annotations

import json
import os

import numpy as np

from zoo.models.bert import BertConfig
from zoo.errors import ConversionError
from zoo.hf import table
from zoo.hf.io import Keys

ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForSequenceClassification", "BertForTokenClassification",
                 "BertForPreTraining")
TASKS = {"BertModel": "bert_encoder", "BertForMaskedLM": "bert_mlm", "BertForPreTraining": "bert_mlm",
         "BertForSequenceClassification": "bert_cls", "BertForTokenClassification": "bert_tokens"}
EXPORT = {"bert_encoder": "BertModel", "bert_mlm": "BertForMaskedLM", "bert_cls": "BertForSequenceClassification",
          "bert_tokens": "BertForTokenClassification"}
LABELLED = ("bert_cls", "bert_tokens")  # the tasks whose classes have names (id2label, labels.json)
PREFIXES = ("bert.",)
IGNORED = ("position_ids",)  # the position-index buffer older checkpoints save


def task_for(hf: dict, keys: Keys) -> str:
    """The zoo task of a checkpoint: from its architecture, else from the heads its weights hold."""
    for arch in hf.get("architectures") or []:
        if arch in TASKS:
            return TASKS[arch]
    if any(k.startswith("cls.predictions.") for k in keys.tensors):
        return "bert_mlm"
    if "classifier.weight" in keys:  # the sequence classifier has a pooler, the token classifier none
        return "bert_cls" if "pooler.dense.weight" in keys else "bert_tokens"
    return "bert_encoder"


def check_encoder(hf: dict, name: str, act_key: str = "hidden_act") -> None:
    """Refuse what zoo's BERT encoder cannot run (BERT, RoBERTa, DistilBERT say it with the same keys)."""
    act = hf.get(act_key, "gelu")
    if act != "gelu":
        raise ConversionError(f"{name} {act_key}={act!r} is not supported (zoo BERT uses exact erf GELU, \"gelu\")")
    pos = hf.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ConversionError(f"{name} position_embedding_type={pos!r} is not supported (zoo BERT learns absolute "
                              f"positions)")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise ConversionError(f"{name} as a decoder (is_decoder, add_cross_attention) is not supported")
    if hf.get("problem_type") in ("regression", "multi_label_classification"):
        raise ConversionError(f"{name} problem_type={hf['problem_type']!r} is not supported (zoo bert_cls is "
                              f"single-label classification)")


def num_classes(hf: dict) -> int:
    return len(hf.get("id2label") or {}) or hf.get("num_labels") or 2


def config_from_hf(hf: dict, keys: Keys) -> BertConfig:
    check_encoder(hf, "BERT")
    return BertConfig(**encoder_fields(hf), type_vocab_size=hf.get("type_vocab_size", 2))


def encoder_fields(hf: dict) -> dict:
    """BertConfig fields BERT's and RoBERTa's config.json give alike (all but positions and token types)."""
    return dict(vocab_size=hf["vocab_size"], max_len=hf["max_position_embeddings"],
                num_layers=hf["num_hidden_layers"], d_model=hf["hidden_size"], num_heads=hf["num_attention_heads"],
                d_ff=hf["intermediate_size"], dropout=hf.get("hidden_dropout_prob", 0.1),
                ln_eps=hf.get("layer_norm_eps", 1e-12), num_classes=num_classes(hf))


def data_fields(hf: dict, task: str) -> dict:
    """DataConfig fields of the converted run: a classifier's class names, for zoo-classify."""
    names = [str(v) for _, v in sorted((hf.get("id2label") or {}).items(), key=lambda kv: int(kv[0]))]
    if task in LABELLED and names and not any("," in n for n in names):
        return {"label_names": ",".join(names)}
    return {}


def config_to_hf(cfg: BertConfig) -> dict:
    return encoder_to_hf(cfg, "BertModel", "bert", "BERT")


def encoder_to_hf(cfg: BertConfig, architecture: str, model_type: str, name: str) -> dict:
    """config.json of a BERT-like export (BERT, RoBERTa: the same keys)."""
    if cfg.pre_ln:
        raise ConversionError(f"the run uses model.pre_ln=True; Hugging Face {name} is post-LN")
    return {"architectures": [architecture], "model_type": model_type, "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.max_len + cfg.position_offset, "type_vocab_size": cfg.type_vocab_size,
            "num_hidden_layers": cfg.num_layers, "hidden_size": cfg.d_model, "num_attention_heads": cfg.num_heads,
            "intermediate_size": cfg.d_ff, "hidden_act": "gelu", "hidden_dropout_prob": cfg.dropout,
            "attention_probs_dropout_prob": 0.0, "layer_norm_eps": cfg.ln_eps, "position_embedding_type": "absolute",
            "initializer_range": 0.02, "pad_token_id": 0, "tie_word_embeddings": True, "dtype": "float32",
            "num_labels": cfg.num_classes}  # model.num_classes travels with every head (a classifier's: id2label)


def head_config(cfg, run_dir: str, export: dict = EXPORT) -> dict:
    """The architecture (from the run's task: `export`) and, for a classifier, its labels (labels.json,
    else data.label_names)."""
    out = {"architectures": [export[cfg.task]]}
    if cfg.task in LABELLED:
        C = cfg.model.num_classes
        path = os.path.join(run_dir, "labels.json") if run_dir else ""  # (no run: a model loaded in memory)
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
         "bert_tokens": table.linear("token_head/out", "classifier"),
         "bert_encoder": table.linear("cls_head/pooler", "pooler.dense")}
OUTSIDE = ("cls.", "classifier.")  # head keys beside the "bert." wrapper, not under it


def embed_rows(cfg: BertConfig, hf: str = "embeddings.") -> list:
    """The embeddings' rows (token types only where the model has them)."""
    return [("bert/embed/word/embedding", f"{hf}word_embeddings.weight", table.SAME),
            ("bert/embed/position", f"{hf}position_embeddings.weight", table.SAME),
            *([("bert/embed/segment", f"{hf}token_type_embeddings.weight", table.SAME)] if cfg.type_vocab_size else []),
            *table.ln("bert/embed/ln", f"{hf}LayerNorm")]


def key_table(cfg: BertConfig, task: str) -> list:
    """The two-way key table of the task's model (names without the "bert." wrapper): encoder rows,
    then the head the task picks (MLM transform + bias; pooler; pooler + classifier; the token classifier)."""
    return [*embed_rows(cfg), *table.layers(cfg.num_layers, "bert/encoder/layer_{i}", "encoder.layer.{i}.", LAYER),
            *HEADS[task]]


def check_tied(keys: Keys, params: dict, decoder: str, name: str) -> None:
    """An MLM decoder is tied to the word embedding and the head's bias: a saved copy must equal them."""
    for key, tied in ((f"{decoder}.weight", params["bert"]["embed"]["word"]["embedding"]),
                      (f"{decoder}.bias", params["mlm_head"]["bias"])):
        if key in keys and not np.array_equal(keys[key], tied):
            raise ConversionError(f"{key} differs from the weight it is tied to: untied {name} MLM heads are not "
                                  f"supported")


def params_from_hf(keys: Keys, cfg: BertConfig, task: str) -> dict:
    params = table.from_hf(keys, key_table(cfg, task), cfg)
    if task == "bert_mlm":
        check_tied(keys, params, "cls.predictions.decoder", "BERT")
    return params


def task_of(params: dict) -> str:
    """The task a param tree is of, by its heads."""
    if "mlm_head" in params:
        return "bert_mlm"
    if "token_head" in params:
        return "bert_tokens"
    return "bert_cls" if "out" in params["cls_head"] else "bert_encoder"


def params_to_hf(params: dict, cfg: BertConfig) -> dict:
    """The Hugging Face state dict of the model the params are of: BertModel (bare encoder, no
    prefix), BertForMaskedLM, BertForSequenceClassification or BertForTokenClassification (under
    "bert."). The MLM decoder is left out: transformers re-ties it to the word embedding on load."""
    task = task_of(params)
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
    """BERT: position_offset=0, type_vocab_size >= 1, classifier=bert"""
    return model_cfg.position_offset == 0 and model_cfg.type_vocab_size >= 1 and model_cfg.classifier == "bert"
