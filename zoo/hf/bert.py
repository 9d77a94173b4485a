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
"""

from __future__ import annotations

import json
import os

import numpy as np

from zoo.config import BertConfig
from zoo.hf.io import ConversionError, Keys

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


def config_from_hf(hf: dict) -> BertConfig:
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
    """DataConfig fields of the converted run: a classifier's class names, for zoo.classify."""
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
            "initializer_range": 0.02, "pad_token_id": 0, "tie_word_embeddings": True, "dtype": "float32"}


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


def _ln(keys: Keys, name: str) -> dict:
    return {"scale": keys[f"{name}.weight"], "bias": keys[f"{name}.bias"]}


def _dense(keys: Keys, name: str) -> dict:
    return {"kernel": keys[f"{name}.weight"].T, "bias": keys[f"{name}.bias"]}


def _layer(keys: Keys, i: int, cfg: BertConfig) -> dict:
    D, N, H = cfg.d_model, cfg.num_heads, cfg.head_dim
    p = f"encoder.layer.{i}."
    attn = {n: {"kernel": keys[f"{p}attention.self.{n}.weight"].T.reshape(D, N, H),  # [out, in] -> [D, N, H]
                "bias": keys[f"{p}attention.self.{n}.bias"].reshape(N, H)} for n in ("query", "key", "value")}
    attn["out"] = {"kernel": keys[p + "attention.output.dense.weight"].T.reshape(N, H, D),
                   "bias": keys[p + "attention.output.dense.bias"]}
    return {"attn": attn, "attn_ln": _ln(keys, p + "attention.output.LayerNorm"),
            "mlp": {"fc": _dense(keys, p + "intermediate.dense"), "proj": _dense(keys, p + "output.dense")},
            "mlp_ln": _ln(keys, p + "output.LayerNorm")}


def params_from_hf(keys: Keys, cfg: BertConfig, task: str) -> dict:
    bert = {"embed": {"word": {"embedding": keys["embeddings.word_embeddings.weight"]},
                      "position": keys["embeddings.position_embeddings.weight"],
                      "segment": keys["embeddings.token_type_embeddings.weight"],
                      "ln": _ln(keys, "embeddings.LayerNorm")},
            "encoder": {f"layer_{i}": _layer(keys, i, cfg) for i in range(cfg.num_layers)}}
    if task == "bert_mlm":
        p = "cls.predictions."
        head = {"transform": _dense(keys, p + "transform.dense"), "ln": _ln(keys, p + "transform.LayerNorm"),
                "bias": keys[p + "bias"]}
        for name, tied in (("decoder.weight", bert["embed"]["word"]["embedding"]), ("decoder.bias", head["bias"])):
            if p + name in keys and not np.array_equal(keys[p + name], tied):
                raise ConversionError(f"{p}{name} differs from the weight it is tied to: untied BERT MLM heads "
                                      f"are not supported")
        return {"bert": bert, "mlm_head": head}
    head = {"pooler": _dense(keys, "pooler.dense")}
    if task == "bert_cls":
        head["out"] = _dense(keys, "classifier")
    return {"bert": bert, "cls_head": head}


def params_to_hf(params: dict, cfg: BertConfig) -> dict:
    """The Hugging Face state dict of the model the params are of: BertModel (bare encoder, no
    prefix), BertForMaskedLM or BertForSequenceClassification (both under "bert.")."""
    a = lambda x: np.asarray(x, np.float32)
    lin = lambda d: (a(d["kernel"]).T, a(d["bias"]))  # [in, out] -> torch Linear [out, in]
    D = cfg.d_model
    pre = "" if "cls_head" in params and "out" not in params["cls_head"] else "bert."
    e, out = params["bert"]["embed"], {}
    out[pre + "embeddings.word_embeddings.weight"] = a(e["word"]["embedding"])
    out[pre + "embeddings.position_embeddings.weight"] = a(e["position"])
    out[pre + "embeddings.token_type_embeddings.weight"] = a(e["segment"])

    def put(name, pair):
        out[name + ".weight"], out[name + ".bias"] = pair

    put(pre + "embeddings.LayerNorm", (a(e["ln"]["scale"]), a(e["ln"]["bias"])))

    for i in range(cfg.num_layers):
        p, h = f"{pre}encoder.layer.{i}.", params["bert"]["encoder"][f"layer_{i}"]
        for n in ("query", "key", "value"):
            q = h["attn"][n]  # kernel [D, N, H] -> [D, D] -> torch [out, in]
            put(f"{p}attention.self.{n}", (a(q["kernel"]).reshape(D, D).T, a(q["bias"]).reshape(D)))
        put(p + "attention.output.dense", (a(h["attn"]["out"]["kernel"]).reshape(D, D).T, a(h["attn"]["out"]["bias"])))
        put(p + "attention.output.LayerNorm", (a(h["attn_ln"]["scale"]), a(h["attn_ln"]["bias"])))
        put(p + "intermediate.dense", lin(h["mlp"]["fc"]))
        put(p + "output.dense", lin(h["mlp"]["proj"]))
        put(p + "output.LayerNorm", (a(h["mlp_ln"]["scale"]), a(h["mlp_ln"]["bias"])))
    if "mlm_head" in params:
        m = params["mlm_head"]  # the decoder is tied to the word embedding: transformers re-ties it on load
        put("cls.predictions.transform.dense", lin(m["transform"]))
        put("cls.predictions.transform.LayerNorm", (a(m["ln"]["scale"]), a(m["ln"]["bias"])))
        out["cls.predictions.bias"] = a(m["bias"])
    else:
        put(pre + "pooler.dense", lin(params["cls_head"]["pooler"]))
        if "out" in params["cls_head"]:
            put("classifier", lin(params["cls_head"]["out"]))
    return out
