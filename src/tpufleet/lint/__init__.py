"""The RayCluster linter: manifests in, findings out. Pure: no I/O, no Ray."""
