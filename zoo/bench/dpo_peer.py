"""dpo_train's peer (`zoo-bench --workload dpo_train --peer hf-torch|hf-torch-compile`): TRL's `DPOTrainer` on the
transformers model of the spec with PEFT LoRA adapters of the spec's rank, alpha and targets, the sigmoid loss at
the spec's beta, the reference being the base with the adapters disabled (TRL's own choice for a PEFT model it
wraps itself, given `peft_config` and no ref_model: one more forward pass a step, no second model; zoo's
dpo.reference=base is the same). Imported only in the peer's own process (TRL's import is heavy).

The timed step is the trainer's own: `_prepare_for_training` (what `train()` runs first: its optimizer, AdamW
fused where torch has it, its scheduler, and accelerate's `prepare`, which adds bf16 autocast on CUDA and, with
hf-torch-compile, `torch.compile` of the policy through DPOConfig's torch_compile, the reference pass staying eager
as in `train()`), then, as its loop does each step, `training_step(model, inputs)` (TRL's `compute_loss`: policy
and reference log-probabilities through its fused LM head, the loss, backward), gradient clipping to
max_grad_norm, the optimizer and scheduler steps and zero_grad. The batch is collated once by the trainer's own
collator from B pairs of token ids (no tokenizing or data loading timed, as zoo's worker prefetches its batches):
rows [2B, T], the first B prompt + chosen, the rest prompt + rejected, a prompt of T // 2 ids each and answers to
T, no padding. tokens_per_s counts every position of both rows, 2 * B * T a step, as zoo's does.
"""

from __future__ import annotations

import tempfile
import warnings

import torch

from zoo.bench.common import calibrate
from zoo.bench.peer_base import _hf_model, _TrlPeer, lora_config


def tokenizer(vocab_size: int):
    """A word-level tokenizer over ids "0".."V-1" (DPOTrainer wants a processing class with a pad token; it
    tokenizes only its one-row placeholder dataset here): pad id 0, end-of-text id 1."""
    import transformers
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    vocab = {str(i): i for i in range(vocab_size)}
    tok = Tokenizer(WordLevel(vocab, unk_token="2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="0", eos_token="1", unk_token="2")


def pair_examples(B: int, T: int, V: int, seed: int = 0) -> list[dict]:
    """B pairs in DPOTrainer's tokenized form: a prompt of T // 2 random ids, two different answers of T - T // 2."""
    g = torch.Generator().manual_seed(seed)
    P = T // 2
    out = []
    for _ in range(B):
        prompt, chosen, rejected = (torch.randint(3, V, (n,), generator=g).tolist() for n in (P, T - P, T - P))
        if chosen == rejected:
            rejected[0] = 3 + (rejected[0] - 3 + 1) % (V - 3)
        out.append({"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected})
    return out


class TrlDpo(_TrlPeer):
    """A DPOTrainer step (the module's docstring) on one pre-collated batch of the spec's B pairs of T tokens."""

    def __init__(self, spec, name: str = "hf-torch"):
        import datasets
        import trl
        super().__init__(spec, name)
        warnings.filterwarnings("ignore", category=UserWarning, module="trl")
        B, T, V = spec["batch"], spec["seq_len"], spec["hf"]["vocab_size"]
        dpo = spec.get("dpo", {})
        self.out_dir = tempfile.TemporaryDirectory(prefix="zoo-bench-trl-")
        args = trl.DPOConfig(output_dir=self.out_dir.name, report_to="none", use_cpu=not self.cuda, bf16=self.bf16,
                             fp16=False, per_device_train_batch_size=B, gradient_accumulation_steps=1, max_length=T,
                             beta=dpo.get("beta", 0.1), loss_type=[dpo.get("loss", "sigmoid")],
                             precompute_ref_log_probs=False, activation_checkpointing=False,
                             torch_compile=self.compiled, learning_rate=1e-4, weight_decay=0.1, max_grad_norm=1.0,
                             logging_steps=10**9, save_strategy="no", disable_tqdm=True, seed=0)
        assert not args.gradient_checkpointing  # transformers 5's name for it: activation_checkpointing
        datasets.disable_progress_bars()
        placeholder = datasets.Dataset.from_list([{"prompt": "3 4", "chosen": " 5", "rejected": " 6"}])
        self.trainer = trl.DPOTrainer(model=_hf_model(spec["hf"]), args=args, train_dataset=placeholder,
                                      processing_class=tokenizer(V), peft_config=lora_config(spec["lora"]))
        t = self.trainer
        assert t.ref_model is None and "ref" not in t.model.peft_config, "the reference is not the base"
        t.current_gradient_accumulation_steps = 1  # what train()'s loop sets before each step
        self.model, _ = t._prepare_for_training(10**6, None, None)  # the optimizer, scheduler, accelerate's prepare
        batch = t.data_collator(pair_examples(B, T, V))
        assert tuple(batch["input_ids"].shape) == (2 * B, T) and bool(batch["attention_mask"].all())
        self.inputs = {k: v.to(t.args.device) for k, v in batch.items()}
        self.params = [p for p in t.model.parameters() if p.requires_grad]
        self.tokens, self.batch, self.times = 2 * B * T, B, []
        self.compile_s, self.k = calibrate(self._steps)

    def ready(self):
        import trl
        out = self.report(self.trainer.model, "bfloat16 autocast, float32 weights" if self.bf16 else "float32")
        out["versions"] += f" / trl {trl.__version__}"
        optim = self.trainer.args.optim
        return {**out, "trainable_params": sum(p.numel() for p in self.params),
                "optimizer": getattr(optim, "value", optim)}  # DPOConfig's: adamw_torch_fused

