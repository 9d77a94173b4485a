"""Llama (`LlamaForCausalLM`, `LlamaModel`) <-> zoo GPT with its modern-decoder switches: config and
weight mapping, and the helpers Qwen2, Qwen3 and Mistral (zoo.hf.qwen2, qwen3, mistral) share: the four
are one decoder (rotary positions, RMSNorm, SwiGLU, grouped-query attention, config.json's `head_dim` as
zoo's d_kv) that differ in biases, tying, the sliding window and Qwen3's q/k norms.

HF keeps each projection a torch Linear: q_proj [N*H, D], k_proj and v_proj [K*H, D], o_proj [D, N*H];
zoo keeps query [D, N, H], key/value [D, K, H], out [N, H, D]. Both apply rotary positions in the
rotate-half convention, so q_proj/k_proj need no permutation. The MLP is gate_proj (zoo `gate`),
up_proj (`fc`) and down_proj (`proj`). The output head `lm_head` is tied to `embed_tokens` unless the
config unties it. Import and export are both derived from `key_table` (zoo.hf.table).
"""

from __future__ import annotations

from zoo.errors import ConversionError
from zoo.hf import gpt2, table
from zoo.hf.io import Keys
from zoo.models.gpt import GptConfig

TASK = gpt2.TASK
ARCHITECTURES = ("LlamaForCausalLM", "LlamaModel")
PREFIXES = ("model.",)
IGNORED = ("rotary_emb.inv_freq",)  # a buffer of old checkpoints, recomputed from the config
ROPE_TYPES = ("default", "llama3")  # rope_parameters' rope_type values zoo's Rope computes
LM_HEAD = "lm_head.weight"


# ---- shared with qwen2 and mistral -----------------------------------------------------------------
def rope_fields(hf: dict, name: str, partial_ok: bool = False) -> dict:
    """GptConfig's rope fields from config.json: transformers 5's `rope_parameters` (rope_type,
    rope_theta, llama3's factors), or the older top-level `rope_theta` + `rope_scaling` (`type` or
    `rope_type`); `rope_scaling` wins where both are given, as in transformers. `partial_ok`: the architecture
    rotates the first partial_rotary_factor of each head (Phi-3: zoo's rotary_fraction), else refused."""
    params = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if any(isinstance(v, dict) for v in params.values()):
        raise ConversionError(f"{name} rope parameters per layer type ({', '.join(params)}) are not supported")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ConversionError(f"{name} rope type {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor")) or 1.0
    if partial != 1.0 and not partial_ok:
        raise ConversionError(f"{name} partial_rotary_factor={partial} is not supported (zoo rotates whole heads)")
    out = dict(positions="rope", rope_theta=float(params.get("rope_theta", hf.get("rope_theta", 10000.0))))
    if partial != 1.0:
        out["rotary_fraction"] = float(partial)
    if kind == "llama3":
        missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if k not in params]
        if missing:
            raise ConversionError(f"{name} llama3 rope scaling has no {', '.join(missing)}")
        out.update(rope_scaling="llama3", rope_factor=float(params["factor"]),
                   rope_low_freq_factor=float(params["low_freq_factor"]),
                   rope_high_freq_factor=float(params["high_freq_factor"]),
                   rope_original_max_len=int(params.get("original_max_position_embeddings",
                                                        hf.get("original_max_position_embeddings",
                                                               hf["max_position_embeddings"]))))
    return out


def decoder_fields(hf: dict, keys: Keys, name: str, partial_ok: bool = False) -> dict:
    """GptConfig fields every Llama-like config.json gives (all but biases and the window). The head
    is tied when `tie_word_embeddings` says so or the checkpoint has no lm_head (a bare model)."""
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ConversionError(f"{name} hidden_act={act!r} is not supported (zoo's SwiGLU is silu-gated)")
    d, n = hf["hidden_size"], hf["num_attention_heads"]
    h = hf.get("head_dim") or d // n  # transformers: head_dim, else hidden_size // num_attention_heads
    k = hf.get("num_key_value_heads") or n
    return dict(vocab_size=hf["vocab_size"], max_len=hf["max_position_embeddings"],
                num_layers=hf["num_hidden_layers"], d_model=d, num_heads=n, num_kv_heads=0 if k == n else k,
                d_kv=0 if h * n == d else h,
                d_ff=hf["intermediate_size"], dropout=0.0, ln_eps=hf.get("rms_norm_eps", 1e-6), norm="rmsnorm",
                mlp="swiglu", tie_embeddings=bool(hf.get("tie_word_embeddings", False)) or LM_HEAD not in keys,
                **rope_fields(hf, name, partial_ok))


def decoder(cfg, qk_norm: bool = False) -> bool:
    """The parts every Llama-like export needs: rotary positions, RMSNorm, SwiGLU, and q/k norms exactly
    where the architecture has them (Qwen3); whole heads rotated, one residual after the other."""
    return cfg.positions == "rope" and cfg.norm == "rmsnorm" and cfg.mlp == "swiglu" and cfg.qk_norm == qk_norm \
        and cfg.rotary_fraction == 1.0 and not cfg.parallel_residual and cfg.rope_scaling != "linear" \
        and not cfg.gemma_parts and not cfg.num_experts  # Gemma's parts: zoo.hf.gemma; experts: zoo.hf.mixtral


