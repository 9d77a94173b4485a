"""A zoo LoRA run out as a Hugging Face PEFT adapter (the layout, the fused modules and the refusals: zoo.hf.peft,
which also reads adapters back in):

    to_peft(run_dir, out_dir)  a zoo LoRA run -> adapter_config.json + adapter_model.safetensors + tokenizer files

The folder holds what PEFT's convention puts beside an adapter (peft's save_pretrained writes the adapter alone;
TRL's SFTTrainer saves the tokenizer beside it): the run's tokenizer files, so `AutoTokenizer.from_pretrained(OUT)`
gives zoo's ids (its tokenizer directory's files, else files written for bytes / tiktoken as `to-hf` writes them),
and the chat template a chat run trained with.

adapter_config.json's base_model_name_or_path names a Hugging Face directory of the base, written at most once:
the checkpoint the base was converted from (origin.json: a directory that is still there, or a hub id); for a base
zoo converted from elsewhere (a GGUF file), its transformers export kept inside it (BASE_RUN/hf), written by the
first adapter that needs it and named by every later one; for a base zoo trained (or a base directory zoo cannot
write in), the base exported beside the adapter (OUT/base), so the folder opens alone.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil

import jax
import numpy as np
from flax import traverse_util

from zoo.errors import ConversionError
from zoo.hf import convert, peft, table
from zoo.hf.peft import CONFIG, PREFIX, WEIGHTS
from zoo.nn import lora

# PEFT's task types (null: the plain PeftModel, which runs any head): bert_mlm has none, and bert_cls's SEQ_CLS would
# take the classifier whole (modules_to_save) where zoo's adapters may target it.
TASK_TYPES = {"gpt_lm": "CAUSAL_LM", "sft": "CAUSAL_LM", "dpo": "CAUSAL_LM", "seq2seq": "SEQ_2_SEQ_LM",
              "bert_encoder": "FEATURE_EXTRACTION"}
BASE_DIR = "base"  # beside an adapter whose base has no Hugging Face directory zoo may keep: the base, exported
KEPT_DIR = "hf"  # inside a base zoo converted (from a GGUF file): its transformers export, written once
_flat = functools.partial(traverse_util.flatten_dict, sep="/")  # param trees <-> "/"-paths
_unflat = functools.partial(traverse_util.unflatten_dict, sep="/")


def to_peft(run_dir: str, out_dir: str, *, verbose: bool = True, cache: dict | None = None) -> dict:
    """Write the adapters (and other trained params, as modules_to_save) of LoRA run `run_dir` as a PEFT adapter
    for its base (init_from). Everything is checked before anything is written. `cache`, a dict the caller keeps
    (Pretrained.save keeps one on the model), holds what the run's steps give, its trained params restored and the
    model's shapes traced (`_adapter`), so a second save while the run has the same steps only writes."""
    from zoo.training import checkpoint
    key = (os.path.abspath(run_dir), tuple(checkpoint.all_steps(run_dir)))
    built = cache.get(key) if cache is not None else None
    if built is None:
        built = _adapter(run_dir)
        if cache is not None:
            cache.clear()
            cache[key] = built
    step, r, ranks, save, adapter, tensors, write_tokenizer, base_run = built
    convert.check_out_dir(out_dir)
    adapter = dict(adapter)
    adapter["base_model_name_or_path"], how = _base_for_transformers(base_run, out_dir)
    files = _write(out_dir, adapter, tensors, write_tokenizer)
    if verbose:
        saved = f"; modules_to_save: {', '.join(adapter['modules_to_save'])}" if save else ""
        print(f"wrote {out_dir}: {', '.join(files)} (PEFT LoRA r={r} on {len(ranks)} layers{saved}; "
              f"{convert.count(tensors):,} params of {run_dir}, step {step}) for the base {how}; load it with "
              f"peft.AutoPeftModelForCausalLM.from_pretrained({out_dir!r})")
    return {"config": adapter, "tensors": dict(tensors)}


