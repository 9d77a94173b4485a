"""zoo: a JAX/Flax model zoo."""


def from_pretrained(path: str):
    """(model, params, tokenizer, config) from a zoo run directory or a Hugging Face checkpoint
    directory (see zoo.hf.from_pretrained). Imported on call, so `import zoo` stays light."""
    from zoo.hf import from_pretrained as load
    return load(path)
