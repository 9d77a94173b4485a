"""Neural-network pieces two or more model families share, knowing no family: `layers` (initializers,
Einsum, Embed, norms, MLPs, residual sublayers; the dimension key is in its docstring), `attention`
(the Attention module and the one attention entry point; its masks in `masks`, the backend per platform in
`attention_backend`, TPU kernels in `tpu_kernels`), `block` (GPT's and BERT's block), `positions`,
`stack` (scan / remat over layers) and `losses` (the fused output cross-entropy)."""