def _adapter(run_dir: str) -> tuple:
    """What to_peft writes, short of where: (step, rank, HF module -> its rank, the modules_to_save rows,
    adapter_config.json without its base, the tensors, the tokenizer's writer, the base run)."""
    from zoo.training import checkpoint, runs

    def read(step):  # the config and trained params of one step, never one step's under another's config
        c = runs.load_config(run_dir, step)
        return c, runs.load_trained(run_dir, c, step=step)[0]
    step, (cfg, trained) = checkpoint.first_restorable(run_dir, read)
    spec = cfg.model.lora_spec
    if spec is None:
        raise ConversionError(f"{run_dir!r} has no LoRA adapters (model.lora_rank=0); export it without --adapter")
    sites, names, rows, _ = peft.layers(cfg, spec.rank)
    trained, r = _flat(jax.device_get(trained)), spec.rank
    for e in [p.removesuffix("/lora_a") for p in trained if p.endswith("/lora_a") and p[:-6] + "kernel" in trained]:
        node = {k: trained.pop(f"{e}/{k}") for k in ("kernel", *lora.LEAVES)}  # trained whole (a new head): merged
        trained[e + "/kernel"] = np.asarray(lora.adapted_kernel(node, spec))
    tensors, ranks = {}, {}
    for m, s in sites.items():
        parts = [(j, e) for j, e in enumerate(s.einsums) if e + "/lora_a" in trained]
        out = math.prod(s.b[1:])
        big_b = np.zeros((len(s.einsums) * out, len(parts) * r), np.float32)  # block diagonal: part j's rows
        for c, (j, e) in enumerate(parts):
            big_b[j * out:(j + 1) * out, c * r:(c + 1) * r] = np.asarray(trained[e + "/lora_b"]).reshape(r, out).T
        if parts:  # lora_A [k*r, in]: the parts' A [in..., r] flattened and transposed, stacked
            a = [np.asarray(trained[e + "/lora_a"], np.float32).reshape(-1, r).T for _, e in parts]
            tensors[f"{PREFIX}{m}.lora_A.weight"], tensors[f"{PREFIX}{m}.lora_B.weight"] = np.concatenate(a), big_b
            ranks[m] = len(parts) * r
    done = {e for m in ranks for e in sites[m].einsums}
    left = sorted(p.rsplit("/", 1)[0] for p in trained if lora.is_adapter(p) and p.rsplit("/", 1)[0] not in done)
    if left:
        raise ConversionError(f"the adapter of {left[0]} has no Hugging Face layer in "
                              f"{convert.export_converter(cfg.model).ARCHITECTURES[0]}'s key table")
    save = _modules_to_save(trained, rows, names, cfg)
    tensors.update({PREFIX + names[n]: v for n, v in table.to_hf(_unflat(trained), save, cfg.model).items()})
    targets = [".".join(t) for t in peft.suffixes({tuple(m.split(".")) for m in ranks},
                                                  {tuple(m.split(".")) for m in sites})]
    pattern = _rank_pattern(ranks, targets, r)
    adapter = {"peft_type": "LORA", "task_type": TASK_TYPES.get(cfg.task), "r": r, "lora_alpha": spec.alpha,
               "lora_dropout": spec.dropout, "target_modules": targets, "bias": "none", "use_rslora": False,
               "fan_in_fan_out": all(sites[m].conv for m in ranks), "use_dora": False, "init_lora_weights": True,
               "inference_mode": True, "layers_to_transform": None, "layers_pattern": None, "rank_pattern": pattern,
               "alpha_pattern": {t: spec.alpha * k / r for t, k in pattern.items()},
               "modules_to_save": sorted({names[n].rsplit(".", 1)[0] for _, n, _ in save}) or None,
               "base_model_name_or_path": None, "revision": None}
    write_tokenizer = _tokenizer(cfg, run_dir)  # built (and refused) before anything is written
    return step, r, ranks, save, adapter, tensors, write_tokenizer, cfg.init_from


def _base_for_transformers(base_run: str, out_dir: str) -> tuple[str, str]:
    """(adapter_config.json's base_model_name_or_path, how the `wrote` line says it): see the module's docstring."""
    came = convert.origin(base_run)
    if came is not None and came["kind"] == "hf" and (not os.path.isabs(came["source"])  # a hub id
                                                      or os.path.isfile(os.path.join(came["source"], "config.json"))):
        return came["source"], f"{came['source']} (the Hugging Face checkpoint {base_run} was converted from)"
    what = "a model zoo trained" if came is None else \
        f"from {'a GGUF file, ' if came['kind'] == 'gguf' else ''}{came['source']}"
    kept = _kept_export(base_run) if came is not None else None
    if kept is not None:
        return kept, f"{kept} ({base_run}, {what}, exported once inside it for transformers)"
    path = os.path.abspath(os.path.join(out_dir, BASE_DIR))
    convert.to_hf(base_run, path, verbose=False)
    return path, f"{path} ({base_run}, {what}, exported beside the adapter for transformers)"


