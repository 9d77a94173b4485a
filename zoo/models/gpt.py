"""Decoder-only GPT: its config, presets and the causal language model.

GPT-2 by default: learned positions, pre-LN blocks, tanh-GELU MLP, dropout on embeddings and residual
branches, causal attention, final LayerNorm, output tied to the token embedding. The decoders trained
today (Llama, Mistral, Qwen2, SmolLM) are the same causal stack with other parts, chosen by config
switches: rotary positions (with Llama 3's frequency scaling), RMSNorm, a SwiGLU MLP, grouped-query
attention (`num_kv_heads`), a head width apart from d_model / num_heads (`d_kv`: Qwen3, Mistral-Nemo,
Gemma), RMSNorm on each query and key head (`qk_norm`: Qwen3), biases per projection, an untied output
head and a sliding window. GPT-NeoX / Pythia add a parallel residual (`parallel_residual`), rope on part of
each head (`rotary_fraction`) and the exact GELU (mlp `gelu_exact`); Phi-3 is Llama's decoder. Gemma 1/2/3
add a (1 + w) RMSNorm (norm `rmsnorm_plus1`), a tanh-GELU-gated MLP (`geglu`), embeddings scaled by
sqrt(d_model), norms after each sublayer too, soft-capped attention and output logits, an attention scale of
their own, and local (windowed) layers beside global ones (`global_every`, with a rope base of their own);
those that differ by layer reach the blocks through `per_layer` (zoo.nn.stack), traced flags when scanned.
The GPT-2 speedrun (modded-nanogpt) adds a relu2 MLP, residual projections initialised to zero, U-net skips
and value embeddings (GPT_SPEEDRUN; each off by default, leaving the model as it was).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp

from zoo.models import mtp
from zoo.models.base import ModelConfig, check, check_choice, check_positive
from zoo.nn import layers
from zoo.nn.block import Block
from zoo.nn.positions import Rope
from zoo.nn.stack import residual_std, stack_blocks

POSITIONS = ("learned", "rope")
NORMS = ("layernorm", "rmsnorm", "rmsnorm_plus1")
MLPS = ("gelu", "swiglu", "gelu_exact", "geglu", "relu2")
ROPE_SCALINGS = ("none", "llama3", "linear")
MLP_ACTIVATIONS = {"gelu": layers.gelu_tanh, "gelu_exact": layers.gelu_exact,
                   "geglu": layers.gelu_tanh, "relu2": layers.relu_squared}  # the rest: silu (gated)
GATED_MLPS = ("swiglu", "geglu")


@dataclass(frozen=True, kw_only=True)
class GptConfig(ModelConfig):
    """A decoder-only transformer: GPT-2 by default; Llama, Mistral, Qwen2, Qwen3 and Gemma through the switches
    below."""

    family: ClassVar[str] = "gpt"
    vocab_size: int = 50257  # rows of the token embedding; >= the tokenizer's vocabulary
    max_len: int = 1024  # the longest sequence the model accepts (learned positions: their table's rows)
    num_layers: int = 12  # transformer blocks (L)
    d_model: int = 768  # residual width (D)
    num_heads: int = 12  # attention heads (N); D must divide by N unless d_kv is set
    d_kv: int = 0  # head width (H); 0: d_model // num_heads (Qwen3, Mistral-Nemo: N * H != D; HF's head_dim)
    d_ff: int = 3072  # MLP hidden width (F)
    dropout: float = 0.1  # on embeddings and on each residual branch, training only
    ln_eps: float = 1e-5  # norm epsilon (GPT-2 LayerNorm 1e-5; Llama RMSNorm 1e-5 or 1e-6)
    # Modern decoders. GPT-2: learned, layernorm, gelu, num_kv_heads 0, biases on, tied, no window.
    positions: str = "learned"  # learned (a table of max_len rows) | rope (rotary, no parameters)
    rope_theta: float = 10000.0  # rope: the base of the frequencies
    rope_scaling: str = "none"  # rope: none | llama3 (Llama 3.1/3.2's long-context frequency scaling) | linear
    #   (positions divided by rope_factor: Gemma 3's global layers)
    rope_factor: float = 8.0  # llama3 and linear scaling: factor
    rope_low_freq_factor: float = 1.0  # llama3 scaling: low-frequency factor
    rope_high_freq_factor: float = 4.0  # llama3 scaling: high-frequency factor
    rope_original_max_len: int = 8192  # llama3 scaling: the context length the frequencies were trained for
    norm: str = "layernorm"  # layernorm | rmsnorm | rmsnorm_plus1 (scaled by 1 + w: Gemma)
    mlp: str = "gelu"  # gelu (GPT-2's tanh GELU, 2 matrices) | swiglu (silu-gated, 3 matrices, Llama) | gelu_exact
    #   (erf GELU, 2 matrices: GPT-NeoX, Pythia) | relu2 (relu(x)^2, 2 matrices: modded-nanogpt's speedrun)
    num_kv_heads: int = 0  # key/value heads K for grouped-query (1: multi-query) attention; 0: num_heads
    qkv_bias: bool = True  # biases on the query/key/value projections (GPT-2, Qwen2: yes; Llama: no)
    out_bias: bool = True  # bias on the attention output projection
    mlp_bias: bool = True  # biases in the MLP
    tie_embeddings: bool = True  # the output projection is the token embedding; else its own `lm_head`
    sliding_window: int = 0  # > 0: each token attends to at most this many latest positions (Mistral)
    qk_norm: bool = False  # RMSNorm (weight [H], eps ln_eps) on each query and key head before rope (Qwen3)
    # GPT-NeoX / Pythia and Phi-3 (zoo.hf.gpt_neox, zoo.hf.phi3); mlp gelu_exact (NeoX's erf GELU) is above.
    parallel_residual: bool = False  # x + attn(ln_1(x)) + mlp(ln_2(x)), both from the same x (GPT-NeoX, GPT-J)
    rotary_fraction: float = 1.0  # rope: rotate the first int(H * fraction) dims of each head, pass the rest
    # Mixture of experts (Mixtral, Qwen3-MoE; zoo.nn.moe): each block's MLP is num_experts SwiGLU experts of
    # width d_ff and a router; each token goes to its experts_per_token most probable experts.
    num_experts: int = 0  # E > 0: a mixture of E experts (mlp=swiglu, no mlp_bias); 0: one dense MLP
    experts_per_token: int = 2  # R (top-k): experts each token is routed to, 1..num_experts
    moe_norm_topk: bool = True  # renormalise the R chosen probabilities to sum 1 (Mixtral; Qwen3-MoE: norm_topk_prob)
    router_aux_loss_coef: float = 0.01  # weight of the load-balancing loss in the training loss (HF: the same name)
    # Gemma 1, 2, 3 (zoo.hf.gemma): norm rmsnorm_plus1 (RMSNorm scaled by 1 + w, on q/k heads too) and mlp geglu
    # (tanh-GELU-gated, 3 matrices) above, and these (Gemma 1: embed_scale only; Gemma 2: all but
    # rope_local_theta, global_every 2; Gemma 3: no soft-capping, global_every 6, rope_local_theta 10000).
    embed_scale: bool = False  # token embeddings times sqrt(d_model), rounded to the compute dtype as HF does
    post_norms: bool = False  # a norm after each sublayer too (post_ln_1, post_ln_2), before the residual add
    query_pre_attn_scalar: int = 0  # > 0: attention logits scaled by 1/sqrt(this); 0: 1/sqrt(head_dim)
    attn_softcap: float = 0.0  # > 0: attention logits cap * tanh(logits / cap) (zoo's einsum attention); 0: off
    final_softcap: float = 0.0  # > 0: output logits cap * tanh(logits / cap), in the fused loss too; 0: off
    global_every: int = 0  # N > 0: layers N-1, 2N-1, ... global, the rest windowed by sliding_window; 0: all alike
    rope_local_theta: float = 0.0  # with global_every: the rope base of the windowed layers; 0: rope_theta
    # The GPT-2 speedrun's parts (KellerJordan/modded-nanogpt; configs/gpt_speedrun.py): mlp relu2, qk_norm and
    # final_softcap above, and these. Off, the model is the same, bit for bit.
    zero_init_proj: bool = False  # each block's attention output and MLP down projections start at zero, so every
    #   block starts as the identity (modded-nanogpt's `proj.weight.zero_()`); off: normal(0.02 / sqrt(2L))
    unet_skips: bool = False  # U-net: block i's output (i < L // 2) is added, times a learned scalar skip_weights[i]
    #   (init 1), to the input of its mirror, block L-1-i (modded-nanogpt); the looped stack only (not scan_layers)
    # Multi-token prediction (DeepSeek-V3; zoo.models.mtp): D more modules, module k predicting the token k + 1
    # places ahead, their cross-entropy added to gpt_lm's training loss times mtp_weight / D. 0: none
    mtp_depth: int = 0
    mtp_weight: float = 0.3  # DeepSeek-V3's lambda (0.3, later 0.1)
    value_embeds: int = 0  # E > 0: E more token tables [V, K*H] (value_embed_0..); table j's row of each token is
    #   mixed into the attention values of layers j and L-E+j, v -> l0 v + l1 row, l learned (init 0.5); the first
    #   and last E layers (modded-nanogpt's value embeddings); 2E <= L, the looped stack only; 0: none

    def __post_init__(self):
        super().__post_init__()
        check_positive(self, "vocab_size", "max_len", "num_layers", "d_model", "num_heads", "d_ff")
        check(self.d_kv >= 0, f"model.d_kv={self.d_kv} must be >= 0 (0: d_model // num_heads)")
        check(self.d_kv > 0 or self.d_model % self.num_heads == 0,
              f"model.d_model={self.d_model} is not divisible by model.num_heads={self.num_heads} (or set model.d_kv)")
        check_choice("positions", self.positions, POSITIONS)
        check_choice("norm", self.norm, NORMS)
        check_choice("mlp", self.mlp, MLPS)
        check_choice("rope_scaling", self.rope_scaling, ROPE_SCALINGS)
        check(self.num_kv_heads >= 0 and (self.num_kv_heads == 0 or self.num_heads % self.num_kv_heads == 0),
              f"model.num_kv_heads={self.num_kv_heads} must divide model.num_heads={self.num_heads} (0: as many)")
        check(self.positions != "rope" or self.head_dim % 2 == 0,
              f"model.positions=rope needs an even head dimension; got {self.head_dim} (model.d_kv, else "
              f"d_model/num_heads)")
        check(self.rope_theta > 0, f"model.rope_theta={self.rope_theta} must be positive")
        check(self.sliding_window >= 0, f"model.sliding_window={self.sliding_window} must be >= 0 (0: off)")
        check(self.num_experts >= 0, f"model.num_experts={self.num_experts} must be >= 0 (0: a dense MLP)")
        check(not self.num_experts or 1 <= self.experts_per_token <= self.num_experts,
              f"model.experts_per_token={self.experts_per_token} must be in 1..model.num_experts={self.num_experts}")
        check(not self.num_experts or (self.mlp == "swiglu" and not self.mlp_bias),
              f"model.num_experts={self.num_experts} needs model.mlp=swiglu and model.mlp_bias=false (experts are "
              f"bias-free SwiGLU); got mlp={self.mlp}, mlp_bias={self.mlp_bias}")
        check(self.router_aux_loss_coef >= 0, f"model.router_aux_loss_coef={self.router_aux_loss_coef} must be >= 0")
        check(0 < self.rotary_fraction <= 1 and (self.positions != "rope" or self.rotary_dim % 2 == 0 and
                                                 self.rotary_dim > 0),
              f"model.rotary_fraction={self.rotary_fraction} must be in (0, 1] and rotate an even, nonzero number "
              f"of each head's {self.head_dim} dims (got {self.rotary_dim})")
        for name in ("query_pre_attn_scalar", "attn_softcap", "final_softcap", "rope_local_theta", "global_every"):
            check(getattr(self, name) >= 0, f"model.{name}={getattr(self, name)} must be >= 0 (0: off)")
        check(not self.global_every or self.sliding_window > 0,
              f"model.global_every={self.global_every} needs model.sliding_window > 0 (the local layers' window)")
        check(self.mtp_depth >= 0 and self.mtp_weight >= 0,
              f"model.mtp_depth={self.mtp_depth} and model.mtp_weight={self.mtp_weight} must be >= 0")
        check(not self.unet_skips or not self.scan_layers,
              "model.unet_skips=true needs model.scan_layers=false (a scan cannot carry the first half's outputs)")
        check(not self.unet_skips or self.num_layers >= 2,
              f"model.unet_skips=true needs model.num_layers >= 2 (got {self.num_layers}): nothing to mirror")
        check(0 <= self.value_embeds and 2 * self.value_embeds <= self.num_layers,
              f"model.value_embeds={self.value_embeds} must be in 0..num_layers/2 (the first and last E layers; "
              f"num_layers={self.num_layers})")
        check(not self.value_embeds or not self.scan_layers,
              "model.value_embeds > 0 needs model.scan_layers=false (the layers without a table differ in kind)")
        check(not self.attn_softcap or self.attention_impl != "cudnn",
              f"model.attn_softcap={self.attn_softcap} cannot run on model.attention_impl=cudnn (cuDNN cannot cap "
              f"logits); use auto, xla or einsum")

    @property
    def head_dim(self) -> int:
        return self.d_kv or self.d_model // self.num_heads

    @property
    def rotary_dim(self) -> int:
        """The dims of each head rope rotates (as transformers: int(head_dim * partial_rotary_factor))."""
        return int(self.head_dim * self.rotary_fraction)

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def gemma_parts(self) -> bool:
        """Whether a Gemma-only switch is on (besides norm and mlp): what other architectures' exports refuse."""
        return bool(self.embed_scale or self.post_norms or self.query_pre_attn_scalar or self.attn_softcap or
                    self.final_softcap or self.global_every or self.rope_local_theta)

    @property
    def layer_local(self) -> tuple | None:
        """With global_every N: whether each layer is local (windowed), all but every Nth (Gemma 2, 3's
        layer_types); None: every layer alike."""
        if not self.global_every:
            return None
        return tuple((i + 1) % self.global_every != 0 for i in range(self.num_layers))

    def rope_local(self) -> Rope | None:
        """The rope of local layers where it differs (rope_local_theta set): that base, unscaled."""
        if self.positions != "rope" or not self.global_every or not self.rope_local_theta:
            return None
        return dataclasses.replace(self.rope(), theta=self.rope_local_theta, scaling="none")

    def rope(self) -> Rope | None:
        if self.positions != "rope":
            return None
        return Rope(self.rotary_dim, self.rope_theta, self.rope_scaling, self.rope_factor, self.rope_low_freq_factor,
                    self.rope_high_freq_factor, self.rope_original_max_len)


