"""LoRA adapters as Hugging Face PEFT files, both ways (torch-free): the import side here, with what both sides
share (the layers of an architecture as PEFT names them); the export side in zoo.hf.peft_export.

    peft_export.to_peft(run_dir, out_dir)       a zoo LoRA run -> adapter_config.json + adapter_model.safetensors
                                                (+ its tokenizer's files)
    from_peft(adapter_dir, run_dir, base=None)  a PEFT LoRA adapter -> a zoo LoRA run on its base (a zoo run,
                                                or a Hugging Face directory converted into RUN_DIR/base)

Nothing here is a second key table: the layers come from the architecture's own (zoo.hf.table). Each
`.../kernel` row of an Einsum is a `Site`: its HF module is the weight's name less `.weight`, with the
wrapper prefix the converter's export puts on it. A zoo adapter A [in..., r], B [r, out...] is PEFT's
lora_A = A flattened row-major to [in, r], transposed ([r, in]), and lora_B = B flattened to [r, out],
transposed ([out, r]): the row's transform lays the kernel out as a torch Linear [out, in] (fan_in_fan_out
false) or as GPT-2's Conv1D [in, out] (true) with the same row-major flattening, which `_conv` checks on
the transform itself. The scale is PEFT's alpha / r (use_rslora's alpha / sqrt(r) comes in as zoo's
alpha * sqrt(r)); target_modules are the shortest module-name suffixes that pick out the adapted layers.

A fused module (GPT-2's c_attn: query | key | value as slices of one Conv1D's output) cannot hold k separate
rank-r adapters as one rank-r adapter; it travels exactly as one of rank k*r (the A's stacked, B block
diagonal) with rank_pattern k*r and alpha_pattern k*alpha, so PEFT's scale stays alpha / r. Coming in, a
plain rank-r adapter on such a module is k adapters sharing A (also exact). Trained parameters that are
not adapters (a new head, train.trainable) travel whole in modules_to_save (an adapter on such a module is
merged into it: PEFT adapts no module it saves whole) and come back as trained (train.trainable). What
zoo's LoRA lacks (DoRA, layers_to_transform, other ranks or scales per layer, ...) is refused by name; the fields
it reads are checked by kind and range (FIELDS), every tensor for NaN and inf, before anything is written.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import os
import re
import shutil

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

from zoo.errors import ConversionError
from zoo.hf import convert, io, table
from zoo.nn import lora

CONFIG, WEIGHTS, PREFIX = "adapter_config.json", "adapter_model.safetensors", "base_model.model."
HANDLED = {"peft_type", "task_type", "r", "lora_alpha", "lora_dropout", "target_modules", "bias", "use_rslora",
           "modules_to_save", "rank_pattern", "alpha_pattern", "base_model_name_or_path"}
# Fields that change nothing once the adapter is trained (bookkeeping, initialisation, how layers are addressed
# when layers_to_transform is unset, fan_in_fan_out, which PEFT sets from each layer's type on load).
INERT = {"auto_mapping", "peft_version", "revision", "inference_mode", "megatron_core", "qalora_group_size",
         "layers_pattern", "runtime_config", "fan_in_fan_out", "ensure_weight_tying", "loftq_config"}
# init_lora_weights: other schemes (pissa, olora, loftq, corda, eva) change the base weights too.
CHOICES = {"bias": ("none",), "init_lora_weights": (True, False, "gaussian")}
_flat = functools.partial(traverse_util.flatten_dict, sep="/")  # param trees <-> "/"-paths
_unflat = functools.partial(traverse_util.unflatten_dict, sep="/")


def is_adapter_dir(path: str) -> bool:
    """A PEFT adapter directory: adapter_config.json, neither config.json nor zoo checkpoints."""
    return os.path.isfile(os.path.join(path, CONFIG)) and not os.path.exists(os.path.join(path, "config.json")) \
        and not os.path.isdir(os.path.join(path, "checkpoints"))


@dataclasses.dataclass
class Site:
    """One HF module that holds zoo Einsum kernels: einsums[j] is part j of its output axis (one unless fused)."""
    einsums: list  # zoo Einsum paths ("h_0/attn/query"), in part order
    conv: bool  # fan_in_fan_out: the HF weight is [in, out] (GPT-2's Conv1D), else [out, in] (a torch Linear)
    a: tuple  # one part's zoo lora_a shape [in..., r]
    b: tuple  # and lora_b's [r, out...]


def _rows(conv, cfg) -> list:
    # BERT's table depends on the task (its head); the other architectures' on the model alone.
    return conv.key_table(cfg.model, cfg.task) if len(inspect.signature(conv.key_table).parameters) > 1 \
        else conv.key_table(cfg.model)


@functools.lru_cache(maxsize=None)
def _conv(t, shape: tuple, n_in: int, n: int, h: int) -> bool | None:
    """Whether transform `t` (n heads of width h) writes a kernel of `shape` (n_in contracted axes) as [in, out]
    (True) or [out, in] (False), both flattened row-major, or neither (None): tried on a numbered kernel."""
    x = np.arange(math.prod(shape), dtype=np.int32).reshape(shape)
    flat, y = x.reshape(math.prod(shape[:n_in]), -1), t.hf(x, n, h)
    if np.shape(y) == flat.shape[::-1] and np.array_equal(y, flat.T):
        return False
    return True if np.shape(y) == flat.shape and np.array_equal(y, flat) else None


def layers(cfg, rank: int):
    """(HF module -> Site, row name -> full HF name, rows, every zoo Einsum path) of run config `cfg`'s
    architecture; the Sites' shapes are of rank `rank`."""
    from zoo import tasks
    if cfg.model.scan_layers:
        raise ConversionError("the run uses model.scan_layers=True; PEFT adapters address unscanned layers only")
    conv = convert.export_converter(cfg.model)
    shapes = nn.unbox(jax.eval_shape(tasks.plain(cfg).init, jax.random.PRNGKey(0)))
    zero = np.zeros((), np.float32)  # zero-stride stand-ins: the names the export writes, at no memory cost
    full = conv.params_to_hf(jax.tree.map(lambda s: np.broadcast_to(zero, s.shape), shapes), cfg.model)
    rows = _rows(conv, cfg)
    names = {n: next((p + n for p in ("", *conv.PREFIXES) if p + n in full), n) for _, n, _ in rows}
    every = {p.split("/")[-2] for p in _flat(shapes) if p.endswith("/kernel")}  # adapters on every Einsum
    task = tasks.build(dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, lora_rank=rank, lora_targets=",".join(sorted(every)), quantize_base="none")))
    adapted, sites = _flat(nn.unbox(jax.eval_shape(task.init, jax.random.PRNGKey(0)))), {}
    for path, name, t in rows:
        e = path.removesuffix("/kernel")
        if e + "/lora_a" not in adapted or not path.endswith("/kernel"):
            continue
        a, b = adapted[e + "/lora_a"].shape, adapted[e + "/lora_b"].shape
        (j, n), in_out = t.part or (0, 1), _conv(t, (*a[:-1], *b[1:]), len(a) - 1, cfg.model.num_heads,
                                                  cfg.model.head_dim)
        if in_out is None or t.part and not in_out:  # a fused torch Linear would split its input axis
            raise ConversionError(f"{name}: transform {t.name} lays the kernel out neither as [out, in] nor as "
                                  f"[in, out] split along out; PEFT's LoRA cannot hold it")
        sites.setdefault(names[name].removesuffix(".weight"), Site([None] * n, in_out, a, b)).einsums[j] = e
    return sites, names, rows, set(task.seen)


