"""Orchestration: experiment files (the ``*.toml`` beside this module) that drive datagen,
image builds, traced runs and analysis, and profile measurement on this device.

This is the top layer below ``cli.py``: it may import every other package, and none imports it.
"""
