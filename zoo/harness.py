"""EleutherAI's lm-evaluation-harness on zoo's own forward pass: the model `zoo` of

    zoo-lm-eval --model_args run=RUN --tasks hellaswag,arc_easy --batch_size 16
    lm_eval --model zoo ...        # only in a process that imported zoo.harness first

RUN is a zoo run directory or a Hugging Face checkpoint directory (converted in memory, as zoo-eval loads
it). Importing this module registers the model with the harness (`@register_model("zoo")`); the harness
finds its own models through a fixed table, not through entry points, so a plain `lm_eval` process does not
see it: zoo.cli.lm_eval is lm_eval's own command line after that import.

The requests are scored as the harness's `hf` model scores them, on zoo's pieces:
- loglikelihood: the harness's own context/continuation split (TemplateLM), each row cut on the left to
  max_length + 1 tokens; batched, sorted by length and padded to power-of-two buckets (zoo.eval.loglik),
  with the fused output projection (no [B, T, V] logits) giving the sum and whether every token is greedy;
- loglikelihood_rolling: the harness's disjoint windows of max_length tokens; with `stride=N`, zoo-eval's
  sliding window instead (zoo.eval.perplexity: each token after the first window sees more context);
- generate_until: left-padded batched decoding with the KV cache (zoo.infer.sample.generate_batch), the
  context cut on the left to max_length - max_gen_toks, the text cut at the first `until` string.
Any number of requests compiles a handful of shapes: rows and length in powers of two.

model_args: run (required), batch_size (default 8), max_length (default: the run's context), max_gen_toks
(default 256), stride (default: the harness's windows), add_bos_token (default: as the `hf` model's default, what
transformers' `tokenizer(text)` puts first, the checkpoint's BOS where its tokenizer adds one; true puts the prefix
token first, false nothing, as the harness's flag of that name), seed (sampling).
"""

from __future__ import annotations

import functools
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
# lm_eval.models (imported with its utils) registers the harness's own models first: get_model() fills its table
# only while the registry is empty, so zoo registered into an empty one would hide `hf` and the rest.
from lm_eval.models.utils import Collator, handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm import tqdm

from zoo.configuration import from_dict as config_from_dict
from zoo.data.tokenizers import encode_text
from zoo.errors import ConfigError, FamilyError, ZooDataError
from zoo.eval.loglik import Row, pad_batch, prefix_token
from zoo.eval.perplexity import document_rows
from zoo.infer.encoder import batches, bucket
from zoo.models import FAMILIES
from zoo.models.gpt import output_embedding
from zoo.nn.losses import linear_cross_entropy

MODEL_ARGS = ("run", "batch_size", "max_length", "max_gen_toks", "stride", "add_bos_token", "seed")
# What the harness itself passes every model (the device is jax's; there is no remote code to trust).
HARNESS_ARGS = ("device", "max_batch_size", "trust_remote_code")


@functools.partial(jax.jit, static_argnames=("model",))
def _row_scores(params, inputs_BT, targets_BT, weights_BT, *, model):
    """(float32[B] each row's summed log-likelihood of its weighted targets, float32[B] how many of them are
    their position's argmax)."""
    h_BTD = model.apply({"params": params}, inputs_BT, hidden=True)
    w_VD = output_embedding(model.cfg, params)

    def one(h_TD, t_T, w_T):  # the fused loss sums over its batch; one row at a time keeps the rows apart
        loss, correct = linear_cross_entropy(h_TD[None], w_VD, t_T[None], w_T[None], logit_cap=model.cfg.final_softcap)
        return -loss, correct
    return jax.vmap(one)(h_BTD, targets_BT, weights_BT)


