"""The Hugging Face architectures zoo converts, one row each, for the parity steps every one of them takes
(tests/hf/test_parity_decoders.py): a small random transformers model built from the row's config, saved,
converted by zoo, then its logits, greedy continuation and export compared with transformers'. Adding an
architecture is one row here; what only one architecture has (its refusals, its fused layouts, its presets) stays
in its own file beside (tests/hf/test_llama.py, ...), reading the same built references
(tests/helpers/hf_runs.References).

The sizes are chosen to catch a wrong conversion: initializer_range 0.2 (attention far from uniform, so a rope,
window or norm applied wrongly moves the logits by 1e-3 to 5, well past the 1e-4 allowed; zoo matches to ~5e-6);
head widths apart from hidden / heads where the architecture allows it; windows shorter than the prompts.
"""

import dataclasses

V = 300  # the decoders' vocabulary (the Llama test tokenizer's: 256 bytes, 2 specials, 42 merges)


@dataclasses.dataclass(frozen=True)
class Row:
    """One architecture's small reference and what its conversion must give."""
    config: str  # the transformers config class
    model: str  # the transformers model class (its architectures[0])
    kwargs: dict  # the config's fields
    converts_to: dict  # zoo model-config fields the conversion must set
    perturb: tuple = ()  # weights moved off their init (+ scale N(0, 1)): "all", "norm", "bias"; "router": N(0, 0.2)
    scale: float = 0.3
    shapes: dict = dataclasses.field(default_factory=dict)  # "h_0/attn/query/kernel" -> the zoo param's shape
    length: int = 12  # tokens per row of the two compared rows
    prompt: tuple = (5, 17, 42, 8)  # the greedy prompt
    new_tokens: int = 8
    pad_id: int = 1  # transformers' generate(pad_token_id=)
    logit_cap: float = 0.0  # a final soft-cap that must bite: some logit within 10% of it
    exports_as: str = ""  # the architecture to-hf writes, when not `model`
    export_json: dict = dataclasses.field(default_factory=dict)  # fields the exported config.json must hold
    tokenizer: str = ""  # "llama3": a Llama 3-style tokenizer.json and chat template saved beside the weights
    seed: int = 0
    # encoders: the zoo task, the padded rows' token types ("random", "split": 1 from position 6) and a
    # left-padded row, the top-level params, and the exported config.json's fields
    task: str = ""
    segments: str = ""
    left_pad: bool = False
    param_keys: tuple = ()
    absent: tuple = ()  # param paths the conversion must not make
    # encoder-decoders: weights redrawn before the perturbation (name, std: a head of its own) and set after it
    # (name, "mul" | "normal", value); how sources are framed ("t5": text then pad 0; "bart": <s> text </s> then
    # pad 1) and the decoder's start id
    redraw: tuple = ()
    then: tuple = ()
    frame: str = ""
    start_id: int = 0


# ---- decoders -------------------------------------------------------------------------------------------
LLAMA = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1, initializer_range=0.2,
             attn_implementation="eager")
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # head dim 8: every band is hit
# N * H = 72 != D = 40: every projection and reshape sees the head width, not D / N (13, odd).
QWEN3 = dict(vocab_size=V, hidden_size=40, intermediate_size=56, num_hidden_layers=2, num_attention_heads=3,
             head_dim=24, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1,
             initializer_range=0.2, attn_implementation="eager")
# 5 query heads of width 8 over width 40, MLP width 56.
PHI3 = dict(vocab_size=V, hidden_size=40, intermediate_size=56, num_hidden_layers=2, num_attention_heads=5,
            max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=1, initializer_range=0.2,
            attn_implementation="eager")
# N * H = 60 != D = 42; a 4-token window, so local and global layers differ; soft-caps that bite.
GEMMA = dict(vocab_size=V, hidden_size=42, intermediate_size=56, num_hidden_layers=3, num_attention_heads=3,
             num_key_value_heads=1, head_dim=20, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=0,
             eos_token_id=1, pad_token_id=0, initializer_range=0.2, attn_implementation="eager")
