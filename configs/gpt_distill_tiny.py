"""GPT distilled, tiny: a 2-layer, width-64 byte-level student distilled from a gpt_tiny teacher (4 layers, width
128) on the built-in corpus: the teacher runs frozen in the same jitted step, the loss is 0.5 * T^2 * KL(teacher ||
student) at T = 2 plus 0.5 * the cross-entropy (zoo.tasks.distill). CPU.

    python train.py configs/gpt_tiny.py --workdir runs/gpt_tiny                   # the teacher
    python train.py configs/gpt_distill_tiny.py --workdir runs/gpt_distill_tiny   # the student
    python train.py configs/gpt_distill_tiny.py --workdir runs/gpt_student_alone --set distill.teacher=

Another teacher: --set distill.teacher=PATH (any zoo.load source with the student's vocabulary: 384, byte
tokenizer). The last command trains the same student for the same tokens without a teacher; eval_loss is the
student's held-out cross-entropy in both (metrics.jsonl also logs kl and ce).

Measured (2-core CPU, busy, 2026-11-29), all three at --set train.steps=300: teacher eval_loss 2.353; the student
distilled 2.475 (kl 4.33 -> 0.105), the student alone 2.486. Not yet measured at the full 800 steps.
"""

import dataclasses

from zoo.configuration import Config, DataConfig, DistillConfig, OptimConfig, TrainConfig
from zoo.models.gpt import GPT_TINY


def get_config() -> Config:
    return Config(
        task="gpt_lm",
        model=dataclasses.replace(GPT_TINY, num_layers=2, d_model=64, d_ff=256),
        data=DataConfig(source="builtin", tokenizer="bytes", seq_len=128),
        optim=OptimConfig(lr=2e-3, schedule="cosine", warmup=50, weight_decay=0.1, b2=0.99),
        train=TrainConfig(steps=800, batch_size=16, log_every=50, eval_every=250, eval_batches=8,
                          save_every=400, sample_tokens=200, sample_prompt="The "),
        distill=DistillConfig(teacher="runs/gpt_tiny", temperature=2.0, alpha=0.5),
    )
