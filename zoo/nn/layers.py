"""Building blocks that two or more model families share: initializers, Einsum, Embed, norms, MLPs, sublayers.

Dimension key (used in every einsum string and shape suffix in zoo):
  B batch          T query length      S key/source length
  D model width    F MLP hidden width  N query heads    K key/value heads    H head dim
  V vocabulary     L layers            C classes

Kernels keep their natural axes (`[D, N, H]`) and are applied with letter einsums. Every parameter
carries logical axis names (`batch, length, embed, mlp, heads, kv, vocab`, and `layers` for scanned
stacks); `zoo.training.sharding` maps them to mesh axes. Nothing here knows which family uses it.
"""

from __future__ import annotations

import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.nn import quant

Dtype = jnp.dtype


DATA_AXES = ("data", "fsdp", "expert")  # the mesh axes a batch is split over (zoo.training.sharding's rules)


def target_platform() -> str:
    """The platform the program being traced is for: the devices of the mesh it is traced under (jax.set_mesh),
    which may differ from jax's default backend (a TPU topology compiled from a CPU host); else the default."""
    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    return device.platform if device is not None else jax.default_backend()


def einsum_f32(eq: str, *xs):
    """einsum with a float32 result whatever the operands' dtype (logits, scores, loss gradients). XLA:CPU
    has no bfloat16 x bfloat16 -> float32 dot, so on CPU the operands are upcast first (the same numbers)."""
    if target_platform() == "cpu":
        xs = tuple(x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x for x in xs)
    return jnp.einsum(eq, *xs, preferred_element_type=jnp.float32)


def split_eqn(eqn: str) -> tuple[str, str, str]:
    """`BTD,DF->BTF` -> ("BTD", "DF", "BTF"): the input's, the weight's and the output's letters."""
    inputs, out = eqn.split("->")
    x, w = inputs.split(",")
    return x, w, out


def dense(eqn: str, x, w):
    """jnp.einsum(eqn, x, w) for a layer's einsum; where x's contracted axes trail it, w's lead, and the output
    is x's other axes then w's (`BTD,DF->BTF`, `BTD,DNH->BTNH`, `BTNH,NHD->BTD`), as one 2-D matmul over x's
    leading axes flattened ([B*T, D] @ [D, F]). The same numbers; the reason is the gradient: the weight's
    gradient of the einsum contracts two axes (B and T), and XLA:CPU then copied the output gradient into a
    transposed [F, B*T] layout before the dot (llama_train's four [704, 2048] SwiGLU gradients, 8% of a step);
    over one flattened axis the gradient's dot reads both operands as they lie (llama_train 1.1x, lora_train
    1.2x on a 2-core CPU). On a GPU the flattening is a bitcast and XLA emits one GEMM either way (not yet
    measured there)."""
    xs, ws, out = split_eqn(eqn)
    n_in = sum(c in xs and c not in out for c in ws)
    lead = xs[:len(xs) - n_in]
    if xs != lead + ws[:n_in] or out != lead + ws[n_in:] or len(lead) < 2:
        return jnp.einsum(eqn, x, w)
    k = math.prod(w.shape[:n_in])
    y = x.reshape(-1, k) @ w.reshape(k, -1)
    return y.reshape(*x.shape[:len(lead)], *w.shape[n_in:])


DECODE_ROWS = 64  # dense_t's [out, rows] product up to this many rows (zoo.nn.decode_layout)