def suffixes(chosen: set, universe: set) -> list:
    """For each path (a tuple) in `chosen`, its shortest trailing piece that ends no path of `universe` outside
    `chosen`: the names (q_proj, query) or path suffixes (attn.c_proj) that pick out exactly `chosen`."""
    out = set()
    for p in chosen:
        k = next(k for k in range(1, len(p) + 1) if all(q in chosen for q in universe if q[-k:] == p[-k:]))
        out.add(p[-k:])
    return sorted(out)


def hit(module: str, targets) -> bool:
    """PEFT's target_modules match: a regex the whole name matches, or a list of names or dotted suffixes."""
    if isinstance(targets, str):
        return re.fullmatch(targets, module) is not None
    return module in targets or any(module.endswith("." + t) for t in targets)


# ---- reading adapter_config.json -------------------------------------------------------------------------
def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive(v) -> bool:
    """A finite number above zero (JSON's true and false are not numbers; Python's json reads NaN and Infinity)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _regex(template: str, v) -> bool:
    """`v` a non-empty string that makes a regular expression of `template` (as hit, _pattern and _targets use it)."""
    try:
        return isinstance(v, str) and bool(v) and re.compile(template.format(v)) is not None
    except re.error:
        return False


# adapter_config.json's fields zoo reads -> (whether a value holds, what holds, as a refusal says it); a field left
# out takes PEFT's default (r 8, lora_alpha 8).
FIELDS = {
    "r": (lambda v: _int(v) and v > 0, "a positive integer (the adapters' rank)"),
    "lora_alpha": (_positive, "a positive number (the adapters' scale is lora_alpha / r)"),
    "lora_dropout": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1,
                     "a number in [0, 1)"),
    "use_rslora": (lambda v: isinstance(v, bool), "true or false"),
    "target_modules": (lambda v: _regex("{}", v) or isinstance(v, list) and bool(v) and
                       all(isinstance(t, str) and t for t in v),
                       "a non-empty list of module names or suffixes, or a regular expression"),
    "modules_to_save": (lambda v: v is None or isinstance(v, list) and
                        all(_regex(r"(^|.*\.){}($|\..*)", t) for t in v), "null or a list of module names"),
    "rank_pattern": (lambda v: v is None or isinstance(v, dict) and all(
        _regex(r"(.*\.)?({})$", k) and _int(x) and x > 0 for k, x in v.items()),
        "null or an object of module-name patterns -> positive integer ranks"),
    "alpha_pattern": (lambda v: v is None or isinstance(v, dict) and all(
        _regex(r"(.*\.)?({})$", k) and _positive(x) for k, x in v.items()),
        "null or an object of module-name patterns -> positive numbers"),
    "base_model_name_or_path": (lambda v: v is None or isinstance(v, str), "null or a path (a string)"),
    "task_type": (lambda v: v is None or isinstance(v, str), "null or a PEFT task type (a string)"),
}


def read_config(adapter_dir: str) -> dict:
    """adapter_config.json, once it describes a LoRA adapter zoo holds exactly (else the field is named)."""
    path = os.path.join(adapter_dir, CONFIG)
    c = io.read_json(path)
    if c.get("peft_type") != "LORA":
        raise ConversionError(f"{path!r} holds a peft_type={c.get('peft_type')!r} adapter; zoo holds LoRA only")
    for k, v in c.items():
        known = v in CHOICES[k] if k in CHOICES else k in HANDLED | INERT or v in (None, False, [], {}, "")
        if not known:  # a feature zoo's LoRA lacks (use_dora, layers_to_transform, exclude_modules, ...) is on
            raise ConversionError(f"{path!r} sets {k}={json.dumps(v)}, which zoo's LoRA does not have")
    if not c.get("target_modules"):
        raise ConversionError(f"{path!r} names no target_modules")
    for k, (ok, valid) in FIELDS.items():
        if k in c and not ok(c[k]):
            raise ConversionError(f"{path!r} sets {k}={json.dumps(c[k])}; {k} must be {valid}")
    return c


def _pattern(patterns: dict | None, module: str, default):
    """PEFT's rank_pattern / alpha_pattern lookup: the first key that ends `module` at a dot."""
    return next((v for k, v in (patterns or {}).items() if re.match(rf"(.*\.)?({k})$", module)), default)