GEMMA_LOCAL = dict(sliding_window=4, query_pre_attn_scalar=18, attn_logit_softcapping=5.0, final_logit_softcapping=3.0)
# 3 heads of width 16 (rope on 4 or 8 of them), MLP width 100.
NEOX = dict(vocab_size=V, hidden_size=48, intermediate_size=100, num_hidden_layers=2, num_attention_heads=3,
            max_position_embeddings=64, bos_token_id=0, eos_token_id=1, initializer_range=0.2,
            attn_implementation="eager")
# routing far from uniform, so a wrong top-k, renormalisation or expert order shows
MOE = dict(vocab_size=V, hidden_size=40, num_hidden_layers=2, num_experts_per_tok=2, max_position_embeddings=64,
           rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1, initializer_range=0.2, router_aux_loss_coef=0.02,
           attn_implementation="eager")
PHI3_PROMPT = (5, 17, 42, 8, 99, 3, 250)  # 7 + 8 tokens: the prompt alone is past the window of 5
GEMMA_PROMPT = (5, 17, 42, 8, 99, 3)  # 6 + 8 tokens: past the window of 4
MOE_SHAPES = {"h_1/mlp/router": (40, 4), "h_1/mlp/gate": (4, 40, 28), "h_1/mlp/proj": (4, 28, 40)}