def dense_t(eqn: str, x, w_t, shape: tuple):
    """dense(eqn, x, w) with the weight stored transposed, `w_t` [out, in] (torch's Linear layout; in and out each
    the kernel `shape`'s axes flattened, zoo.nn.decode_layout): the same numbers up to float rounding. With few rows
    (a decoding step) the product is taken as [out, rows] = w_t x^T, transposed after an optimization barrier so
    that XLA keeps that form: XLA:CPU's matrix product runs a [out, in] weight against a handful of rows at 1.6-2.2x
    the rate of [rows, in] x [in, out] (SmolLM2's [576, 1536] MLP kernel: 0.39 against 0.61 ms at 8 rows, 0.98
    against 2.14 at 32)."""
    xs, ws, out = split_eqn(eqn)
    n_in = sum(c in xs and c not in out for c in ws)
    k = math.prod(shape[:n_in])
    x2 = x.reshape(-1, k)
    w2 = w_t.reshape(-1, k)
    if 2 <= x2.shape[0] <= DECODE_ROWS:
        y = jax.lax.optimization_barrier(jnp.einsum("nk,mk->nm", w2, x2)).T
    else:
        y = jnp.einsum("mk,nk->mn", x2, w2)
    return y.reshape(*x.shape[:x.ndim - n_in], *shape[n_in:])


def fused_t(module: nn.Module, name: str, x_BTD, sizes: tuple) -> list:
    """Sibling projections of one input stored as one [sum(sizes), D] weight by zoo.nn.decode_layout (`{name}_t`,
    with `{name}_bias` where they had biases): one product, then its output [B, T, sum(sizes)] cut into the
    siblings' [B, T, size] in order. A decoding row reads one weight instead of three small ones, which XLA:CPU
    streams at half the memory bandwidth (SmolLM2's [192, 576] key kernel: 0.04 ms, 11 GB/s)."""
    w_t = module.get_variable("params", f"{name}_t").astype(module.dtype)
    y = dense_t("BTD,DF->BTF", x_BTD.astype(module.dtype), w_t, (x_BTD.shape[-1], w_t.shape[-2]))
    if module.has_variable("params", f"{name}_bias"):
        y = y + module.get_variable("params", f"{name}_bias").astype(module.dtype)
    cuts = [sum(sizes[:i]) for i in range(1, len(sizes))]
    return jnp.split(y, cuts, axis=-1)


def simple(eqn: str) -> bool:
    """An einsum dense (and dense_t) take as one 2-D product: x's contracted axes trail it, the weight's lead, and the
    output is x's other axes then the weight's (`BTD,DF->BTF`, `BTD,DNH->BTNH`, `BTNH,NHD->BTD`)."""
    xs, ws, out = split_eqn(eqn)
    n_in = sum(c in xs and c not in out for c in ws)
    lead = xs[:len(xs) - n_in]
    return xs == lead + ws[:n_in] and out == lead + ws[n_in:] and len(lead) >= 1


def normal(std: float, axes: tuple) -> Callable:
    """Normal(0, std) initializer tagged with logical axis names."""
    return nn.with_logical_partitioning(nn.initializers.normal(std), axes)


def zeros(axes: tuple) -> Callable:
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def ones(axes: tuple) -> Callable:
    return nn.with_logical_partitioning(nn.initializers.ones_init(), axes)


def constrain(x, axes: tuple):
    """Activation sharding hint at a block boundary (a no-op outside a mesh context)."""
    return nn.with_logical_constraint(x, axes)


class Einsum(nn.Module):
    """A weight of a given shape applied by one einsum; optional bias over the output's trailing axes. The
    one dense layer every family calls: LoRA adapters attach to it (zoo.nn.lora), and a quantized frozen
    kernel (`qkernel`, zoo.nn.quant) stands in for `kernel` where the params hold one."""

    shape: tuple
    axes: tuple  # logical names of the weight's axes
    eqn: str
    std: float = 0.02
    bias_axes: tuple | None = None  # logical names of the bias (the output's trailing axes); None: no bias
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        if self.has_variable("params", "qkernel"):  # a frozen base held quantized (QLoRA, zoo.nn.quant)
            y = quant.einsum(self.eqn, x.astype(self.dtype), self.get_variable("params", "qkernel"),
                             tuple(self.shape), jnp.dtype(self.dtype))
        elif self.has_variable("params", "kernel_t"):  # the kernel stored [out, in] for decoding (decode_layout)
            y = dense_t(self.eqn, x.astype(self.dtype), self.get_variable("params", "kernel_t").astype(self.dtype),
                        tuple(self.shape))
        else:
            w = self.param("kernel", normal(self.std, self.axes), self.shape, self.param_dtype)
            y = dense(self.eqn, x.astype(self.dtype), w.astype(self.dtype))
        if self.bias_axes is not None:
            bias_shape = self.shape[-len(self.bias_axes):]
            b = self.param("bias", zeros(self.bias_axes), bias_shape, self.param_dtype)
            y = y + b.astype(self.dtype)
        return y


