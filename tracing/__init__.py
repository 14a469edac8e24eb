"""Tracing: run a container under eBPF tracing and samplers, and turn the output into tables."""