def _targets(c: dict, sites: dict, names: dict, rows: list, got: dict, where: str, arch: str):
    """(the HF modules the adapter adapts, those it saves whole), every tensor of `got` accounted for."""
    universe = sorted({names[n].rsplit(".", 1)[0] for _, n, _ in rows})
    saved = [m for m in universe if any(re.match(rf"(^|.*\.){s}($|\..*)", m) for s in c.get("modules_to_save") or [])]
    chosen = [m for m in universe if m not in saved and hit(m, c["target_modules"])]
    if not chosen:
        raise ConversionError(f"target_modules={json.dumps(c['target_modules'])} matches no layer of the base ({arch}; "
                              f"its layers: {', '.join(sorted({m.rsplit('.', 1)[-1] for m in sites}))}): an adapter "
                              f"for another base?")
    for m in chosen:
        if m not in sites:
            raise ConversionError(f"target_modules={json.dumps(c['target_modules'])} names {m}, which is not a layer "
                                  f"zoo adapts")
    for k in got:
        adapter = ".lora_" in k
        if (k.rsplit(".", 2 if adapter else 1)[0]) not in (chosen if adapter else saved):
            raise ConversionError(f"{where}: {k} fits no layer the adapter config targets in the base ({arch}): "
                                  f"an adapter for another base or head?")
    return chosen, saved


