"""A local Ray cluster whose raylets look like TPU hosts to Ray, Ray Train and JAX."""