GPT_TINY = GptConfig(vocab_size=384, max_len=256, num_layers=4, d_model=128, num_heads=4, d_ff=512, dropout=0.0)
GPT2_SMALL = GptConfig()  # 124,439,808 params, as GPT-2 124M
GPT2_MEDIUM = dataclasses.replace(GPT2_SMALL, num_layers=24, d_model=1024, num_heads=16, d_ff=4096)
GPT2_LARGE = dataclasses.replace(GPT2_SMALL, num_layers=36, d_model=1280, num_heads=20, d_ff=5120)
GPT2_XL = dataclasses.replace(GPT2_SMALL, num_layers=48, d_model=1600, num_heads=25, d_ff=6400)
# Llama-style decoders: rotary positions, RMSNorm, SwiGLU, grouped-query attention, no biases.
_LLAMA = dict(positions="rope", norm="rmsnorm", mlp="swiglu", qkv_bias=False, out_bias=False, mlp_bias=False,
              dropout=0.0)
# A CPU model for the built-in corpus, byte tokens (configs/llama_tiny.py).
LLAMA_TINY = GptConfig(vocab_size=384, max_len=256, num_layers=4, d_model=128, num_heads=4, num_kv_heads=2,
                       d_ff=352, tie_embeddings=False, **_LLAMA)
