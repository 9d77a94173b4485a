"""Gemma (`GemmaForCausalLM`) <-> zoo GPT, and the key table and helpers Gemma 2 and Gemma 3 (zoo.hf.gemma2,
gemma3) share: Llama's projections (zoo.hf.llama) with zoo's Gemma switches.

All three are one decoder: RMSNorm scaled by (1 + w) (zoo norm `rmsnorm_plus1`, on Gemma 3's q/k heads too),
a tanh-GELU-gated MLP (`geglu`: gate_proj -> gate, up_proj -> fc, down_proj -> proj), token embeddings
times sqrt(d_model) (`embed_scale`), rotary positions, grouped-query attention, a head width of its own
(config.json `head_dim`: zoo's d_kv), the output tied to the embedding. Gemma 2 and 3 add a norm after each
sublayer (`post_norms`): HF's input_layernorm, post_attention_layernorm, pre_feedforward_layernorm and
post_feedforward_layernorm are zoo's ln_1, post_ln_1, ln_2 and post_ln_2 (Gemma 1's post_attention_layernorm
is the MLP's pre-norm, ln_2, as Llama's), an attention scale 1/sqrt(query_pre_attn_scalar), soft-capped
attention and output logits (`attn_softcap`, `final_softcap`; None in config.json is zoo's 0), and
local (sliding-window) layers beside global ones: config.json's `layer_types` must be every Nth layer
full_attention, the rest sliding_attention (zoo's `global_every` N; Gemma 2: 2, Gemma 3: 6). Import and
export are both derived from `key_table` (zoo.hf.table).
"""

from __future__ import annotations

from zoo.errors import ConversionError
from zoo.hf import llama, table
from zoo.hf.io import Keys
from zoo.models.gpt import GptConfig

ARCHITECTURES = ("GemmaForCausalLM", "GemmaModel")
PREFIXES, IGNORED = llama.PREFIXES, llama.IGNORED
task_for, data_fields, seq2seq_framing = llama.task_for, llama.data_fields, llama.seq2seq_framing
head_config, run_fields = llama.head_config, llama.run_fields
LM_HEAD = llama.LM_HEAD
ACTIVATION = "gelu_pytorch_tanh"
LAYER_TYPES = ("sliding_attention", "full_attention")


# ---- shared with gemma2 and gemma3 -----------------------------------------------------------------
def base_fields(hf: dict, keys: Keys, name: str, act_key: str, acts: tuple = (ACTIVATION,)) -> dict:
    """GptConfig fields every Gemma config.json gives (all but rope, the window, post norms and caps)."""
    act = hf.get(act_key, ACTIVATION)
    if act not in acts:
        raise ConversionError(f"{name} {act_key}={act!r} is not supported; supported: {', '.join(acts)} "
                              f"(zoo's geglu is tanh-GELU-gated)")
    if hf.get("use_bidirectional_attention"):
        raise ConversionError(f"{name} use_bidirectional_attention=true is not supported; supported: causal attention")
    d, n = hf["hidden_size"], hf["num_attention_heads"]
    h = hf.get("head_dim") or d // n
    k = hf.get("num_key_value_heads") or n
    bias = bool(hf.get("attention_bias", False))
    return dict(vocab_size=hf["vocab_size"], max_len=hf["max_position_embeddings"],
                num_layers=hf["num_hidden_layers"], d_model=d, num_heads=n, num_kv_heads=0 if k == n else k,
                d_kv=0 if h * n == d else h, d_ff=hf["intermediate_size"], dropout=0.0,
                ln_eps=hf.get("rms_norm_eps", 1e-6), norm="rmsnorm_plus1", mlp="geglu", embed_scale=True,
                qkv_bias=bias, out_bias=bias, mlp_bias=False,
                tie_embeddings=bool(hf.get("tie_word_embeddings", True)) or LM_HEAD not in keys)


def local_fields(hf: dict, name: str, default_every: int) -> dict:
    """sliding_window and global_every from `layer_types` (absent: every `default_every`th layer global),
    the Gemma 2/3 fields after the window: query_pre_attn_scalar and the two soft-caps."""
    L, window = hf["num_hidden_layers"], hf.get("sliding_window") or 0
    types = list(hf.get("layer_types") or pattern(default_every, L))
    if len(types) != L or set(types) - set(LAYER_TYPES):
        raise ConversionError(f"{name} layer_types {types} is not supported; supported: {L} of "
                              f"{', '.join(LAYER_TYPES)}")
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    every = full[0] + 1 if full else L + 1  # no global layer: every layer local
    if types != pattern(every, L):
        raise ConversionError(f"{name} layer_types {types} is not supported; supported: every Nth layer "
                              f"full_attention, the others sliding_attention")
    if not window and every != 1:
        raise ConversionError(f"{name} has sliding_attention layers but no sliding_window")
    caps = {f: float(hf.get(k) or 0.0) for f, k in (("attn_softcap", "attn_logit_softcapping"),
                                                    ("final_softcap", "final_logit_softcapping"))}
    return dict(sliding_window=window, global_every=every if window else 0,
                query_pre_attn_scalar=int(hf.get("query_pre_attn_scalar") or 0), **caps)


def pattern(every: int, num_layers: int) -> list:
    """layer_types of every `every`th layer global (transformers' sliding_window_pattern)."""
    return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(num_layers)]


