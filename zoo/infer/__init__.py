"""Inference on a model and its params, below the tasks: GPT sampling with a KV cache (`sample`),
encoder-decoder greedy and beam search (`decoding`), BLEU as an evaluator (`bleu`), a model's own
attention weights, what each head does with them and their heat maps (`attention`), and batched BERT
classification and fill-mask over padded, bucketed rows (`encoder`)."""
