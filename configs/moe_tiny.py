"""MoE tiny: llama_tiny's decoder with a mixture of experts in every block (zoo.nn.moe), byte-level, on the
built-in corpus. CPU. 4 SwiGLU experts of width 176 per block, each token routed to 2 of them (a token's
MLP FLOPs are llama_tiny's), the load-balancing loss added with coefficient 0.01 and logged as
`moe_aux_loss` (2 when balanced).

    python train.py configs/moe_tiny.py --workdir runs/moe_tiny
    zoo-sample runs/moe_tiny --prompt 'The "for" statement' --temperature 0

Expect (`python -m zoo.cli.results moe_tiny`, 2-core CPU, 2026-11-27): 1m13s wall; loss 3.60 -> 1.99
over 200 steps, eval_loss 1.928, eval_accuracy 0.476, moe_aux_loss 2.009; 7,665 tokens/s, MFU 0.21.
"""

from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
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
