"""zoo: a JAX/Flax model zoo."""