def check_model_args(args: dict, batch_size=None) -> str:
    """The run directory of `args` (model_args), every value checked and the run's family and context read off its
    config.json, before anything loads: zoo-lm-eval calls this before the harness indexes its tasks and loads the
    run, so a typo costs no wait. `batch_size`: the harness's own --batch_size flag, where given."""
    unknown = sorted(k for k in args if k not in MODEL_ARGS + HARNESS_ARGS)
    if unknown:
        raise ConfigError(f"unknown model_args key {unknown[0]!r} for --model zoo; valid keys: {', '.join(MODEL_ARGS)}")
    run = check_run(args.get("run"))
    if batch_size is not None and args.get("batch_size") is not None:
        raise ConfigError(f"batch_size is given twice (model_args batch_size={args['batch_size']!r} and --batch_size "
                          f"{batch_size}); give one")
    if batch_size is not None and not re.fullmatch(r"auto(:\d+)?|[1-9]\d*", str(batch_size)):
        raise ConfigError(f"--batch_size {batch_size!r}: give a whole number >= 1, auto or auto:N")
    _batch_size(args.get("batch_size"))
    max_length, stride = (_positive(k, args.get(k), None) for k in ("max_length", "stride"))
    _positive("max_gen_toks", args.get("max_gen_toks"), None)
    _bos_flag(args.get("add_bos_token"))
    _whole("seed", args.get("seed", 0))
    family, context = _run_facts(run)
    if family is not None and family != "gpt":
        raise FamilyError(f"--model zoo scores GPT-family runs; {run} is a {family} run (zoo-eval scores the others)")
    context = max_length if context is None else min(max_length or context, context)
    if stride is not None and context is not None and stride > context:
        raise ConfigError(f"model_args stride={stride} must be at most max_length ({context})")
    return run


def check_run(run) -> str:
    if not run:
        raise ConfigError("model_args needs run=RUN: a zoo run directory or a Hugging Face checkpoint directory")
    run = os.path.expanduser(str(run))
    if not (os.path.isdir(os.path.join(run, "checkpoints")) or os.path.isfile(os.path.join(run, "config.json"))):
        raise ZooDataError(f"run={run!r} is neither a zoo run (no checkpoints/) nor a Hugging Face checkpoint "
                           f"directory (no config.json)")
    return run


def _run_facts(run: str) -> tuple[str | None, int | None]:
    """(family, the longest window its weights know) of `run`, read off its config.json alone; None where the file
    does not say (a Hugging Face directory's window) or does not read (the load names what is wrong)."""
    try:
        with open(os.path.join(run, "config.json"), encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None, None
    if not isinstance(d, dict):
        return None, None
    if not os.path.isdir(os.path.join(run, "checkpoints")):  # a Hugging Face directory: the family by model_type
        return next((f for f, fam in FAMILIES.items() if d.get("model_type") in fam.hf), None), None
    try:
        cfg = config_from_dict(d)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None, None
    return cfg.model.family, min(cfg.window, getattr(cfg.model, "max_len", cfg.window))


def _positive(name: str, value, default):
    if value is None:
        return default
    try:
        v = int(value)
    except (TypeError, ValueError, OverflowError):
        v = 0
    if v < 1 or isinstance(value, bool) or isinstance(value, float) and v != value:
        raise ConfigError(f"model_args {name}={value!r} must be a whole number >= 1")
    return v


def _batch_size(value) -> int | None:
    """None for the default: no value, or "auto" / "auto:N" (the harness's batch-size search; buckets bound memory
    here), else the whole number >= 1 given."""
    if value is None or re.fullmatch(r"auto(:\d+)?", str(value)):
        return None
    return _positive("batch_size", value, None)


def _bos_flag(value) -> bool | None:
    """add_bos_token: None (not given: the tokenizer's own, zoo.data.tokenizers.encode_text) or true / false."""
    return None if value is None else _bool("add_bos_token", value)


def _bool(name: str, value) -> bool:
    if isinstance(value, bool) or str(value).lower() in ("true", "false", "1", "0"):
        return value if isinstance(value, bool) else str(value).lower() in ("true", "1")
    raise ConfigError(f"model_args {name}={value!r}: give true or false")


def _whole(name: str, value) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError, OverflowError):
        v = -1
    if v < 0 or isinstance(value, bool) or isinstance(value, float) and v != value:
        raise ConfigError(f"model_args {name}={value!r} must be a whole number >= 0")
    return v


