"""The cluster seam: the ``ClusterClient`` protocol, its value types, the in-memory clusters."""
