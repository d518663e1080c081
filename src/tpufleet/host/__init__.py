"""What runs on a TPU host, not in the control plane: runner, job start, containment, job files, relay."""
