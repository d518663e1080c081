"""What users import to talk to a control plane: the HTTP client and ``SliceManager``. No server code."""