class Embed(nn.Module):
    """Token embedding [V, D]; `attend` reuses it as the tied output projection."""

    vocab_size: int
    features: int
    std: float = 0.02
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    def setup(self):
        self.embedding = self.param("embedding", normal(self.std, ("vocab", "embed")),
                                    (self.vocab_size, self.features), self.param_dtype)

    def __call__(self, ids_BT):
        return jnp.take(self.embedding, ids_BT, axis=0).astype(self.dtype)

    def attend(self, x_BTD, decode: bool = False):
        """Logits in float32 whatever the compute dtype: softmax and loss need the range. A decoding step's few
        rows on a CPU (`decode`) take the product as [V, rows], as dense_t does: the [V, D] table is already
        [out, in] (SmolLM2's 49,152 x 576 head at 8 rows: 12-17 against 20-23 ms)."""
        x_BTD, w_VD = x_BTD.astype(self.dtype), self.embedding.astype(self.dtype)
        B, T, D = x_BTD.shape
        if decode and 2 <= B * T <= DECODE_ROWS and target_platform() == "cpu":
            y_VM = jax.lax.optimization_barrier(einsum_f32("VD,MD->VM", w_VD, x_BTD.reshape(B * T, D)))
            return y_VM.T.reshape(B, T, -1)
        return einsum_f32("BTD,VD->BTV", x_BTD, w_VD)


def layer_norm(eps: float, dtype, param_dtype, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=eps, dtype=dtype, param_dtype=param_dtype, name=name,
                        scale_init=ones(("embed",)), bias_init=zeros(("embed",)))


def rms_norm(eps: float, dtype, param_dtype, name: str, axis: str = "embed") -> nn.RMSNorm:
    """Scale-only norm without mean subtraction or bias (T5), over the last axis (logical name `axis`)."""
    return nn.RMSNorm(epsilon=eps, dtype=dtype, param_dtype=param_dtype, name=name, scale_init=ones((axis,)))


class RmsNormPlus1(nn.Module):
    """RMSNorm scaled by (1 + w), w initialised to zeros (Gemma): normalised and scaled in float32, then cast
    to `dtype`, as transformers' GemmaRMSNorm. Its weight is `scale`, as nn.RMSNorm's."""

    epsilon: float = 1e-6
    axis: str = "embed"  # the logical name of the normalised (last) axis
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        w = self.param("scale", zeros((self.axis,)), (x.shape[-1],), self.param_dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), -1, keepdims=True) + self.epsilon)
        return (y * (1.0 + w.astype(jnp.float32))).astype(self.dtype)


def rms_norm_plus1(eps: float, dtype, param_dtype, name: str, axis: str = "embed") -> RmsNormPlus1:
    """`rms_norm`'s (1 + w) variant (Gemma 1, 2, 3), same signature."""
    return RmsNormPlus1(epsilon=eps, axis=axis, dtype=dtype, param_dtype=param_dtype, name=name)


def make_norm(kind: str) -> Callable:
    """The norm factory (eps, dtype, param_dtype, name) of a config's `norm`: layernorm | rmsnorm |
    rmsnorm_plus1."""
    return {"rmsnorm": rms_norm, "rmsnorm_plus1": rms_norm_plus1}.get(kind, layer_norm)


def softcap(x, cap: float):
    """cap * tanh(x / cap): logits bounded to (-cap, cap) (Gemma 2's attention and output); cap 0: x."""
    return cap * jnp.tanh(x / cap) if cap else x


