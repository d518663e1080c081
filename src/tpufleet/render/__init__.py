"""Renderers: a fleet spec in, Kubernetes / Ray cluster-launcher objects out. Pure: no I/O, no Ray."""

from tpufleet.render.kuberay import render_kuberay, render_raycluster, render_rayjob
from tpufleet.render.launcher import render_launcher

__all__ = ["render_kuberay", "render_launcher", "render_raycluster", "render_rayjob"]
