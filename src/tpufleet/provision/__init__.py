"""Providers: what turns "N slices of type T, spot or not" into slices Ray sees (issue: provisioning).

``base.py`` holds the one protocol every provider implements and the states they report, modelled on
Cloud TPU queued resources. Implementations: ``emulator.py`` (emulated hosts), ``gce.py`` (Cloud TPU
API v2 queued resources), ``kuberay.py`` (a RayCluster's TPU worker group), ``memory.py`` (in-memory,
for sandbox mode and tests).
"""