def _kept_export(base_run: str) -> str | None:
    """BASE_RUN/hf, the transformers export of a base zoo converted (weights-only at step 0: it never changes), written
    the first time (into a temporary directory renamed into place: never half there); None when zoo may not write
    in BASE_RUN."""
    path = os.path.join(os.path.abspath(base_run), KEPT_DIR)
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    if not os.access(os.path.dirname(path), os.W_OK):
        return None
    tmp = f"{path}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        convert.to_hf(base_run, tmp, verbose=False)
        os.rename(tmp, path)
    except OSError:  # another save put its export in place first: theirs serves
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path if os.path.isfile(os.path.join(path, "config.json")) else None


def _tokenizer(cfg, run_dir: str):
    """A function writing the run's tokenizer files and chat template into a directory (returns their names):
    the tokenizer directory's own files, else files built for bytes / tiktoken (built here, so a refusal comes
    before anything is written), else none (ids that do not fit the model, a tokenizer no files hold)."""
    from zoo.data.chat import TEMPLATE_FILE
    from zoo.data.hf_tokenizers import save_dir
    from zoo.data.tokenizers import get_tokenizer
    from zoo.hf import tokenizer_export
    tok, template = os.path.expanduser(cfg.data.tokenizer), os.path.join(run_dir, TEMPLATE_FILE)
    if os.path.isdir(tok):
        def files(out):
            return save_dir(tok, out)
    else:
        try:
            built = tokenizer_export.build(cfg, get_tokenizer(cfg.data.tokenizer))
        except ConversionError:  # a tokenizer of no Hugging Face files: the adapter goes without
            built = None

        def files(out):
            return tokenizer_export.write(out, *built) if built is not None else []

    def write(out):
        names = files(out)
        if os.path.isfile(template):  # the template the run trained with, over its tokenizer's own
            shutil.copyfile(template, os.path.join(out, TEMPLATE_FILE))
            names = [*dict.fromkeys([*names, TEMPLATE_FILE])]
        return names
    return write


def _rank_pattern(ranks: dict, targets: list, r: int) -> dict:
    """rank_pattern: the rank of each target whose modules are not of rank r (fused ones); module by module
    where one target covers modules of different ranks."""
    under = {t: {k for m, k in ranks.items() if peft.hit(m, [t])} for t in targets}
    if any(len(ks) > 1 for ks in under.values()):
        return {m: k for m, k in ranks.items() if k != r}
    return {t: ks.pop() for t, ks in under.items() if ks != {r}}


def _modules_to_save(trained: dict, rows: list, names: dict, cfg) -> list:
    """The rows of the HF modules that trained params (not adapters) fill whole: PEFT saves modules, not tensors."""
    module = {path: names[n].rsplit(".", 1)[0] for path, n, _ in rows}
    extra = [p for p in trained if not lora.is_adapter(p)]
    for p in extra:
        if p not in module:
            raise ConversionError(f"the run trained {p}, which {cfg.model.family}'s Hugging Face key table does not "
                                  f"export; PEFT's modules_to_save cannot hold it")
    save = [row for row in rows if module[row[0]] in {module[p] for p in extra}]
    for path, _, _ in save:
        if path not in trained:
            raise ConversionError(f"the run trained part of Hugging Face module {module[path]} but not {path}; "
                                  f"PEFT's modules_to_save holds whole modules")
    return save


def _write(out_dir: str, adapter: dict, tensors: dict, write_tokenizer) -> list[str]:
    """adapter_config.json, adapter_model.safetensors and the tokenizer's files (`_tokenizer`); returns their names."""
    from safetensors.numpy import save_file
    existed = os.path.isdir(out_dir)  # new or empty (convert.check_out_dir): left as it was on failure
    try:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, CONFIG), "w") as f:
            json.dump(adapter, f, indent=2, sort_keys=True)
        save_file({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
                  os.path.join(out_dir, WEIGHTS), metadata={"format": "pt"})
        return [CONFIG, WEIGHTS, *write_tokenizer(out_dir)]
    except OSError as e:
        shutil.rmtree(out_dir, ignore_errors=True)
        if existed:
            os.makedirs(out_dir, exist_ok=True)
        raise ConversionError(f"cannot write the adapter to {out_dir!r}: {e.strerror or e}") from None