def _adapters(c: dict, m: str, s: Site, got: dict, where: str, scale: float) -> dict:
    """The zoo adapters ("/"-path -> array) of HF module `m`; a fused module's rank-k*r adapter must be block
    diagonal, a rank-r one becomes one adapter per part sharing A."""
    r, rslora, n = s.a[-1], bool(c.get("use_rslora")), len(s.einsums)
    rank = int(_pattern(c.get("rank_pattern"), m, c.get("r", 8)))
    alpha = float(_pattern(c.get("alpha_pattern"), m, c.get("lora_alpha", 8)))
    k = rank // r
    if rank % r or not 1 <= k <= n:
        raise ConversionError(f"rank_pattern gives {m} rank {rank}; zoo's adapters share r={r}"
                              + (f" (this fused layer of {n} parts: {n} x r at most)" if n > 1 else ""))
    if not math.isclose(alpha / (math.sqrt(rank) if rslora else rank), scale):
        raise ConversionError(f"alpha_pattern gives {m} the scale {alpha:g}/{rank}, the other layers "
                              f"{scale * r:g}/{r}; zoo's adapters share one scale")
    a, b = (_tensor(got, f"{m}.lora_{x}.weight", where) for x in "AB")
    for x, t, want in (("A", a, (rank, math.prod(s.a[:-1]))), ("B", b, (n * math.prod(s.b[1:]), rank))):
        if t.shape != want:
            raise ConversionError(f"{where}: {PREFIX}{m}.lora_{x}.weight has shape {t.shape}; the base's {m} needs "
                                  f"{want}: an adapter for another base?")
    nonzero = [[bool(np.any(b.reshape(n, -1, rank)[j][:, q * r:(q + 1) * r])) for j in range(n)] for q in range(k)]
    parts = list(range(n)) if k in (1, n) else [row.index(True) if sum(row) == 1 else -1 for row in nonzero]
    if k > 1 and (parts != sorted(set(parts)) or parts[0] < 0 or
                  any(nonzero[q][j] for q in range(k) for j in range(n) if j != parts[q])):
        raise ConversionError(f"{where}: {m}'s adapter of rank {rank} is not {k} rank-{r} adapters of its parts "
                              f"(its lora_B is not block diagonal)")
    out = {}
    for q, j in enumerate(parts):  # k == 1: every part shares A (n == 1: the one part)
        cols = slice(0, r) if k == 1 else slice(q * r, (q + 1) * r)
        out[s.einsums[j] + "/lora_a"] = a[cols].T.reshape(s.a)
        out[s.einsums[j] + "/lora_b"] = b.reshape(n, -1, rank)[j][:, cols].T.reshape(s.b)
    return out


def _tensor(got: dict, key: str, where: str) -> np.ndarray:
    if key not in got:
        raise ConversionError(f"{where} has no {PREFIX}{key}, which the adapter config's layers need")
    return io.check_finite(np.asarray(got[key], np.float32), PREFIX + key, where)


