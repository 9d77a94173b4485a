"""Inference on a model and its params, below the tasks: GPT sampling with a KV cache (`sample`),
encoder-decoder greedy and beam search (`decoding`), and BLEU as an evaluator (`bleu`)."""
