"""Reconcile: config math (expected capacity) held against what vLLM reports and does."""
