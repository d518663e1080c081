"""Scheduling model and policy: pure Python, no Ray, no I/O, no clock reads."""
