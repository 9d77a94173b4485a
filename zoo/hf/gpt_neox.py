"""GPT-NeoX and Pythia (`GPTNeoXForCausalLM`, `GPTNeoXModel`) <-> zoo GPT: rotary positions on the first
fraction of each head (`rotary_pct`, transformers 5's partial_rotary_factor: zoo's rotary_fraction;
rotate-half within it, as zoo's Rope), LayerNorm with biases, an exact (erf) GELU MLP with biases (zoo's
mlp=gelu_exact; gelu_new / gelu_pytorch_tanh are zoo's tanh gelu), biases on attention (`attention_bias`),
an untied output head `embed_out` (unless tie_word_embeddings) and, with `use_parallel_residual`, the
attention and MLP branches both read the block's input (zoo's parallel_residual).

HF fuses query, key and value into one torch Linear attention.query_key_value [N * 3 * H, D] whose output
rows are grouped per head, (N, 3, H): head n's query, key, value, then head n + 1's; zoo keeps query, key
and value [D, N, H] apart, and the key table splits and joins them (`table.PER_HEAD_QKV`), biases too.
Old checkpoints carry buffers (attention.bias, attention.masked_bias, rotary_emb.inv_freq), recomputed.
"""

from __future__ import annotations

from zoo.errors import ConversionError
from zoo.hf import llama, table
from zoo.hf.io import Keys
from zoo.models.gpt import GptConfig

ARCHITECTURES = ("GPTNeoXForCausalLM", "GPTNeoXModel")
PREFIXES = ("gpt_neox.",)
IGNORED = ("attention.bias", "attention.masked_bias", "rotary_emb.inv_freq")  # buffers of old checkpoints
task_for, data_fields, seq2seq_framing = llama.task_for, llama.data_fields, llama.seq2seq_framing
head_config, run_fields = llama.head_config, llama.run_fields
EMBED_OUT = "embed_out.weight"
ACTIVATIONS = {"gelu": "gelu_exact", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu"}  # hidden_act -> zoo mlp


def key_table(cfg: GptConfig) -> list:
    """The two-way key table (names without the "gpt_neox." wrapper; embed_out beside it when untied)."""
    qkv = "attention.query_key_value"
    attn = []
    for j, name in enumerate(("query", "key", "value")):
        attn.append((f"attn/{name}/kernel", f"{qkv}.weight", table.fused(table.HEADS_IN, j, 3, table.PER_HEAD_QKV)))
        if cfg.qkv_bias:
            attn.append((f"attn/{name}/bias", f"{qkv}.bias", table.fused(table.HEADS_BIAS, j, 3, table.PER_HEAD_QKV)))
    attn.append(("attn/out/kernel", "attention.dense.weight", table.HEADS_OUT))
    if cfg.out_bias:
        attn.append(("attn/out/bias", "attention.dense.bias", table.SAME))
    block = [*table.ln("ln_1", "input_layernorm"), *attn, *table.ln("ln_2", "post_attention_layernorm"),
             *table.linear("mlp/fc", "mlp.dense_h_to_4h"), *table.linear("mlp/proj", "mlp.dense_4h_to_h")]
    head = [] if cfg.tie_embeddings else [("lm_head/embedding", EMBED_OUT, table.SAME)]
    return [("wte/embedding", "embed_in.weight", table.SAME), *table.ln("ln_f", "final_layer_norm"),
            *table.layers(cfg.num_layers, "h_{i}", "layers.{i}.", block), *head]


def params_from_hf(keys: Keys, cfg: GptConfig, task: str) -> dict:
    if cfg.tie_embeddings:  # transformers ties a saved embed_out back to embed_in on load: it is not read
        keys.optional(EMBED_OUT)
    return table.from_hf(keys, key_table(cfg), cfg)


def params_to_hf(params: dict, cfg: GptConfig) -> dict:
    return table.to_hf(params, key_table(cfg), cfg, prefix="gpt_neox.", outside=("embed_out.",))


def rope_fields(hf: dict) -> dict:
    """Rope fields from transformers 5's `rope_parameters` or the older `rotary_pct` / `rotary_emb_base`
    (Pythia's config.json), with GPTNeoXConfig's defaults (a quarter of each head, base 10000)."""
    params = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ConversionError(f"GPT-NeoX rope type {kind!r} is not supported; supported: default")
    fraction = params.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))
    theta = params.get("rope_theta", hf.get("rotary_emb_base", 10000.0))
    return dict(positions="rope", rope_theta=float(theta), rotary_fraction=float(fraction))


def check_rotary(name: str, fraction: float, head_dim: int) -> None:
    """Refuse a partial rotary that rotates an odd or zero number of dims (transformers' int(H * fraction)),
    which zoo's rotate-half cannot hold."""
    r = int(head_dim * fraction)
    if r % 2 or r <= 0 or fraction > 1:
        raise ConversionError(f"{name} partial rotary {fraction} rotates {r} of each head's {head_dim} dims; "
                              f"supported: an even, nonzero number (fraction in (0, 1])")


def config_from_hf(hf: dict, keys: Keys) -> GptConfig:
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ConversionError(f"GPT-NeoX hidden_act={act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    d, n = hf["hidden_size"], hf["num_attention_heads"]
    bias = bool(hf.get("attention_bias", True))
    tied = bool(hf.get("tie_word_embeddings", False)) or EMBED_OUT not in keys  # a bare model: no head
    rope = rope_fields(hf)
    check_rotary("GPT-NeoX", rope["rotary_fraction"], d // n)
    return GptConfig(vocab_size=hf["vocab_size"], max_len=hf["max_position_embeddings"],
                     num_layers=hf["num_hidden_layers"], d_model=d, num_heads=n, d_ff=hf["intermediate_size"],
                     dropout=0.0, ln_eps=hf.get("layer_norm_eps", 1e-5), norm="layernorm", mlp=ACTIVATIONS[act],
                     qkv_bias=bias, out_bias=bias, mlp_bias=True, tie_embeddings=tied,
                     parallel_residual=bool(hf.get("use_parallel_residual", True)), **rope)


def config_to_hf(cfg: GptConfig) -> dict:
    """config.json as transformers 5 saves it, with the older rotary_pct / rotary_emb_base beside it."""
    act = {"gelu_exact": "gelu", "gelu": "gelu_new"}[cfg.mlp]
    return {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.max_len, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.d_ff, "hidden_act": act,
            "layer_norm_eps": cfg.ln_eps, "use_parallel_residual": cfg.parallel_residual,
            "attention_bias": cfg.qkv_bias, "tie_word_embeddings": cfg.tie_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta,
                                "partial_rotary_factor": cfg.rotary_fraction},
            "rotary_pct": cfg.rotary_fraction, "rotary_emb_base": cfg.rope_theta, "attention_dropout": 0.0,
            "hidden_dropout": 0.0, "dtype": "float32"}


def exports(model_cfg) -> bool:
    """GPT-NeoX: positions=rope (rope_scaling=none, any rotary_fraction), norm=layernorm, mlp=gelu_exact or
    gelu, num_kv_heads=0, d_kv=0, qkv_bias == out_bias, mlp_bias, sliding_window=0, qk_norm off, either
    residual"""
    c = model_cfg
    return c.positions == "rope" and c.rope_scaling == "none" and c.norm == "layernorm" and \
        c.mlp in ("gelu_exact", "gelu") and c.kv_heads == c.num_heads and c.head_dim * c.num_heads == c.d_model \
        and c.qkv_bias == c.out_bias and c.mlp_bias and c.sliding_window == 0 and not c.qk_norm \
        and not c.gemma_parts  # (experts need mlp=swiglu: refused above)