def _plan(c: dict, tensors: dict, base_cfg, base_run: str, where: str):
    """(the zoo LoRA run's config, its trained params by "/"-path) of adapter config `c` and `tensors` on a base
    of config `base_cfg` at `base_run`; every name and shape checked against the base."""
    from zoo import tasks
    r, alpha = int(c.get("r", 8)), float(c.get("lora_alpha", 8))
    scale = alpha / (math.sqrt(r) if c.get("use_rslora") else r)  # rslora: zoo's alpha is alpha * sqrt(r)
    sites, names, rows, seen = layers(base_cfg, r)
    got = {k.removeprefix(PREFIX): v for k, v in tensors.items()}
    arch = convert.export_converter(base_cfg.model).ARCHITECTURES[0]
    chosen, saved = _targets(c, sites, names, rows, got, where, arch)
    params = {p: x for m in chosen for p, x in _adapters(c, m, sites[m], got, where, scale).items()}
    kept = [row for row in rows if names[row[1]].rsplit(".", 1)[0] in saved]
    keys = io.Keys({n: _tensor(got, names[n], where) for _, n, _ in kept})
    params.update(_flat(table.from_hf(keys, kept, base_cfg.model)))
    adapted = {tuple(p.split("/")[:-1]) for p in params if lora.is_adapter(p)}
    model = dataclasses.replace(base_cfg.model, lora_rank=r, lora_alpha=scale * r, quantize_base="none",
                                lora_dropout=float(c.get("lora_dropout", 0.0)),
                                lora_targets=",".join("/".join(t) for t in suffixes(adapted, seen)))
    trainable = "^(?:" + "|".join(re.escape(p) for p, _, _ in kept) + ")$" if kept else ""
    cfg = dataclasses.replace(base_cfg, model=model, init_from=os.path.abspath(base_run),
                              train=dataclasses.replace(base_cfg.train, trainable=trainable))
    want = _flat(nn.unbox(jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(0))))
    for p, x in params.items():
        if p not in want or tuple(want[p].shape) != x.shape:
            raise ConversionError(f"{where}: modules_to_save gives {p} shape {x.shape}; the base needs "
                                  f"{tuple(want[p].shape) if p in want else 'none'}: an adapter for another base?")
    return cfg, params


def from_peft(adapter_dir: str, run_dir: str, base: str | None = None, *, dry: bool = False,
              verbose: bool = True) -> dict:
    """Convert a PEFT LoRA adapter into a zoo LoRA run on `base` (default: the adapter's base_model_name_or_path
    when it is a local directory): a zoo run as it is, a Hugging Face directory converted into RUN_DIR/base. The
    run is weights-only (checkpoint.save_weights): its params are the adapters (and modules_to_save, trained).
    `dry`: the run's config only, nothing written. Nothing is left behind when the adapter is refused."""
    from zoo import tasks
    from zoo.training import checkpoint, freeze, runs
    c = read_config(adapter_dir)
    src = base or c.get("base_model_name_or_path")
    if not isinstance(src, str) or not os.path.isdir(src):
        raise ConversionError(f"the adapter's base_model_name_or_path={json.dumps(src)} is not a local directory; "
                              f"give the base with --base (a zoo run or a Hugging Face directory)")
    zoo_base = os.path.isdir(os.path.join(src, "checkpoints"))
    if not zoo_base and not os.path.isfile(os.path.join(src, "config.json")):
        raise ConversionError(f"base {src!r} is neither a zoo run nor a Hugging Face directory (no config.json)")
    tensors = io.read_tensors(adapter_dir)
    where = os.path.join(adapter_dir, WEIGHTS)
    for k, v in tensors.items():  # all of them, before the base is converted (_plan uses every one or refuses)
        io.check_finite(np.asarray(v, np.float32), k, tensors.files.get(k, where))
    base_run = src if zoo_base else os.path.join(run_dir, "base")
    if dry:
        base_cfg = runs.load_config(src) if zoo_base else convert.from_pretrained(src)[3]
        return {"config": _plan(c, tensors, base_cfg, base_run, where)[0]}
    if os.path.exists(run_dir):
        raise ConversionError(f"{run_dir!r} exists; an adapter converts into a new run directory")
    try:
        if not zoo_base:
            convert.from_hf(src, base_run, verbose=False)
        cfg, params = _plan(c, tensors, runs.load_config(base_run), base_run, where)
        task = tasks.build(cfg)
        trains = runs.trainable_of(cfg, jax.eval_shape(task.init, jax.random.PRNGKey(0)), task.seen) or ()
        missing = sorted(set(trains) - set(params))
        if missing:
            raise ConversionError(f"the run trains {missing[0]}, which its base lacks and the adapter does not hold "
                                  f"(modules_to_save)")
        checkpoint.save_weights(run_dir, freeze.unflat(params), cfg)
        with open(os.path.join(run_dir, "config.json"), "w") as f:
            f.write(cfg.to_json())
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)  # nothing half-converted stays behind
        raise
    if verbose:
        base_note = f" (converted from {src})" if not zoo_base else ""
        print(f"wrote {run_dir}: a {cfg.task} LoRA run of the PEFT adapter {adapter_dir} (r={cfg.model.lora_rank}, "
              f"lora_targets={cfg.model.lora_targets}; {convert.count(params):,} trained params, step 0) on its "
              f"base {base_run}{base_note}")
    return {"config": cfg, "params": params, "base": base_run}