class Mlp(nn.Module):
    """Two-layer feed-forward: D -> F (activation) -> D."""

    d_ff: int
    activation: Callable = nn.gelu
    out_std: float = 0.02
    use_bias: bool = True
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x_BTD):
        D = x_BTD.shape[-1]
        h_BTF = Einsum((D, self.d_ff), ("embed", "mlp"), "BTD,DF->BTF",
                       bias_axes=("mlp",) if self.use_bias else None,
                       dtype=self.dtype, param_dtype=self.param_dtype, name="fc")(x_BTD)
        h_BTF = constrain(self.activation(h_BTF), ("batch", "length", "mlp"))
        return Einsum((self.d_ff, D), ("mlp", "embed"), "BTF,FD->BTD", std=self.out_std,
                      bias_axes=("embed",) if self.use_bias else None,
                      dtype=self.dtype, param_dtype=self.param_dtype, name="proj")(h_BTF)


class GatedMlp(nn.Module):
    """Gated feed-forward: D -> act(x W_gate) * (x W_fc) -> D. GEGLU (T5 v1.1) with gelu, SwiGLU (Llama)
    with silu; no biases unless `use_bias`."""

    d_ff: int
    activation: Callable = nn.gelu
    out_std: float = 0.02
    use_bias: bool = False
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x_BTD):
        D = x_BTD.shape[-1]
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        up = dict(bias_axes=("mlp",) if self.use_bias else None, **kw)
        gate_BTF = Einsum((D, self.d_ff), ("embed", "mlp"), "BTD,DF->BTF", name="gate", **up)(x_BTD)
        h_BTF = Einsum((D, self.d_ff), ("embed", "mlp"), "BTD,DF->BTF", name="fc", **up)(x_BTD)
        h_BTF = constrain(self.activation(gate_BTF) * h_BTF, ("batch", "length", "mlp"))
        return Einsum((self.d_ff, D), ("mlp", "embed"), "BTF,FD->BTD", std=self.out_std,
                      bias_axes=("embed",) if self.use_bias else None, name="proj", **kw)(h_BTF)


def gelu_tanh(x):
    """GELU with the tanh approximation, as GPT-2 and BERT's TF checkpoints were trained."""
    return jax.nn.gelu(x, approximate=True)


def gelu_exact(x):
    """Exact GELU, x * Phi(x) with the erf: BERT's and BART's "gelu"."""
    return jax.nn.gelu(x, approximate=False)


def relu_squared(x):
    """relu(x)^2 (Primer; modded-nanogpt's GPT-2 speedrun MLP): as cheap as ReLU, smoother at 0, sparse."""
    return jnp.square(jax.nn.relu(x))


# Activation names as model configs spell them -> functions (GPT-2's "gelu_new" is gelu_tanh).
ACTIVATIONS = {"relu": nn.relu, "gelu": gelu_exact, "gelu_tanh": gelu_tanh, "silu": nn.silu}


def sublayer(x_BTD, f, norm, *, pre_ln: bool, dropout: float, deterministic: bool):
    """One residual sublayer. Pre-LN: x + drop(f(norm(x))); post-LN: norm(x + drop(f(x))).
    `norm` is the (named) norm module, `f` the attention or MLP call."""
    drop = nn.Dropout(dropout)
    if pre_ln:
        return x_BTD + drop(f(norm(x_BTD)), deterministic=deterministic)
    return norm(x_BTD + drop(f(x_BTD), deterministic=deterministic))


def first_argmax(x_BV):
    """jnp.argmax(x_BV, -1) (the first of equal maxima) as a maximum and a minimum over the indices holding it, int32:
    XLA:CPU runs jnp.argmax's paired (value, index) reduction scalar by scalar, these two vectorised (a greedy
    decoding step's [32, 49152] logits: 1.9 against 3.6 ms on the 2-core CPU, [1, 49152] 0.10 against 0.24 ms).
    A row holding NaN, which no maximum equals, gives its last index."""
    V = x_BV.shape[-1]
    max_B1 = jnp.max(x_BV, -1, keepdims=True)
    first_B = jnp.min(jnp.where(x_BV == max_B1, jnp.arange(V, dtype=jnp.int32), V), -1)
    return jnp.minimum(first_B, V - 1)
