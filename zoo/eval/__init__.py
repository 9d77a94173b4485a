"""Evaluating a causal LM as users do (zoo-eval): the log-likelihood of token rows, batched and jitted over
a few padded shapes (`loglik`); perplexity and bits per byte of whole documents under a sliding window
(`perplexity`); multiple choice by log-likelihood, acc and acc_norm as lm-evaluation-harness defines them
(`choice`). Each is a function of (model, params, rows) -> sums; the host divides once."""