@register_model("zoo")
class ZooLM(TemplateLM):
    """A zoo GPT-family run as an lm-evaluation-harness model (see the module docstring)."""

    def __init__(self, run=None, batch_size=None, max_length=None, max_gen_toks=None, stride=None,
                 add_bos_token=None, seed=0, **kwargs):
        super().__init__()
        run = check_model_args({"run": run, "batch_size": batch_size, "max_length": max_length,
                                "max_gen_toks": max_gen_toks, "stride": stride, "add_bos_token": add_bos_token,
                                "seed": seed, **kwargs})  # every value, before the run loads
        self.batch = _batch_size(batch_size) or 8
        self._max_gen_toks = _positive("max_gen_toks", max_gen_toks, 256)
        self.stride = _positive("stride", stride, None)
        self.add_bos_token = _bos_flag(add_bos_token)
        self.seed = _whole("seed", seed)
        from zoo import hf
        self.model, self.params, self.tok, cfg = hf.from_pretrained(run)
        if cfg.model.family != "gpt":  # where config.json did not say (a model_type zoo does not know)
            raise FamilyError(f"--model zoo scores GPT-family runs; {run} is a {cfg.model.family} run (zoo-eval "
                              f"scores the others)")
        self._max_length = min(_positive("max_length", max_length, cfg.window), self.model.cfg.max_len)
        if self.stride is not None and self.stride > self._max_length:
            raise ConfigError(f"model_args stride={self.stride} must be at most max_length ({self._max_length})")
        self.run = run

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "ZooLM":
        """As the harness's, but a model_args batch_size wins over the harness's own (its --batch_size, 1 unless
        given; zoo-lm-eval refuses both given): the harness would pass batch_size twice, a TypeError."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "ZooLM":
        return cls.create_from_arg_obj(lm_utils.simple_parse_args_string(arg_string), additional_config)

    # What the harness reads ---------------------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tok.eot_token

    @property
    def prefix_token_id(self) -> int:
        return prefix_token(self.tok)

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return self.batch

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tok, "name", "zoo"))

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """As the `hf` model encodes: with add_special_tokens (else add_bos_token) false, the text alone; else what
        its tokenizer puts first: the prefix token where add_bos_token=true forced it, else what transformers'
        `tokenizer(text)` puts first (encode_text). A text that starts with the prefix token's text (a chat
        template's BOS) gets nothing first unless add_special_tokens says so."""
        add = add_special_tokens if add_special_tokens is not None else self.add_bos_token
        if add_special_tokens is None and self._prefix_text and string.startswith(self._prefix_text):
            add = False
        if add is False:
            return self.tok.encode(string)
        if self.add_bos_token:
            return [self.prefix_token_id, *self.tok.encode(string)]
        return encode_text(self.tok, string)

    @functools.cached_property
    def _prefix_text(self) -> str:
        """The prefix token as the harness's `tokenizer.decode` writes it (specials kept)."""
        inner = getattr(self.tok, "tok", None)  # a checkpoint's `tokenizers.Tokenizer` (zoo.data.hf_tokenizers)
        if inner is not None:
            return inner.decode([self.prefix_token_id], skip_special_tokens=False)
        prefix = self.prefix_token_id
        return self.tok.eot_text if prefix == self.tok.eot_token else self.tok.decode([prefix])

    def tok_decode(self, ids) -> str:
        return self.tok.decode(ids)

    # Scoring ------------------------------------------------------------------------------------------------

    def _score(self, rows: list[Row], disable_tqdm: bool = True, what: str = "") -> list[tuple[float, bool]]:
        """(summed log-likelihood, every scored token greedy) of each row, in the order given."""
        lls, greedy = np.zeros(len(rows), np.float64), np.zeros(len(rows), bool)
        bar = tqdm(total=len(rows), desc=what, disable=disable_tqdm)
        for idx in batches([len(r.ids) for r in rows], self.batch):
            arrays = pad_batch([rows[i] for i in idx], self.batch, self.max_length)
            sums_B, correct_B = _row_scores(self.params, *map(jnp.asarray, arrays), model=self.model)
            lls[idx] = np.asarray(sums_B, np.float64)[:len(idx)]
            greedy[idx] = np.asarray(correct_B)[:len(idx)] == [rows[i].scored for i in idx]
            bar.update(len(idx))
        bar.close()
        return [(float(x), bool(g)) for x, g in zip(lls, greedy)]

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        rows = []
        for _, ctx, cont in requests:
            if not cont:
                raise ZooDataError(f"a continuation encodes to no tokens (context {ctx[-8:]}...)")
            ids = (list(ctx) + list(cont))[-(self.max_length + 1):]
            rows.append(Row(tuple(ids), min(len(cont), len(ids) - 1)))
        return self._score(rows, disable_tqdm, "zoo loglikelihood")

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        rows, owner = [], []
        for n, (text,) in enumerate(req.args for req in requests):
            ids = self.tok_encode(text)
            if self.stride is not None:  # zoo-eval's sliding window: windows of max_length + 1 ids
                doc = document_rows(ids, self.prefix_token_id, self.max_length + 1, self.stride)
            else:  # the harness's: disjoint windows, each reading max_length tokens
                pairs = map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=ids, prefix_token=self.prefix_token_id, max_seq_len=self.max_length, context_len=1))
                doc = [Row(tuple(c + t), len(t)) for c, t in pairs if t]
            rows += doc
            owner += [n] * len(doc)
        scores = self._score(rows, disable_tqdm, "zoo loglikelihood_rolling") if rows else []
        sums = np.bincount(np.asarray(owner, np.int64), weights=[s for s, _ in scores], minlength=len(requests))
        out = [float(s) for s in sums]
        for req, s in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, s)
        return out

    # Generation ---------------------------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from zoo.infer.sample import generate_batch
        order = Collator([req.args for req in requests], sort_fn=lambda r: (-len(self.tok_encode(r[0])), r[0]),
                         group_by="gen_kwargs", group_fn=lambda r: r[1])
        eos = getattr(self.tok, "eot_text", None)
        out, bar = [], tqdm(total=len(requests), desc="zoo generate_until", disable=disable_tqdm)
        for chunk in order.get_batched(n=self.batch):
            contexts, all_kwargs = zip(*chunk)
            kw = normalize_gen_kwargs(all_kwargs[0], self.max_gen_toks)
            until = handle_stop_sequences(kw.pop("until", None), eos=eos)
            new = kw.pop("max_gen_toks")
            if new >= self.max_length:
                raise ConfigError(f"max_gen_toks={new} leaves no context in the {self.max_length}-token window; "
                                  f"give fewer (model_args max_gen_toks or the task's generation_kwargs)")
            prompts = [self.tok_encode(c)[-(self.max_length - new):] or [self.prefix_token_id] for c in contexts]
            rows = bucket(len(prompts), self.batch)  # the rows too in a power of two: one compilation per bucket
            sampled = kw.get("do_sample") and float(kw.get("temperature", 0.0)) > 0
            got = generate_batch(self.model, self.params, prompts + [prompts[-1]] * (rows - len(prompts)), new,
                                 temperature=float(kw.get("temperature", 0.0)) if sampled else 0.0,
                                 top_k=int(kw.get("top_k") or 0) if sampled else 0,
                                 top_p=float(kw.get("top_p") or 1.0) if sampled else 1.0, seed=self.seed,
                                 eos_id=self.eot_token_id, vocab_limit=self.tok.n_vocab, window=self.max_length)
            for ids, context in zip(got, contexts):
                text = postprocess_generated_text(self.tok_decode(ids), stop=until, think_end_token=None)
                out.append(text)
                self.cache_hook.add_partial("generate_until", (context, all_kwargs[0]), text)
                bar.update(1)
        bar.close()
        return order.get_original(out)
