"""Neural-network pieces two or more model families share, knowing no family: `layers` (initializers,
Einsum, Embed, norms, MLPs, residual sublayers; the dimension key is in its docstring), `attention`
(masks, backend per platform, the Attention module), `block` (GPT's and BERT's block), `positions`,
`stack` (scan / remat over layers) and `losses` (the fused output cross-entropy)."""
