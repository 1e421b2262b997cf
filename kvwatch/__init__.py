"""kvwatch: an observability agent for vLLM's KV cache.

Pipeline, one folder per stage (see docs/architecture.md):
sources (bytes in) -> parse (text -> records) -> reconcile (config math, expected vs observed)
-> export (Prometheus, reports). The command modules in ``kvwatch.commands`` wire the stages.
"""

__version__ = "0.1.0"