# SmolLM2-135M: 134,515,008 params.
SMOLLM2_135M = GptConfig(vocab_size=49152, max_len=8192, num_layers=30, d_model=576, num_heads=9, num_kv_heads=3,
                         d_ff=1536, rope_theta=100000.0, **_LLAMA)
# Llama 3.2 1B: 1,235,814,400 params; rope scaled as Llama 3.1/3.2 (factor 32).
LLAMA3_1B = GptConfig(vocab_size=128256, max_len=131072, num_layers=16, d_model=2048, num_heads=32, num_kv_heads=8,
                      d_ff=8192, rope_theta=500000.0, rope_scaling="llama3", rope_factor=32.0, **_LLAMA)
# Qwen2-0.5B: 494,032,768 params; biases on q/k/v only, RMSNorm eps 1e-6.
QWEN2_0_5B = GptConfig(vocab_size=151936, max_len=32768, num_layers=24, d_model=896, num_heads=14, num_kv_heads=2,
                       d_ff=4864, rope_theta=1000000.0, ln_eps=1e-6, **{**_LLAMA, "qkv_bias": True})
# Mistral 7B v0.1: 7,241,732,096 params; untied output, a 4096-token sliding window.
MISTRAL_7B = GptConfig(vocab_size=32000, max_len=32768, num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8,
                       d_ff=14336, sliding_window=4096, tie_embeddings=False, **_LLAMA)
