"""LoRA / QLoRA memory and speed: zoo's own adapters (zoo.nn.lora, zoo.nn.quant) beside google's qwix, one
train step each on the SmolLM2-135M shape.

  python -m zoo.bench.qlora [--layers N] [--batch B] [--seq-len T] [--steps K]

Variants (rank 16, alpha 32, adapters on query,key,value,out,gate,fc,proj, AdamW on what trains):
  zoo_full        every param trains (the baseline)
  zoo_lora        zoo adapters, float32 base in TrainState.frozen
  zoo_qlora_int8  the frozen adapted kernels as int8 codes, dequantized inside zoo.nn.quant.einsum
  zoo_qlora_nf4   the same as packed NF4 (two codes a byte, a scale per 64 inputs)
  qwix_lora       qwix.LoraProvider without quantization, applied to zoo's own Gpt linen module
  qwix_qlora_nf4  qwix.LoraProvider(weight_qtype="nf4", tile_size=64), base from qwix.quantize_params
  qwix_*+shim     the same with two qwix 0.1.8 defects bypassed (see linen_einsum_shim): as released, qwix
                  stops at zoo's first adapted Einsum, and its row says why

Every variant's state comes from zoo.training.step.state_init (trainable: the adapters) and its step from
make_train_step, jitted with the state donated as the trainer does; a qwix variant is zoo's gpt_lm task whose
model is the qwix-wrapped Gpt, so loss, optimizer and step are the same code. The base is the plain model's
init from one rng everywhere (B starts at zero), so every first loss is the base model's loss.

Per variant: the state's bytes (params + frozen + optimizer state) as jax's nbytes counts them and as XLA holds
them (sub-byte dtypes such as qwix's uint4 are packed by XLA:CPU while nbytes counts a byte per element), the
compiled step's memory_analysis (argument, output, temp: what the step allocates beyond its inputs), the
median step time over K steps after one warm-up, and the first step's loss: a JSON line per variant as it
finishes, then a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
try:  # qwix is not one of zoo's dependencies (pip install qwix): without it, its variants say so
    import qwix
    from qwix._src.providers import lora as qwix_lora
    from qwix._src.providers import ptq as qwix_ptq  # WithAux: how qwix wraps a quantized param
except ImportError:
    qwix = qwix_lora = qwix_ptq = None

from zoo import tasks
from zoo.bench.common import median
from zoo.configuration import Config, DataConfig, TrainConfig
from zoo.models.gpt import SMOLLM2_135M
from zoo.nn import lora
from zoo.training import freeze, optim
from zoo.training.step import make_train_step, state_init

RANK, ALPHA = 16, 32.0
TARGETS = ("query", "key", "value", "out", "gate", "fc", "proj")
QWIX_PATH = ".*/(" + "|".join(TARGETS) + ")"  # fullmatched by qwix against module paths like h_3/attn/query
VARIANTS = ("zoo_full", "zoo_lora", "zoo_qlora_int8", "zoo_qlora_nf4", "qwix_lora", "qwix_qlora_nf4", "qwix_lora+shim",
            "qwix_qlora_nf4+shim")
MB = 2 ** 20


def config(layers: int, batch: int, seq_len: int, rank: int = 0, quantize: str = "none") -> Config:
    model = dataclasses.replace(SMOLLM2_135M, num_layers=layers, lora_rank=rank, lora_alpha=ALPHA,
                                lora_targets=",".join(TARGETS), quantize_base=quantize)
    return Config(task="gpt_lm", model=model, data=DataConfig(seq_len=seq_len),
                  train=TrainConfig(batch_size=batch, steps=1000))


def is_qwix_adapter(path: str) -> bool:
    return path.endswith(("_lora_a", "_lora_b"))


class QwixTask:
    """zoo's gpt_lm task with its Gpt under qwix (Q)LoRA (`qtype` None: a float32 base). init: the plain model's
    params (the same base as zoo's variants), the adapted kernels quantized by qwix.quantize_params, and the
    kernel_lora_a / kernel_lora_b that qwix creates while it runs the model's init."""

    def __init__(self, cfg: Config, qtype: str | None):
        if qwix is None:
            raise ImportError("qwix is not installed: pip install qwix")
        self.plain = tasks.plain(cfg)
        self.inner = tasks.plain(cfg)
        provider = qwix.LoraProvider(module_path=QWIX_PATH, rank=RANK, alpha=ALPHA, weight_qtype=qtype,
                                     tile_size=64 if qtype else None)
        self.inner.model = qwix.apply_lora_to_model(self.inner.model, provider)

    def init(self, rng):
        adapted = self.inner.init(rng)  # as qwix builds it (its quantized random kernels are discarded)
        base = qwix.quantize_params(nn.unbox(self.plain.init(rng)), adapted)
        adapters = {k: v for k, v in freeze.flat(adapted).items() if is_qwix_adapter(k)}
        return freeze.join(freeze.unflat(adapters), base)

    def loss(self, params, batch, rng, train):
        return self.inner.loss(params, batch, rng, train)


def _astype(self, dtype):
    """qwix_ptq.WithAux.astype for a QArray (qwix's own passes the QArray to flax_util.update_boxed, which refuses
    it: ValueError "Unsupported type: QArray"); QArray.astype sets the dtype it dequantizes to."""
    return self.replace(array=self.array.astype(dtype))


@contextlib.contextmanager
def linen_einsum_shim(on: bool):
    """Two qwix 0.1.8 defects that stop it on zoo's Einsum (jnp.einsum(eqn, x, w.astype(dtype)) in a compact
    linen module), bypassed with `on`; qwix's LoRA and quantization math is untouched:
    - LoraProvider.einsum keeps a debugging string on the module (setattr(module, "kernel_lora_einsum_str", ...),
      read nowhere), which linen refuses outside setup: SetAttributeFrozenModuleError at the first adapted einsum.
      The shim lets that one setattr (the only one in qwix's lora.py) bypass linen's freeze.
    - a quantized kernel is a WithAux(QArray), whose astype fails (see _astype): the shim's astype casts the QArray.
    """
    if not on or qwix is None:
        yield
        return
    qwix_lora.setattr = object.__setattr__  # a module global shadows the builtin for qwix's lora.py alone
    astype, qwix_ptq.WithAux.astype = qwix_ptq.WithAux.astype, _astype
    try:
        yield
    finally:
        del qwix_lora.setattr
        qwix_ptq.WithAux.astype = astype


def check_qwix(state, layers: int, qtype: str | None) -> None:
    """qwix intercepted every targeted Einsum (an adapter pair each) and, with `qtype`, holds its kernel as an
    nf4 QArray stored as uint4."""
    trained, frozen = freeze.flat(state.params), freeze.flat(state.frozen)
    for i in range(layers):
        for name in TARGETS:
            path = f"h_{i}/{'attn' if name in ('query', 'key', 'value', 'out') else 'mlp'}/{name}/kernel"
            missing = [s for s in ("_lora_a", "_lora_b") if path + s not in trained]
            assert not missing, f"qwix made no {missing} for {path}; adapters: {sorted(trained)[:4]}..."
            if qtype:
                k = frozen[path]
                assert isinstance(k, qwix_ptq.WithAux) and isinstance(k.array, qwix.QArray), f"{path}: {type(k)}"
                assert k.array.qtype == qtype and k.array.qvalue.dtype == jnp.uint4, \
                    f"{path}: qtype {k.array.qtype}, stored as {k.array.qvalue.dtype}"


def build(variant: str, layers: int, batch: int, seq_len: int):
    """(task, trainable paths or None, boxed abstract params) of a variant."""
    if variant == "zoo_full":
        task = tasks.build(config(layers, batch, seq_len))
        return task, None, jax.eval_shape(task.init, jax.random.PRNGKey(0))
    if variant.startswith("zoo"):
        task = tasks.build(config(layers, batch, seq_len, RANK, variant.rsplit("_", 1)[-1] if "qlora" in variant
                                  else "none"))
        keep = lora.is_adapter
    else:
        task = QwixTask(config(layers, batch, seq_len), "nf4" if "qlora" in variant else None)
        keep = is_qwix_adapter
    abstract = jax.eval_shape(task.init, jax.random.PRNGKey(0))
    return task, frozenset(p for p in freeze.flat(abstract) if keep(p)), abstract


def held_bytes(x) -> int:
    """Bytes XLA allocates for `x`: 4-bit dtypes packed two a byte (jax's nbytes counts a byte each)."""
    return x.size // 2 if x.dtype in (jnp.int4, jnp.uint4) else x.nbytes


def run(variant: str, layers: int, batch: int, seq_len: int, steps: int) -> dict:
    cfg = config(layers, batch, seq_len)
    task, trainable, abstract = build(variant, layers, batch, seq_len)
    quantize = variant.rsplit("_", 1)[-1] if variant.startswith("zoo_qlora") else "none"
    schedule = optim.make_schedule(cfg.optim, cfg.train.steps, cfg.model.d_model)
    tx = optim.make_optimizer(cfg.optim, schedule, optim.decay_mask(freeze.split(abstract, trainable)[0]))
    boxed_init = state_init(task, tx, trainable, quantize, scanned=False)
    state = jax.jit(lambda r: nn.unbox(boxed_init(r)))(jax.random.PRNGKey(0))
    if variant.startswith("qwix"):
        check_qwix(state, layers, "nf4" if "qlora" in variant else None)
    leaves = jax.tree.leaves((state.params, state.frozen, state.opt_state))
    row = {"variant": variant, "layers": layers, "batch": batch, "seq_len": seq_len,
           "trainable_params": sum(x.size for x in jax.tree.leaves(state.params)),
           "state_nbytes": sum(x.nbytes for x in leaves), "state_held_bytes": sum(held_bytes(x) for x in leaves)}
    tokens = jax.random.randint(jax.random.PRNGKey(1), (batch, seq_len + 1), 0, cfg.model.vocab_size, jnp.int32)
    data = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": jnp.ones((batch, seq_len), jnp.float32)}
    t = time.perf_counter()
    step = jax.jit(make_train_step(task, tx, schedule, cfg.train.grad_accum), donate_argnums=0)
    compiled = step.lower(state, data).compile()
    row["compile_s"] = time.perf_counter() - t
    mem = compiled.memory_analysis()
    row.update(argument_bytes=mem.argument_size_in_bytes, output_bytes=mem.output_size_in_bytes,
               alias_bytes=mem.alias_size_in_bytes, temp_bytes=mem.temp_size_in_bytes)
    state, metrics = compiled(state, data)  # warm-up
    row["loss0"] = float(metrics["loss_sum"] / metrics["weight"])
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        state, metrics = jax.block_until_ready(compiled(state, data))
        times.append(time.perf_counter() - t)
    row["step_s"] = median(times)
    row["finite"] = bool(metrics["finite"])
    return row


def table(rows: list[dict]) -> str:
    head = ("| variant | trainable | state MB (nbytes) | state MB (held) | argument MB | output MB | temp MB "
            "| step s | loss0 |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['variant']} | error: {r['error']} |||||||")
            continue
        lines.append(f"| {r['variant']} | {r['trainable_params']:,} | {r['state_nbytes'] / MB:.1f} "
                     f"| {r['state_held_bytes'] / MB:.1f} | {r['argument_bytes'] / MB:.1f} "
                     f"| {r['output_bytes'] / MB:.1f} | {r['temp_bytes'] / MB:.1f} | {r['step_s']:.2f} "
                     f"| {r['loss0']:.4f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=SMOLLM2_135M.num_layers)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=5, help="timed steps after one warm-up")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS))
    a = p.parse_args(argv)
    rows = []
    for v in a.variants.split(","):
        try:
            with linen_einsum_shim(v.endswith("+shim")):
                row = run(v, a.layers, a.batch, a.seq_len, a.steps)
        except Exception as e:  # noqa: BLE001 -- a variant that qwix cannot build is a result: say why
            if not v.startswith("qwix"):
                raise
            row = {"variant": v, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
        print(json.dumps(row), flush=True)
        rows.append(row)
    full = next((r for r in rows if r["variant"] == "zoo_full" and "loss0" in r), None)
    print(f"\nSmolLM2-135M shape, {a.layers} layers, B={a.batch}, T={a.seq_len}, float32, "
          f"{jax.devices()[0].platform}, median of {a.steps} steps\n")
    print(table(rows))
    if full:
        for r in rows:
            if "loss0" in r:
                assert abs(r["loss0"] / full["loss0"] - 1) < 0.05, \
                    f"{r['variant']}: first loss {r['loss0']} against float32's {full['loss0']}"


if __name__ == "__main__":
    main()