def layer_types(cfg: GptConfig) -> list:
    """config.json's layer_types of a zoo model: its local layers, all sliding under one window, else all full."""
    if cfg.global_every:
        return [LAYER_TYPES[0] if local else LAYER_TYPES[1] for local in cfg.layer_local]
    return [LAYER_TYPES[0 if cfg.sliding_window else 1]] * cfg.num_layers


def base_to_hf(cfg: GptConfig, architecture: str, model_type: str, act_key: str) -> dict:
    """config.json fields every Gemma export writes."""
    out = llama.decoder_to_hf(cfg, architecture, model_type)
    del out["hidden_act"]
    return {**out, act_key: ACTIVATION, "attention_bias": cfg.qkv_bias}


def local_to_hf(cfg: GptConfig) -> dict:
    """The Gemma 2/3 fields local_fields reads."""
    return {"sliding_window": cfg.sliding_window or None, "layer_types": layer_types(cfg),
            "query_pre_attn_scalar": cfg.query_pre_attn_scalar or cfg.head_dim,
            "attn_logit_softcapping": cfg.attn_softcap or None, "final_logit_softcapping": cfg.final_softcap or None,
            "use_bidirectional_attention": False}


def gemma(cfg, post_norms: bool, qk_norm: bool) -> bool:
    """The parts every Gemma export needs; post norms and q/k norms exactly where the version has them."""
    return (cfg.positions, cfg.norm, cfg.mlp) == ("rope", "rmsnorm_plus1", "geglu") and cfg.embed_scale and \
        cfg.post_norms == post_norms and cfg.qk_norm == qk_norm and cfg.qkv_bias == cfg.out_bias and \
        not cfg.mlp_bias and cfg.rotary_fraction == 1.0 and not cfg.parallel_residual and not cfg.num_experts and \
        (cfg.rope_scaling != "linear" or cfg.qk_norm)  # linear: Gemma 3's global layers only


def key_table(cfg: GptConfig) -> list:
    """The two-way key table (names without the "model." wrapper; lm_head beside it when untied)."""
    attn = []
    for zoo_name, hf_name, kernel in (("query", "q_proj", table.HEADS_IN), ("key", "k_proj", table.KV_HEADS_IN),
                                      ("value", "v_proj", table.KV_HEADS_IN), ("out", "o_proj", table.HEADS_OUT)):
        attn.append((f"attn/{zoo_name}/kernel", f"self_attn.{hf_name}.weight", kernel))
        if cfg.qkv_bias:
            bias_t = {"query": table.HEADS_BIAS, "out": table.SAME}.get(zoo_name, table.KV_HEADS_BIAS)
            attn.append((f"attn/{zoo_name}/bias", f"self_attn.{hf_name}.bias", bias_t))
    if cfg.qk_norm:  # Gemma 3: (1 + w) RMSNorm weights [H], one per projection, shared by its heads
        attn += [*table.rms("attn/q_norm", "self_attn.q_norm"), *table.rms("attn/k_norm", "self_attn.k_norm")]
    if cfg.post_norms:  # Gemma 2, 3: a norm before and after each sublayer
        norms = [*table.rms("ln_1", "input_layernorm"), *table.rms("post_ln_1", "post_attention_layernorm"),
                 *table.rms("ln_2", "pre_feedforward_layernorm"), *table.rms("post_ln_2", "post_feedforward_layernorm")]
    else:
        norms = [*table.rms("ln_1", "input_layernorm"), *table.rms("ln_2", "post_attention_layernorm")]
    block = [*norms, *attn, *table.linear("mlp/gate", "mlp.gate_proj", False),
             *table.linear("mlp/fc", "mlp.up_proj", False), *table.linear("mlp/proj", "mlp.down_proj", False)]
    head = [] if cfg.tie_embeddings else [("lm_head/embedding", LM_HEAD, table.SAME)]
    return [("wte/embedding", "embed_tokens.weight", table.SAME), *table.rms("ln_f", "norm"),
            *table.layers(cfg.num_layers, "h_{i}", "layers.{i}.", block), *head]


def params_from_hf(keys: Keys, cfg: GptConfig, task: str) -> dict:
    if cfg.tie_embeddings:  # transformers ties a saved lm_head back to embed_tokens on load: it is not read
        keys.optional(LM_HEAD)
    return table.from_hf(keys, key_table(cfg), cfg)


def params_to_hf(params: dict, cfg: GptConfig) -> dict:
    return table.to_hf(params, key_table(cfg), cfg, prefix="model.", outside=("lm_head.",))


# ---- Gemma 1 itself --------------------------------------------------------------------------------
def config_from_hf(hf: dict, keys: Keys) -> GptConfig:
    # transformers reads Gemma's legacy hidden_act "gelu" as the tanh approximation, as the weights were trained
    return GptConfig(**base_fields(hf, keys, "Gemma", "hidden_act", (ACTIVATION, "gelu")),
                     **llama.rope_fields(hf, "Gemma"))


def config_to_hf(cfg: GptConfig) -> dict:
    return base_to_hf(cfg, "GemmaForCausalLM", "gemma", "hidden_act")


def exports(model_cfg) -> bool:
    """Gemma: positions=rope, norm=rmsnorm_plus1, mlp=geglu, embed_scale, no post_norms or qk_norm, no
    mlp_bias, qkv_bias == out_bias, no window, soft-caps or query_pre_attn_scalar"""
    c = model_cfg
    return gemma(c, post_norms=False, qk_norm=False) and not (c.sliding_window or c.global_every or c.attn_softcap
                                                               or c.final_softcap or c.rope_local_theta) and \
        c.query_pre_attn_scalar in (0, c.head_dim)