def decoder_to_hf(cfg: GptConfig, architecture: str, model_type: str) -> dict:
    """config.json fields every Llama-like export writes (as transformers 5 saves them)."""
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "llama3":
        rope.update(rope_type="llama3", factor=cfg.rope_factor, low_freq_factor=cfg.rope_low_freq_factor,
                    high_freq_factor=cfg.rope_high_freq_factor,
                    original_max_position_embeddings=cfg.rope_original_max_len)
    return {"architectures": [architecture], "model_type": model_type, "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.max_len, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
            "intermediate_size": cfg.d_ff, "hidden_act": "silu", "rms_norm_eps": cfg.ln_eps,
            "rope_parameters": rope, "tie_word_embeddings": cfg.tie_embeddings, "attention_dropout": 0.0,
            "dtype": "float32"}


def key_table(cfg: GptConfig) -> list:
    """The two-way key table (names without the "model." wrapper; lm_head beside it when untied)."""
    attn = []
    for zoo_name, hf_name, kernel, bias in (("query", "q_proj", table.HEADS_IN, cfg.qkv_bias),
                                            ("key", "k_proj", table.KV_HEADS_IN, cfg.qkv_bias),
                                            ("value", "v_proj", table.KV_HEADS_IN, cfg.qkv_bias),
                                            ("out", "o_proj", table.HEADS_OUT, cfg.out_bias)):
        attn.append((f"attn/{zoo_name}/kernel", f"self_attn.{hf_name}.weight", kernel))
        if bias:
            bias_t = {"query": table.HEADS_BIAS, "out": table.SAME}.get(zoo_name, table.KV_HEADS_BIAS)
            attn.append((f"attn/{zoo_name}/bias", f"self_attn.{hf_name}.bias", bias_t))
    if cfg.qk_norm:  # Qwen3: RMSNorm weights [H], one per projection, shared by its heads
        attn += [*table.rms("attn/q_norm", "self_attn.q_norm"), *table.rms("attn/k_norm", "self_attn.k_norm")]
    block = [*table.rms("ln_1", "input_layernorm"), *attn, *table.rms("ln_2", "post_attention_layernorm"),
             *table.linear("mlp/gate", "mlp.gate_proj", cfg.mlp_bias),
             *table.linear("mlp/fc", "mlp.up_proj", cfg.mlp_bias),
             *table.linear("mlp/proj", "mlp.down_proj", cfg.mlp_bias)]
    head = [] if cfg.tie_embeddings else [("lm_head/embedding", LM_HEAD, table.SAME)]
    return [("wte/embedding", "embed_tokens.weight", table.SAME), *table.rms("ln_f", "norm"),
            *table.layers(cfg.num_layers, "h_{i}", "layers.{i}.", block), *head]


def params_from_hf(keys: Keys, cfg: GptConfig, task: str) -> dict:
    if cfg.tie_embeddings:  # transformers ties a saved lm_head back to embed_tokens on load: it is not read
        keys.optional(LM_HEAD)
    return table.from_hf(keys, key_table(cfg), cfg)


def params_to_hf(params: dict, cfg: GptConfig) -> dict:
    return table.to_hf(params, key_table(cfg), cfg, prefix="model.", outside=("lm_head.",))


task_for, data_fields, seq2seq_framing, head_config = gpt2.task_for, gpt2.data_fields, gpt2.seq2seq_framing, \
    gpt2.head_config  # a causal LM, as GPT-2: no data fields, no seq2seq framing, no classifier head


def run_fields(cfg) -> dict:
    """eos_token_id: the run's end-of-text, as for GPT-2 (bytes' 256, a tiktoken encoding's, a converted
    checkpoint's EOS), on which transformers' `generate` stops; bos_token_id: the converted checkpoint
    tokenizer's own BOS, else the same; none when the model does not hold them (a checkpoint converted
    without its tokenizer)."""
    from zoo.data.tokenizers import get_tokenizer
    tok = get_tokenizer(cfg.data.tokenizer)
    eot, bos = int(tok.eot_token), getattr(tok, "bos_token", None)
    if eot >= cfg.model.vocab_size:
        return {}
    return {"bos_token_id": bos if bos is not None and bos < cfg.model.vocab_size else eot, "eos_token_id": eot}


# ---- Llama itself ----------------------------------------------------------------------------------
def config_from_hf(hf: dict, keys: Keys) -> GptConfig:
    bias = bool(hf.get("attention_bias", False))
    return GptConfig(**decoder_fields(hf, keys, "Llama"), qkv_bias=bias, out_bias=bias,
                     mlp_bias=bool(hf.get("mlp_bias", False)))


def config_to_hf(cfg: GptConfig) -> dict:
    return {**decoder_to_hf(cfg, "LlamaForCausalLM", "llama"), "attention_bias": cfg.qkv_bias,
            "mlp_bias": cfg.mlp_bias}


def exports(model_cfg) -> bool:
    """Llama: positions=rope, norm=rmsnorm, mlp=swiglu, qkv_bias == out_bias, sliding_window=0, qk_norm off"""
    return decoder(model_cfg) and model_cfg.qkv_bias == model_cfg.out_bias and model_cfg.sliding_window == 0
