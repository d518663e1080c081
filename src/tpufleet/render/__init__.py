"""Renderers: a fleet spec in, Kubernetes / Ray cluster-launcher objects out. Pure: no I/O, no Ray."""