# Qwen3-0.6B: 596,049,920 params; 16 heads of width 128 over d_model 1024, RMSNorm on each q/k head, tied.
QWEN3_0_6B = GptConfig(vocab_size=151936, max_len=40960, num_layers=28, d_model=1024, num_heads=16, num_kv_heads=8,
                       d_kv=128, d_ff=3072, rope_theta=1000000.0, ln_eps=1e-6, qk_norm=True, **_LLAMA)
# Phi-3-mini-4k: 3,821,079,552 params; Llama's decoder (HF fuses qkv and gate|up), a 2047-token window.
PHI3_MINI = GptConfig(vocab_size=32064, max_len=4096, num_layers=32, d_model=3072, num_heads=32, d_ff=8192,
                      sliding_window=2047, tie_embeddings=False, **_LLAMA)
# Pythia-160M (GPT-NeoX): 162,322,944 params; rope on a quarter of each head, parallel residual, erf GELU,
# LayerNorm and biases everywhere, untied output.
PYTHIA_160M = GptConfig(vocab_size=50304, max_len=2048, num_layers=12, d_model=768, num_heads=12, d_ff=3072,
                        dropout=0.0, positions="rope", rotary_fraction=0.25, mlp="gelu_exact", parallel_residual=True,
                        tie_embeddings=False)
