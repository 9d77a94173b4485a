"""MoE tiny: llama_tiny's decoder with a mixture of experts in every block (zoo.nn.moe), byte-level, on the
built-in corpus. CPU. 4 SwiGLU experts of width 176 per block, each token routed to 2 of them (a token's
MLP FLOPs are llama_tiny's), the load-balancing loss added with coefficient 0.01 and logged as
`moe_aux_loss` (2 when balanced).

    python train.py configs/moe_tiny.py --workdir runs/moe_tiny
    zoo-sample runs/moe_tiny --prompt 'The "for" statement' --temperature 0

Expect (2-core CPU shared with other jobs, load ~7, 2026-11-27; faster on an idle host): 3m09s wall, 1m38s
of CPU time; loss 5.97 -> 1.99 over 200 steps, eval_loss 1.93, eval_accuracy 0.476, moe_aux_loss 1.97-2.01
throughout (balanced); 2,792 tokens/s. On CPU the experts run dense (zoo.nn.moe).
"""

from zoo.config import Config, DataConfig, OptimConfig, TrainConfig
from zoo.models.gpt import MOE_TINY


def get_config() -> Config:
    return Config(
        task="gpt_lm",
        model=MOE_TINY,
        data=DataConfig(source="builtin", tokenizer="bytes", seq_len=128),
        optim=OptimConfig(lr=2e-3, schedule="cosine", warmup=20, weight_decay=0.1, b2=0.99),
        train=TrainConfig(steps=200, batch_size=16, log_every=50, eval_every=100, eval_batches=8,
                          save_every=200, sample_tokens=100, sample_prompt="The "),
    )
