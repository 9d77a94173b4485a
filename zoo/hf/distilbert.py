"""DistilBERT (`DistilBertForMaskedLM`, `DistilBertForSequenceClassification`, `DistilBertForTokenClassification`)
<-> zoo BERT with
DistilBERT's options: config and weight mapping.

DistilBERT is BERT's post-LN encoder with no token types (zoo's type_vocab_size=0), its LayerNorms at
epsilon 1e-12, and its own key names: attention q_lin / k_lin / v_lin / out_lin, sa_layer_norm,
ffn.lin1 / lin2, output_layer_norm under transformer.layer.{i}. Its heads:

  DistilBertForMaskedLM               -> bert_mlm (vocab_transform -> GELU -> vocab_layer_norm ->
                                         vocab_projector tied to the word embedding, + its bias)
  DistilBertForSequenceClassification -> bert_cls (pre_classifier + ReLU -> dropout -> classifier on
                                         the first token: zoo's ClsHead with classifier="distilbert")
  DistilBertForTokenClassification    -> bert_tokens (dropout -> classifier at every position: token_head)

The bare DistilBertModel has no pooler, which zoo's bert_encoder keeps: it is not served.
"""

from __future__ import annotations

from zoo.errors import ConversionError
from zoo.hf import bert, table
from zoo.hf.io import Keys
from zoo.models.bert import BertConfig

ARCHITECTURES = ("DistilBertForMaskedLM", "DistilBertForSequenceClassification", "DistilBertForTokenClassification")
TASKS = {"DistilBertForMaskedLM": "bert_mlm", "DistilBertForSequenceClassification": "bert_cls",
         "DistilBertForTokenClassification": "bert_tokens"}
EXPORT = {t: a for a, t in TASKS.items()}
PREFIXES = ("distilbert.",)
IGNORED = bert.IGNORED
LN_EPS = 1e-12  # transformers hard-codes every DistilBERT LayerNorm's epsilon
data_fields, seq2seq_framing, run_fields = bert.data_fields, bert.seq2seq_framing, bert.run_fields

ATTN = ("attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin")
LAYER = [*table.attention("attn", "", ATTN, bias=True), *table.ln("attn_ln", "sa_layer_norm"),
         *table.linear("mlp/fc", "ffn.lin1"), *table.linear("mlp/proj", "ffn.lin2"),
         *table.ln("mlp_ln", "output_layer_norm")]
HEADS = {"bert_mlm": [*table.linear("mlm_head/transform", "vocab_transform"),
                      *table.ln("mlm_head/ln", "vocab_layer_norm"), ("mlm_head/bias", "vocab_projector.bias", table.SAME)],
         "bert_cls": [*table.linear("cls_head/pooler", "pre_classifier"), *table.linear("cls_head/out", "classifier")],
         "bert_tokens": table.linear("token_head/out", "classifier")}
OUTSIDE = ("vocab_", "pre_classifier.", "classifier.")  # head keys beside the "distilbert." wrapper


def task_for(hf: dict, keys: Keys) -> str:
    """The zoo task of a checkpoint: from its architecture, else from the head its weights hold."""
    for arch in hf.get("architectures") or []:
        if arch in TASKS:
            return TASKS[arch]
    if "vocab_transform.weight" in keys:
        return "bert_mlm"
    if "pre_classifier.weight" in keys:
        return "bert_cls"
    if "classifier.weight" in keys:
        return "bert_tokens"
    raise ConversionError(f"a DistilBERT checkpoint without an MLM or classification head (DistilBertModel) is not "
                          f"supported; supported: {', '.join(ARCHITECTURES)}")


def config_from_hf(hf: dict, keys: Keys) -> BertConfig:
    bert.check_encoder(hf, "DistilBERT", act_key="activation")
    if hf.get("sinusoidal_pos_embds"):
        raise ConversionError("DistilBERT sinusoidal_pos_embds=true is not supported (zoo BERT learns absolute "
                              "positions)")
    return BertConfig(vocab_size=hf["vocab_size"], max_len=hf["max_position_embeddings"], type_vocab_size=0,
                      num_layers=hf["n_layers"], d_model=hf["dim"], num_heads=hf["n_heads"], d_ff=hf["hidden_dim"],
                      dropout=hf.get("dropout", 0.1), ln_eps=LN_EPS, classifier="distilbert",
                      num_classes=bert.num_classes(hf))


def config_to_hf(cfg: BertConfig) -> dict:
    if cfg.pre_ln or cfg.ln_eps != LN_EPS:
        raise ConversionError(f"the run uses model.pre_ln={cfg.pre_ln}, model.ln_eps={cfg.ln_eps}; Hugging Face "
                              f"DistilBERT is post-LN at ln_eps={LN_EPS}")
    return {"architectures": ["DistilBertForMaskedLM"], "model_type": "distilbert", "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.max_len, "sinusoidal_pos_embds": False, "n_layers": cfg.num_layers,
            "dim": cfg.d_model, "n_heads": cfg.num_heads, "hidden_dim": cfg.d_ff, "dropout": cfg.dropout,
            "attention_dropout": 0.0, "activation": "gelu", "initializer_range": 0.02, "pad_token_id": 0,
            "tie_word_embeddings": True, "dtype": "float32", "num_labels": cfg.num_classes}


def head_config(cfg, run_dir: str) -> dict:
    if cfg.task not in EXPORT:
        raise ConversionError(f"task={cfg.task} has no DistilBERT equivalent (DistilBertModel has no pooler); "
                              f"DistilBERT exports {', '.join(EXPORT)}")
    return bert.head_config(cfg, run_dir, EXPORT)


def key_table(cfg: BertConfig, task: str) -> list:
    """The two-way key table of the task's model (names without the "distilbert." wrapper)."""
    return [*bert.embed_rows(cfg), *table.layers(cfg.num_layers, "bert/encoder/layer_{i}", "transformer.layer.{i}.",
                                                 LAYER), *HEADS[task]]


def params_from_hf(keys: Keys, cfg: BertConfig, task: str) -> dict:
    params = table.from_hf(keys, key_table(cfg, task), cfg)
    if task == "bert_mlm":
        bert.check_tied(keys, params, "vocab_projector", "DistilBERT")
    return params


def params_to_hf(params: dict, cfg: BertConfig) -> dict:
    """The state dict of DistilBertForMaskedLM, DistilBertForSequenceClassification or
    DistilBertForTokenClassification (under "distilbert."); the tied vocab_projector.weight is left out
    (transformers re-ties it on load)."""
    return table.to_hf(params, key_table(cfg, bert.task_of(params)), cfg, prefix="distilbert.", outside=OUTSIDE)


def exports(model_cfg) -> bool:
    """DistilBERT: type_vocab_size=0, position_offset=0, classifier=distilbert"""
    return model_cfg.type_vocab_size == 0 and model_cfg.position_offset == 0 and model_cfg.classifier == "distilbert"