# Mixtures of experts (zoo.nn.moe). A CPU model: llama_tiny with 4 experts of half its MLP width, 2 per token,
# so a token's MLP FLOPs are llama_tiny's (configs/moe_tiny.py).
MOE_TINY = dataclasses.replace(LLAMA_TINY, d_ff=176, num_experts=4, experts_per_token=2)
# Mixtral 8x7B v0.1: 46,702,792,704 params, 12,879,925,248 active per token (2 of 8 experts); no window.
MIXTRAL_8X7B = GptConfig(vocab_size=32000, max_len=32768, num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8,
                         d_ff=14336, rope_theta=1000000.0, tie_embeddings=False, num_experts=8, experts_per_token=2,
                         router_aux_loss_coef=0.02, **_LLAMA)
# Qwen3-30B-A3B: 30,532,122,624 params, 3,353,032,704 active (8 of 128 experts of width 768); Qwen3's q/k norms.
QWEN3_30B_A3B = GptConfig(vocab_size=151936, max_len=40960, num_layers=48, d_model=2048, num_heads=32,
                          num_kv_heads=4, d_kv=128, d_ff=768, rope_theta=1000000.0, ln_eps=1e-6, qk_norm=True,
                          tie_embeddings=False, num_experts=128, experts_per_token=8, router_aux_loss_coef=0.001,
                          **_LLAMA)
