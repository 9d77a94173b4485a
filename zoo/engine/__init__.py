"""The decode engine: continuous batching over a KV cache of rows (batching.Engine), its jitted programs
(programs), a row's work and the programs' names (sequence), batched prefill and prompt scoring. It serves
zoo-serve (zoo.serve) and `generate(json_schema=)` (zoo.api.decoder), and imports only infer, eval, models and nn."""