DECODERS = {
    "gpt2": Row("GPT2Config", "GPT2LMHeadModel",
                dict(n_layer=2, n_embd=64, n_head=4, vocab_size=99, n_positions=32, bos_token_id=98, eos_token_id=98),
                dict(positions="learned", norm="layernorm", tie_embeddings=True), length=16, new_tokens=20,
                pad_id=98),
    # Llama, Qwen2 and Mistral (a 4-token window: 4 + 8 tokens run past it)
    "llama": Row("LlamaConfig", "LlamaForCausalLM", dict(LLAMA, num_key_value_heads=2),
                 dict(num_kv_heads=2, tie_embeddings=False, qkv_bias=False, out_bias=False, rope_scaling="none"),
                 tokenizer="llama3"),
    "llama3_bias": Row("LlamaConfig", "LlamaForCausalLM",
                       dict(LLAMA, num_key_value_heads=1, attention_bias=True, mlp_bias=True,
                            rope_parameters=dict(LLAMA3_ROPE)),
                       dict(num_kv_heads=1, qkv_bias=True, out_bias=True, mlp_bias=True, rope_scaling="llama3",
                            rope_original_max_len=16, rope_theta=500000.0)),
    "qwen2": Row("Qwen2Config", "Qwen2ForCausalLM",
                 dict(LLAMA, num_key_value_heads=2, tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                 dict(num_kv_heads=2, tie_embeddings=True, qkv_bias=True, out_bias=False, rope_theta=1e6)),
    "mistral": Row("MistralConfig", "MistralForCausalLM", dict(LLAMA, num_key_value_heads=2, sliding_window=4),
                   dict(num_kv_heads=2, sliding_window=4, qkv_bias=False, tie_embeddings=False)),
    # Qwen3's q/k norms, and a head width apart from d_model / num_heads (Mistral's too)
    "qwen3": Row("Qwen3Config", "Qwen3ForCausalLM",
                 dict(QWEN3, num_key_value_heads=1, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                 dict(d_kv=24, num_kv_heads=1, qk_norm=True, qkv_bias=False, out_bias=False, tie_embeddings=False),
                 perturb=("norm", "bias"), shapes={"h_0/attn/query/kernel": (40, 3, 24)},
                 export_json=dict(model_type="qwen3", head_dim=24)),
    "qwen3_bias_tied": Row("Qwen3Config", "Qwen3ForCausalLM",
                           dict(QWEN3, num_key_value_heads=3, attention_bias=True, tie_word_embeddings=True),
                           dict(d_kv=24, num_kv_heads=0, qk_norm=True, qkv_bias=True, out_bias=True,
                                tie_embeddings=True),
                           perturb=("norm", "bias"), shapes={"h_0/attn/query/kernel": (40, 3, 24)}),
    "mistral_head24": Row("MistralConfig", "MistralForCausalLM", dict(QWEN3, num_key_value_heads=1, sliding_window=4),
                          dict(d_kv=24, num_kv_heads=1, qk_norm=False, sliding_window=4, tie_embeddings=False),
                          perturb=("norm", "bias"), shapes={"h_0/attn/query/kernel": (40, 3, 24)},
                          export_json=dict(model_type="mistral", head_dim=24)),
    # Phi-3: the fused qkv_proj splits into unequal parts (rows 40 | 8 | 8); a window shorter than the prompt
    # exports as the Mistral it equals, a partial rotary as Phi-3
    "phi3_window_gqa": Row("Phi3Config", "Phi3ForCausalLM", dict(PHI3, num_key_value_heads=1, sliding_window=5),
                           dict(num_kv_heads=1, sliding_window=5, rotary_fraction=1.0, tie_embeddings=False),
                           perturb=("norm",), prompt=PHI3_PROMPT, exports_as="MistralForCausalLM",
                           shapes={"h_0/attn/query/kernel": (40, 5, 8), "h_0/attn/key/kernel": (40, 1, 8),
                                   "h_0/mlp/gate/kernel": (40, 56), "h_0/mlp/fc/kernel": (40, 56)}),
    "phi3_partial_tied": Row("Phi3Config", "Phi3ForCausalLM",
                             dict(PHI3, num_key_value_heads=1, partial_rotary_factor=0.5, tie_word_embeddings=True),
                             dict(num_kv_heads=1, sliding_window=0, rotary_fraction=0.5, tie_embeddings=True),
                             perturb=("norm",), prompt=PHI3_PROMPT,
                             shapes={"h_0/attn/query/kernel": (40, 5, 8), "h_0/attn/key/kernel": (40, 1, 8),
                                     "h_0/mlp/gate/kernel": (40, 56), "h_0/mlp/fc/kernel": (40, 56)}),
    # Gemma 1, 2 and 3: (1 + w) norms perturbed off w = 0
    "gemma": Row("GemmaConfig", "GemmaForCausalLM", dict(GEMMA, hidden_act="gelu_pytorch_tanh"),
                 dict(norm="rmsnorm_plus1", mlp="geglu", embed_scale=True, post_norms=False, qk_norm=False,
                      global_every=0, final_softcap=0.0),
                 perturb=("norm",), prompt=GEMMA_PROMPT),
    "gemma2": Row("Gemma2Config", "Gemma2ForCausalLM",
                  dict(GEMMA, **GEMMA_LOCAL, layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
                  dict(post_norms=True, qk_norm=False, sliding_window=4, global_every=2, attn_softcap=5.0,
                       final_softcap=3.0, query_pre_attn_scalar=18),
                  perturb=("norm",), prompt=GEMMA_PROMPT, logit_cap=3.0),
    # local layers rotate with base 100, the global one with base 10000 scaled linearly by 4;
    # transformers' Gemma3Attention ignores attn_logit_softcapping: so does the import
    "gemma3": Row("Gemma3TextConfig", "Gemma3ForCausalLM",
                  dict(GEMMA, **GEMMA_LOCAL, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                       rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                        "full_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}}),
                  dict(post_norms=True, qk_norm=True, global_every=3, rope_theta=1e4, rope_local_theta=100.0,
                       rope_scaling="linear", rope_factor=4.0, attn_softcap=0.0, final_softcap=3.0),
                  perturb=("norm",), prompt=GEMMA_PROMPT, logit_cap=3.0),
    # GPT-NeoX / Pythia: rope on a quarter or half of each head, parallel residual on and off, exact and tanh GELU
    "pythia": Row("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(NEOX, rotary_pct=0.25, use_parallel_residual=True),
                  dict(rotary_fraction=0.25, parallel_residual=True, mlp="gelu_exact", qkv_bias=True, out_bias=True,
                       tie_embeddings=False),
                  perturb=("norm", "bias"), shapes={"h_0/attn/query/kernel": (48, 3, 16)},
                  export_json=dict(model_type="gpt_neox", rotary_pct=0.25)),
    "neox_sequential_half": Row(
        "GPTNeoXConfig", "GPTNeoXForCausalLM",
        dict(NEOX, rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5},
             use_parallel_residual=False, hidden_act="gelu_new", attention_bias=False, tie_word_embeddings=True),
        dict(rotary_fraction=0.5, rope_theta=500.0, parallel_residual=False, mlp="gelu", qkv_bias=False,
             out_bias=False, tie_embeddings=True),
        perturb=("norm", "bias"), shapes={"h_0/attn/query/kernel": (48, 3, 16)},
        export_json=dict(model_type="gpt_neox", rotary_pct=0.5)),
    # mixtures of experts: 4 experts, 2 a token, expert width 28; Qwen3-MoE's top-2 left unnormalised
    "mixtral": Row("MixtralConfig", "MixtralForCausalLM",
                   dict(MOE, intermediate_size=28, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4),
                   dict(num_experts=4, experts_per_token=2, moe_norm_topk=True, d_ff=28, num_kv_heads=2,
                        qk_norm=False, router_aux_loss_coef=0.02),
                   perturb=("norm",), shapes=MOE_SHAPES, export_json=dict(model_type="mixtral", num_experts_per_tok=2)),
    "qwen3_moe": Row("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                     dict(MOE, intermediate_size=56, moe_intermediate_size=28, num_attention_heads=3,
                          num_key_value_heads=1, head_dim=24, num_experts=4, norm_topk_prob=False),
                     dict(num_experts=4, experts_per_token=2, moe_norm_topk=False, d_ff=28, num_kv_heads=1, d_kv=24,
                          qk_norm=True, router_aux_loss_coef=0.02),
                     # Qwen3-MoE's router starts at zeros: uniform, every choice a tie
                     perturb=("norm", "router"), shapes=MOE_SHAPES,
                     export_json=dict(model_type="qwen3_moe", num_experts_per_tok=2)),
}

# ---- encoders: BERT, RoBERTa / XLM-R, DistilBERT, each head, every weight perturbed ------------------------
BERT = dict(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=64, type_vocab_size=2, num_labels=3)
# 3 heads of width 16
ODD = dict(vocab_size=101, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=80)


def roberta(pad):  # XLM-R with another pad id, so another position offset
    return dict(ODD, max_position_embeddings=24 + pad + 1, type_vocab_size=1, layer_norm_eps=1e-5, num_labels=3,
                pad_token_id=pad, bos_token_id=0, eos_token_id=2)


def encoder(config, model, kwargs, task, seed, converts_to=None, **fields) -> Row:
    """An encoder's row: every weight perturbed (+ 0.05 N(0, 1)), the head's own seed."""
    return Row(config, model, kwargs, converts_to or {}, perturb=("all",), scale=0.05, seed=seed, task=task, **fields)


def roberta_row(config, model, task, pad, seed):
    return encoder(config, model, roberta(pad), task, seed, dict(position_offset=pad + 1, max_len=24,
                                                                 classifier="roberta"),
                   left_pad=True, shapes={"bert/embed/position": (24 + pad + 1, 48)},
                   # XLM-R exports as RoBERTa: the same architecture
                   exports_as=model.removeprefix("XLM"), export_json=dict(model_type="roberta", pad_token_id=pad))


DISTILBERT = dict(vocab_size=101, dim=48, n_layers=2, n_heads=3, hidden_dim=80, max_position_embeddings=24)
DISTIL = dict(type_vocab_size=0, classifier="distilbert", ln_eps=1e-12)  # no token types; a ReLU pre_classifier
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
LABELS = dict(id2label=dict(enumerate(TAGS)), label2id={t: i for i, t in enumerate(TAGS)})
TAGGED = dict(param_keys=("bert", "token_head"),  # no pooler: the token classifier has none
              export_json=dict(id2label={str(i): t for i, t in enumerate(TAGS)}, label2id=LABELS["label2id"]))

ENCODERS = {
    "bert_encoder": encoder("BertConfig", "BertModel", BERT, "bert_encoder", 0, segments="random"),
    "bert_mlm": encoder("BertConfig", "BertForMaskedLM", BERT, "bert_mlm", 1, segments="random"),
    "bert_cls": encoder("BertConfig", "BertForSequenceClassification", BERT, "bert_cls", 2, segments="random"),
    "roberta_mlm": roberta_row("RobertaConfig", "RobertaForMaskedLM", "bert_mlm", 1, 0),
    "roberta_cls": roberta_row("RobertaConfig", "RobertaForSequenceClassification", "bert_cls", 1, 1),
    "roberta_encoder": roberta_row("RobertaConfig", "RobertaModel", "bert_encoder", 1, 2),
    "xlmr_mlm": roberta_row("XLMRobertaConfig", "XLMRobertaForMaskedLM", "bert_mlm", 3, 3),
    "distilbert_mlm": encoder("DistilBertConfig", "DistilBertForMaskedLM", dict(DISTILBERT, num_labels=3),
                              "bert_mlm", 0, DISTIL, absent=("bert/embed/segment",),
                              export_json=dict(model_type="distilbert")),
    "distilbert_cls": encoder("DistilBertConfig", "DistilBertForSequenceClassification",
                              dict(DISTILBERT, num_labels=3), "bert_cls", 1, DISTIL, absent=("bert/embed/segment",),
                              export_json=dict(model_type="distilbert")),
    # token classifiers (zoo's bert_tokens: one classifier at every position), their tags named
    "bert_tokens": encoder("BertConfig", "BertForTokenClassification",
                           dict(ODD, max_position_embeddings=24, type_vocab_size=2, pad_token_id=0, **LABELS),
                           "bert_tokens", 0, segments="split", **TAGGED),
    "roberta_tokens": encoder("RobertaConfig", "RobertaForTokenClassification",
                              dict(ODD, max_position_embeddings=26, type_vocab_size=1, layer_norm_eps=1e-5,
                                   pad_token_id=1, bos_token_id=0, eos_token_id=2, **LABELS),
                              "bert_tokens", 1, **TAGGED),
    "distilbert_tokens": encoder("DistilBertConfig", "DistilBertForTokenClassification",
                                 dict(DISTILBERT, pad_token_id=0, **LABELS), "bert_tokens", 2, **TAGGED),
}

# ---- encoder-decoders: T5 v1.0 / v1.1, mT5, BART, every weight perturbed ---------------------------------
# T5: N * H = 32 = D; v1.0 with a deeper decoder (transformers' generate fails on that with v1.0's tied head:
# its cache follows num_layers; greedy decoding is compared on every row all the same).
T5 = dict(vocab_size=256, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
          relative_attention_max_distance=20, decoder_start_token_id=0, dropout_rate=0.0)
T5_IDS = dict(decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)
# mT5: head width 24 over width 40 and 3 heads; T5's init std 1.0 on `shared` gives logits of ~100, where float32
# rounding nears 1e-4: scaled by 0.2
MT5 = dict(vocab_size=200, d_model=40, d_kv=24, d_ff=56, num_layers=2, num_decoder_layers=2, num_heads=3,
           relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
           feed_forward_proj="gated-gelu", decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
# BART over the trained byte-level BPE (5 specials, 256 bytes, 39 merges); zoo's decoding forces no EOS at max length
BART = dict(vocab_size=300, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32,
            dropout=0.0, forced_eos_token_id=None)
BART_IDS = dict(bos_token_id=0, decoder_start_token_id=2, eos_token_id=2, pad_token_id=1)


def seq2seq(config, model, kwargs, converts_to, seed, scale, frame, **fields) -> Row:
    return Row(config, model, kwargs, converts_to, perturb=("all",), scale=scale, seed=seed, task="seq2seq",
               frame=frame, **fields)


SEQ2SEQ = {
    "t5_v1_0": seq2seq("T5Config", "T5ForConditionalGeneration", dict(T5, feed_forward_proj="relu",
                                                                      num_decoder_layers=3),
                       dict(activation="relu", tie_output=True, output_scale=True, num_decoder_layers=3), 0, 0.1,
                       "t5", tokenizer="t5_unigram", export_json=T5_IDS),
    # untied: transformers 5 keeps an lm_head saved with other values
    "t5_v1_1": seq2seq("T5Config", "T5ForConditionalGeneration", dict(T5, feed_forward_proj="gated-gelu",
                                                                      tie_word_embeddings=False),
                       dict(activation="gated_gelu", tie_output=False, output_scale=False, num_decoder_layers=2), 1,
                       0.1, "t5", tokenizer="t5_unigram", redraw=(("lm_head.weight", 0.2),), export_json=T5_IDS),
    # mT5 exports as the T5 it equals; its decoder output is never scaled (transformers 5's mT5 does not,
    # whatever tie_word_embeddings says); saved without a tokenizer, so the export writes no special id past its
    # 200 rows (zoo's bytes framing says 256-258), leaving transformers' T5 defaults
    "mt5_tied": seq2seq("MT5Config", "MT5ForConditionalGeneration", MT5,
                        dict(activation="gated_gelu", head_dim=24, output_scale=False, tie_output=True), 0, 0.1, "t5",
                        then=(("shared.weight", "mul", 0.2),), exports_as="T5ForConditionalGeneration",
                        export_json=dict(model_type="t5")),
    "mt5_untied": seq2seq("MT5Config", "MT5ForConditionalGeneration", MT5,
                          dict(activation="gated_gelu", head_dim=24, output_scale=False, tie_output=False), 1, 0.1,
                          "t5", redraw=(("lm_head.weight", 0.2),), then=(("shared.weight", "mul", 0.2),),
                          exports_as="T5ForConditionalGeneration", export_json=dict(model_type="t5")),
    # bart-base's layout (one embedding, output tied) with a non-zero final_logits_bias, larger embeddings and
    # decoder positions (greedy output varies by row and step); untied: separate encoder, decoder and output weights
    "bart_tied": seq2seq("BartConfig", "BartForConditionalGeneration", BART,
                         dict(logits_bias=True, share_embeddings=True, tie_output=True), 0, 0.05, "bart",
                         tokenizer="bart_bpe", start_id=2, export_json=BART_IDS,
                         then=(("final_logits_bias", "normal", 1.0), ("model.decoder.embed_positions.weight",
                                                                      "normal", 1.0),
                               ("model.shared.weight", "normal", 0.5))),
    "bart_untied": seq2seq("BartConfig", "BartForConditionalGeneration", dict(BART, tie_word_embeddings=False),
                           dict(logits_bias=False, share_embeddings=False, tie_output=False), 1, 0.05, "bart",
                           tokenizer="bart_bpe", start_id=2, export_json=BART_IDS),
}
ROWS = {**DECODERS, **ENCODERS, **SEQ2SEQ}


# ---- tokenizers a row saves beside its weights ----------------------------------------------------------
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"  # ids 0 and 1
# Llama 3's split regex: letters, numbers in threes, punctuation runs, whitespace
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT = "{% for m in messages %}{{ bos_token }}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}" \
       "{% if add_generation_prompt %}assistant:{% endif %}"


def byte_level_tokenizer():
    """A Llama 3-style tokenizer: BPE over bytes after a split regex, BOS prepended, trained here."""
    from pydoc_data.topics import topics
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(topics.values())[:30], trainers.BpeTrainer(
        vocab_size=V, special_tokens=[BOS, EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    return tok


def t5_tokenizer():
    """A 250-piece unigram (tokenizers) over 40 pydoc topics, wrapped as transformers' T5Tokenizer with 4
    sentinels."""
    import json
    import transformers
    from pydoc_data.topics import topics
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()])
    tok.train_from_iterator(list(topics.values())[:40], trainers.UnigramTrainer(
        vocab_size=250, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"))
    vocab = [tuple(v) for v in json.loads(tok.to_str())["model"]["vocab"]]
    return transformers.T5Tokenizer(vocab=vocab, extra_ids=4)


def bart_bpe(path) -> str:
    """vocab.json + merges.txt of a 300-id byte-level BPE over 40 pydoc topics, BART's specials first (<s>=0
    <pad>=1 </s>=2 <unk>=3 <mask>=4), saved into `path`."""
    from pydoc_data.topics import topics
    from tokenizers import ByteLevelBPETokenizer
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(list(topics.values())[:40], vocab_size=300,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(path))
    return str(path)


def bart_tokenizer(bpe_dir: str):
    import os
    import transformers
    return transformers.BartTokenizer(vocab=os.path.join(bpe_dir, "vocab.json"),
                                      merges=os.path.join(bpe_dir, "merges.txt"))


def save_tokenizer(kind: str, path) -> None:
    """Save the tokenizer a row names into checkpoint directory `path` (transformers 5 writes tokenizer.json)."""
    import tempfile
    import transformers
    if kind == "llama3":
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=byte_level_tokenizer(), bos_token=BOS,
                                                    eos_token=EOS)
        fast.chat_template = CHAT
        fast.save_pretrained(str(path))
    elif kind == "t5_unigram":
        t5_tokenizer().save_pretrained(str(path))
    else:
        assert kind == "bart_bpe", kind
        with tempfile.TemporaryDirectory() as d:
            bart_tokenizer(bart_bpe(d)).save_pretrained(str(path))