# Gemma (zoo.hf.gemma): (1 + w) RMSNorm, tanh-GELU-gated MLP, embeddings times sqrt(D), tied, no biases.
_GEMMA = dict(positions="rope", norm="rmsnorm_plus1", mlp="geglu", qkv_bias=False, out_bias=False, mlp_bias=False,
              embed_scale=True, ln_eps=1e-6, dropout=0.0)
# Gemma 2 2B: 2,614,341,888 params; sandwich norms, soft-capped attention (50) and output (30), every other
# layer local with a 4096-token window, attention scale 1/sqrt(256).
GEMMA2_2B = GptConfig(vocab_size=256000, max_len=8192, num_layers=26, d_model=2304, num_heads=8, num_kv_heads=4,
                      d_kv=256, d_ff=9216, post_norms=True, query_pre_attn_scalar=256, attn_softcap=50.0,
                      final_softcap=30.0, sliding_window=4096, global_every=2, **_GEMMA)
# Gemma 3 1B: 999,885,952 params; (1 + w) q/k norms, 5 local layers (512-token window, rope base 10^4) to each
# global one (base 10^6), no soft-capping.
GEMMA3_1B = GptConfig(vocab_size=262144, max_len=32768, num_layers=26, d_model=1152, num_heads=4, num_kv_heads=1,
                      d_kv=256, d_ff=6912, rope_theta=1e6, rope_local_theta=1e4, post_norms=True, qk_norm=True,
                      query_pre_attn_scalar=256, sliding_window=512, global_every=6, **_GEMMA)
# The GPT-2 speedrun's architecture (modded-nanogpt; configs/gpt_speedrun.py): GPT-2 124M's depth and width with
# 6 heads of 128, rope, RMSNorm, QK-norm, a relu2 MLP, no biases, an untied head (the vocabulary padded to
# 50304), zero-initialised projections, U-net skips, value embeddings on the first and last quarter of the layers
# and output logits capped at 15. Not here: the speedrun's attention windows and its zero-initialised head.
_SPEEDRUN = dict(positions="rope", norm="rmsnorm", mlp="relu2", qkv_bias=False, out_bias=False, mlp_bias=False,
                 tie_embeddings=False, qk_norm=True, zero_init_proj=True, unet_skips=True, final_softcap=15.0,
                 dropout=0.0)
GPT_SPEEDRUN = GptConfig(vocab_size=50304, max_len=1024, num_layers=12, d_model=768, num_heads=6, d_ff=3072,
                         value_embeds=3, **_SPEEDRUN)
# gpt_tiny's shape: a CPU model (configs/gpt_speedrun_tiny.py).
GPT_SPEEDRUN_TINY = GptConfig(vocab_size=384, max_len=256, num_layers=4, d_model=128, num_heads=4, d_ff=512,
                              value_embeds=1, **_SPEEDRUN)
PRESETS = {"gpt_tiny": GPT_TINY, "gpt2_small": GPT2_SMALL, "gpt2_medium": GPT2_MEDIUM,
           "gpt2_large": GPT2_LARGE, "gpt2_xl": GPT2_XL, "llama_tiny": LLAMA_TINY, "smollm2_135m": SMOLLM2_135M,
           "llama3_1b": LLAMA3_1B, "qwen2_0_5b": QWEN2_0_5B, "qwen3_0_6b": QWEN3_0_6B,
           "mistral_7b": MISTRAL_7B, "phi3_mini": PHI3_MINI, "pythia_160m": PYTHIA_160M,
           "moe_tiny": MOE_TINY, "mixtral_8x7b": MIXTRAL_8X7B, "qwen3_30b_a3b": QWEN3_30B_A3B,
           "gemma2_2b": GEMMA2_2B, "gemma3_1b": GEMMA3_1B, "gpt_speedrun": GPT_SPEEDRUN,
           "gpt_speedrun_tiny": GPT_SPEEDRUN_TINY}


