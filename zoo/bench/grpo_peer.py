"""grpo_train's peer (`zoo-bench --workload grpo_train --peer hf-torch|hf-torch-compile`): TRL's `GRPOTrainer` on the
transformers model of the spec with PEFT LoRA adapters of the spec's rank, alpha and targets, at the spec's G, beta
and completion length, temperature 1, loss bnpo (zoo's grpo.loss_type), the reference being the base with the
adapters off (TRL's own choice for a PEFT model it wraps itself with beta > 0: no second model; zoo's is the same).
The reward is the workload's (zoo.bench.shapes.grpo_reward), the prompts the spec's ids written as words through a
word-level tokenizer (`tokenizer`: each prompt encodes to exactly its ids). Its end-of-text id is kept from being
sampled before max_completion_length (generation_kwargs min_new_tokens), so that every completion is as long as
zoo's. Imported only in the peer's own process (TRL's import is heavy).

The timed step is the trainer's own, as dpo_peer times DPOTrainer's: `_prepare_for_training` once (optimizer,
scheduler, accelerate's prepare), then each step `training_step(model, inputs)` on the B x G rows TRL's sampler
hands it (each prompt G times in a row), which generates (transformers' `generate`, eager, the adapters unmerged),
scores, takes the reference's log-probabilities and the loss's backward; then gradient clipping, the optimizer and
scheduler steps and zero_grad. Its sampler (`_generate_single_turn`) and reward (`_calculate_rewards`) are timed
where the step calls them, for zoo.bench.common.grpo_final.
"""

from __future__ import annotations

import tempfile
import time
import warnings

from zoo.bench.common import calibrate, grpo_final, timed_round
from zoo.bench.shapes import grpo_reward
from zoo.bench.peer_base import _hf_model, _TrlPeer, lora_config


def tokenizer(vocab_size: int):
    """A word-level tokenizer over ids 3..V-1 written as numbers, its specials named apart (pad id 0, end-of-text 1,
    unknown 2): special tokens are matched inside words first, so a special named "1" would split "17" in two."""
    import transformers
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{str(i): i for i in range(3, vocab_size)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                                unk_token="<unk>")


class TrlGrpo(_TrlPeer):
    """A GRPOTrainer step (the module's docstring) on the spec's B prompts, G completions each."""

    def __init__(self, spec, name: str = "hf-torch"):
        import datasets
        import trl
        super().__init__(spec, name)
        warnings.filterwarnings("ignore", category=UserWarning, module="trl")
        g, V = spec["grpo"], spec["hf"]["vocab_size"]
        G, new, prompts = g["G"], g["new"], [" ".join(map(str, p)) for p in g["prompts"]]
        self.out_dir = tempfile.TemporaryDirectory(prefix="zoo-bench-trl-")
        args = trl.GRPOConfig(output_dir=self.out_dir.name, report_to="none", use_cpu=not self.cuda, bf16=self.bf16,
                              fp16=False, per_device_train_batch_size=len(prompts) * G, gradient_accumulation_steps=1,
                              num_generations=G, max_completion_length=new, temperature=1.0, top_p=1.0, top_k=0,
                              generation_kwargs={"min_new_tokens": new}, beta=g["beta"], epsilon=0.2,
                              loss_type="bnpo", scale_rewards="group", mask_truncated_completions=False,
                              activation_checkpointing=False, torch_compile=self.compiled, learning_rate=1e-4,
                              weight_decay=0.1, max_grad_norm=1.0, logging_steps=10**9, save_strategy="no",
                              disable_tqdm=True, seed=0)
        datasets.disable_progress_bars()
        self.trainer = trl.GRPOTrainer(model=_hf_model(spec["hf"]), reward_funcs=[grpo_reward], args=args,
                                       train_dataset=datasets.Dataset.from_list([{"prompt": p} for p in prompts]),
                                       processing_class=tokenizer(V), peft_config=lora_config(spec["lora"]))
        t = self.trainer
        assert not args.gradient_checkpointing  # GRPOConfig's default is on; zoo's side recomputes nothing either
        assert t.ref_model is None and t.beta == g["beta"], "the reference is not the base"
        assert t.processing_class(text=prompts)["input_ids"] == g["prompts"], "a prompt is not its ids"
        t.current_gradient_accumulation_steps = 1  # what train()'s loop sets before each step
        self.model, _ = t._prepare_for_training(10**6, None, None)  # the optimizer, scheduler, accelerate's prepare
        self.inputs = [{"prompt": p} for p in prompts for _ in range(G)]  # TRL's RepeatSampler: a group in a row
        for method in ("_generate_single_turn", "_calculate_rewards"):  # timed where the step calls them
            setattr(t, method, self._timed(method, getattr(t, method)))
        self.params = [p for p in t.model.parameters() if p.requires_grad]
        self.rows, self.train_tokens = len(self.inputs), len(self.inputs) * (len(g["prompts"][0]) + new)
        self.times, self.spent = [], {}
        self.compile_s, self.k = calibrate(self._steps)

    def _timed(self, method, fn):
        key = {"_generate_single_turn": "complete_s", "_calculate_rewards": "score_s"}[method]

        def call(*args, **kw):
            t = time.perf_counter()
            out = fn(*args, **kw)
            self.sync()
            self.spent[key] = self.spent.get(key, 0.0) + time.perf_counter() - t
            if key == "complete_s":  # the tokens each row sampled (cut after an end-of-text, kept away here)
                self.spent["completion_tokens"] = self.spent.get("completion_tokens", 0) + sum(map(len, out[0]))
            return out
        return call

    STEP_ARGS = (None,)  # training_step's num_items_in_batch

    def round(self):
        r = timed_round(self)
        self.times.append(r)
        return r

    def final(self, since: int = 0):
        return grpo_final(self.times[since:], self.rows, self.train_tokens, {"peak_memory_mb": self.peak_memory_mb()})

    def ready(self):
        import trl
        out = self.report(self.trainer.model, "bfloat16 autocast, float32 weights" if self.bf16 else "float32")
        out["versions"] += f" / trl {trl.__version__}"
        optim = self.trainer.args.optim
        return {**out, "trainable_params": sum(p.numel() for p in self.params),
                "optimizer": getattr(optim, "value", optim)}
