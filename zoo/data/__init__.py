"""Data: corpus -> token store -> deterministic batches (`corpus`, `store`, `batches`), and tokenizers
by name (`tokenizers`; a Hugging Face checkpoint's own in `hf_tokenizers`). Knows no task and no model."""