class Gpt(nn.Module):
    """ids_BT -> logits_BTV (float32). `decode=True` runs incrementally against the "cache" collection;
    `hidden=True` returns the final hidden states x_BTD instead, for a fused loss (zoo.nn.losses) that
    applies the output projection (`output_embedding(params)`) itself. Packed rows (several examples per
    row) pass `segment_ids_BT` (1, 2, ... per example, 0 on padding), so attention stays within each
    example, and `positions_BT`, which restart at 0 at each example (learned and rotary positions alike).
    Decoding a left-padded batch passes `positions_BT` alone: each row's first real token at position 0, the
    padding before it at negative positions; each token is cached at the slot of its position, padding
    nowhere, so no query sees it (zoo.infer.sample.generate_batch). `logits_at_B` ([B] int32) computes the logits
    of one position per row, [B, 1, V] (a prefill needs its last token's: the output projection of the rest is a
    fifth of a short prompt's FLOPs on SmolLM2), as transformers' `logits_to_keep`. With model.mtp_depth, `hidden=True`
    and `mtp_ids_BT` (the tokens one place ahead: the targets) it returns (x_BTD, the multi-token prediction modules'
    hidden states: zoo.models.mtp)."""

    cfg: GptConfig

    @nn.compact
    def __call__(self, ids_BT, *, deterministic: bool = True, decode: bool = False, hidden: bool = False,
                 positions_BT=None, segment_ids_BT=None, logits_at_B=None, mtp_ids_BT=None):
        cfg = self.cfg
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        T = ids_BT.shape[1]
        wte = layers.Embed(cfg.vocab_size, cfg.d_model, dtype=dtype, param_dtype=param_dtype, name="wte")
        positions_T = jnp.arange(T)
        if decode:  # absolute position of this chunk = tokens already in the cache
            index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
            if self.is_initializing():
                positions_T = jnp.arange(T)
            else:
                positions_T = index.value + jnp.arange(T)
                index.value = index.value + T
        positions = positions_T if positions_BT is None else positions_BT  # [T], or [B, T] for packed rows
        x_BTD = wte(ids_BT)
        if cfg.embed_scale:  # Gemma: sqrt(D) in the compute dtype (bfloat16: sqrt(2304) = 48, sqrt(1152) -> 34)
            x_BTD = x_BTD * jnp.asarray(cfg.d_model ** 0.5, dtype)
        if cfg.positions == "learned":
            wpe_PD = self.param("wpe", layers.normal(0.01, (None, "embed")), (cfg.max_len, cfg.d_model), param_dtype)
            # max 0: left padding's negative positions (decoding a batch) take row 0; nothing attends them
            pos_xD = jnp.take(wpe_PD, jnp.maximum(positions, 0), axis=0).astype(dtype)
            x_BTD = x_BTD + (pos_xD if positions.ndim == 2 else pos_xD[None])
        x_BTD = nn.Dropout(cfg.dropout)(x_BTD, deterministic=deterministic)
        x_BTD = layers.constrain(x_BTD, ("batch", "length", "embed"))
        block_kw = dict(
            num_heads=cfg.num_heads, head_dim=cfg.head_dim, d_ff=cfg.d_ff, dropout=cfg.dropout, ln_eps=cfg.ln_eps,
            pre_ln=True, norm_names=("ln_1", "ln_2"), activation=MLP_ACTIVATIONS.get(cfg.mlp, nn.silu),
            # zero_init_proj: normal(0) draws the same keys as normal(std), so every other parameter is unchanged
            out_std=0.0 if cfg.zero_init_proj else residual_std(cfg.num_layers), dtype=dtype, param_dtype=param_dtype,
            implementation=cfg.attention_impl, norm=cfg.norm, gated=cfg.mlp in GATED_MLPS,
            num_kv_heads=cfg.kv_heads, qkv_bias=cfg.qkv_bias, out_bias=cfg.out_bias, mlp_bias=cfg.mlp_bias,
            rope=cfg.rope(), sliding_window=cfg.sliding_window, qk_norm=cfg.qk_norm,
            parallel_residual=cfg.parallel_residual, num_experts=cfg.num_experts,
            experts_per_token=cfg.experts_per_token, moe_norm_topk=cfg.moe_norm_topk, **gemma_block_kw(cfg))
        blocks = stack_blocks(Block, cfg.num_layers, scan=cfg.scan_layers, remat=cfg.remat,
                              remat_policy=cfg.remat_policy, name="h", **block_kw)
        skips = {}
        if cfg.unet_skips:  # float32 scalars, one per mirrored pair; 1: the encoder half's output added as it is
            skips["skip_weights"] = self.param("skip_weights", layers.ones((None,)), (cfg.num_layers // 2,),
                                               param_dtype)
        if cfg.value_embeds:
            skips["layer_kw"] = self._value_embed_kw(ids_BT)
        # mask None + is_causal: the attention backend builds the causal mask (cheapest on cuDNN).
        x_BTD = blocks(x_BTD, None, deterministic, decode, positions, segment_ids_BT, **skips)
        h_BTD = x_BTD
        x_BTD = layers.make_norm(cfg.norm)(cfg.ln_eps, dtype, param_dtype, name="ln_f")(x_BTD)
        if cfg.mtp_depth and (mtp_ids_BT is not None or self.is_initializing()):  # zoo.models.mtp's modules
            ahead = mtp_ids_BT if mtp_ids_BT is not None else ids_BT
            hs = mtp.run(self, h_BTD, ahead, wte, block_kw, deterministic, positions, segment_ids_BT)
            if hidden and mtp_ids_BT is not None:
                return x_BTD, hs
        if hidden:
            return x_BTD
        if logits_at_B is not None:  # one position per row (a prefill's last token): its logits alone, [B, 1, V]
            x_BTD = jnp.take_along_axis(x_BTD, logits_at_B[:, None, None], axis=1)
        head = wte if cfg.tie_embeddings else layers.Embed(cfg.vocab_size, cfg.d_model, dtype=dtype,
                                                           param_dtype=param_dtype, name="lm_head")
        return layers.softcap(head.attend(x_BTD, decode=decode), cfg.final_softcap)

    def _value_embed_kw(self, ids_BT) -> list:
        """Each layer's block keywords: {value_embed_BTKH} for the first and last E layers (table j: layers j and
        L-E+j), None between. Tables N(0, 1), as modded-nanogpt's nn.Embedding: the scale of the values."""
        cfg, dtype = self.cfg, jnp.dtype(self.cfg.dtype)
        K, H, E, L = cfg.kv_heads, cfg.head_dim, cfg.value_embeds, cfg.num_layers
        rows = [layers.Embed(cfg.vocab_size, K * H, std=1.0, dtype=dtype, param_dtype=jnp.dtype(cfg.param_dtype),
                             name=f"value_embed_{j}")(ids_BT) for j in range(E)]
        rows = [{"value_embed_BTKH": r_BTx.reshape(*ids_BT.shape, K, H)} for r_BTx in rows]  # [B, T, K*H] -> KH
        return rows + [None] * (L - 2 * E) + rows


def gemma_block_kw(cfg: GptConfig) -> dict:
    """stack_blocks' arguments for Gemma's switches (none unless set: the other decoders' blocks unchanged)."""
    kw = {}
    if cfg.post_norms:
        kw["post_norms"] = True
    if cfg.query_pre_attn_scalar:
        kw["attn_scale"] = cfg.query_pre_attn_scalar ** -0.5
    if cfg.attn_softcap:
        kw["attn_softcap"] = cfg.attn_softcap
    if cfg.global_every:  # local and global layers: per layer (a scanned stack passes them as traced flags)
        kw.update(per_layer={"local": cfg.layer_local}, rope_local=cfg.rope_local())
    return kw


def output_embedding(cfg: GptConfig, params):
    """w_VD of the output projection: the token embedding when tied, else `lm_head`."""
    return params["wte" if cfg.tie_embeddings else "lm_head"]["embedding"]
