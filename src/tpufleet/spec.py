"""The fleet spec: a short YAML file describing pools of TPU slices, tenants and add-ons."""
