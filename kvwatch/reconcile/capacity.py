"""The expected KV-cache capacity: the names every caller imports, from the modules that own them.

The capacity model lives in three modules, one job each:

- ``kvwatch.reconcile.pool``: the pool and memory math (bytes/token, KV-cache groups, blocks,
  concurrency, what vLLM prints), per vLLM version;
- ``kvwatch.reconcile.levers``: the what-if table, one row per lever;
- ``kvwatch.reconcile.expectation``: that model applied to a server's stated facts
  (``kvwatch.reconcile.facts.ServerFacts``), for ``capacity --from-log``, ``analyze`` and the
  sidecar alike.

This module keeps the older entry points that take an analyze document (a mapping) rather than
the facts record, as thin wrappers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvwatch.reconcile.architecture import Architecture, resolve_model
from kvwatch.reconcile.expectation import (
    Expectation,
    check_against_facts,
    deployment_from_facts,
    expectation,
    expected_estimate,
    lever_rows,
    model_from_facts,
    observed_architecture,
    request_from_histograms,
    request_from_stats,
)
from kvwatch.reconcile.facts import ServerFacts
from kvwatch.reconcile.levers import LEVER_TABLE, LEVERS, LeverRow, levers
from kvwatch.reconcile.pool import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_OVERHEAD_GIB,
    FP8_BYTES_PER_PARAM,
    GIB,
    INT4_BYTES_PER_PARAM,
    KV_CACHE_DTYPE_BYTES,
    MAMBA_BLOCK_ALIGNMENT,
    QUANTIZATION_BYTES_PER_PARAM,
    CapacityEstimate,
    Deployment,
    KvLayout,
    RequestShape,
    blocks_per_request_at,
    blocks_range_from_gib,
    cdiv,
    default_weights_bytes,
    deployment_layout,
    estimate,
    expected_capacity,
    kv_bytes_per_token,
    kv_dtype_bytes,
    kv_layout,
    legacy_allocator,
    max_concurrency_at_max_model_len,
    pool_bytes_from_gpu,
    pp_partition,
    printed_tokens_for,
    request_bytes,
    tokens_follow_concurrency,
)


def _facts(doc: Mapping[str, Any]) -> ServerFacts:
    return ServerFacts.from_document(doc)


def _doc_request(doc: Mapping[str, Any]) -> RequestShape | None:
    """An analyze document's observed request size (``requests.p95_tokens``), prompt only."""
    section = doc.get("requests")
    if not isinstance(section, Mapping):
        return None
    value = section.get("p95_tokens") or section.get("tokens_p95")
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return RequestShape(int(value), 0)


def deployment_from_analysis(doc: Mapping[str, Any], arch: Architecture | None = None) -> Deployment:
    """A Deployment from an analyze document (see ``expectation.deployment_from_facts``)."""
    return deployment_from_facts(_facts(doc), arch, _doc_request(doc))


def levers_for_analysis(
    doc: Mapping[str, Any], arch: Architecture | None, request: RequestShape | None = None
) -> list[dict[str, Any]]:
    """Lever rows (as ``kvwatch capacity``'s JSON) for an analyze document; [] when nothing is known.

    The basis is ``request`` when given (a request size read elsewhere, e.g. simulate's scrapes),
    else the document's ``whatif_basis`` request when it has one (the rule the sidecar uses too),
    else vLLM's max_model_len figure.
    """
    basis = request or document_basis(doc) or _doc_request(doc)
    return [r.as_dict() for r in lever_rows(_facts(doc), arch, basis)]


def document_basis(doc: Mapping[str, Any]) -> RequestShape | None:
    """The request size an analyze document's what-ifs are computed for (``whatif_basis``)."""
    basis = doc.get("whatif_basis")
    if not isinstance(basis, Mapping):
        return None
    prompt, output = basis.get("prompt_tokens"), basis.get("output_tokens")
    if not isinstance(prompt, int) or not isinstance(output, int) or prompt + output <= 0:
        return None
    source = basis.get("source")
    return RequestShape(prompt, output, source=source if isinstance(source, str) else None)


def analysis_levers(doc: Mapping[str, Any], model: str | None) -> list[dict[str, Any]]:
    """``kvwatch analyze``'s diagnosis levers: the model from ``--model`` or else the log.

    A ``--model`` that cannot be resolved is the user's error (UsageError); a model name from the
    log that kvwatch does not know falls back to the observed bytes/token.
    """
    arch = resolve_model(model) if model else model_from_log(doc)
    return levers_for_analysis(doc, arch)


def model_from_log(doc: Mapping[str, Any]) -> Architecture | None:
    """The model an analyze document's log names, if kvwatch knows it and the log agrees."""
    return model_from_facts(_facts(doc))


def check_against_log(doc: Mapping[str, Any], arch: Architecture, dep: Deployment | None = None) -> dict[str, Any]:
    """vLLM's printed pool and concurrency next to kvwatch's prediction (see ``check_against_facts``)."""
    return check_against_facts(_facts(doc), arch, dep)


def nest_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted fact paths (``"capacity.kv_cache_tokens": 40960``) -> the nested analyze-document shape."""
    doc: dict[str, Any] = {}
    for key, value in facts.items():
        node = doc
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return doc


def expected_from_facts(arch: Architecture, facts: Mapping[str, Any], **overrides: Any) -> CapacityEstimate:
    """The config.json expectation for dotted facts (see ``expectation.expected_estimate``)."""
    return expected_estimate(arch, ServerFacts.from_fields(facts), **overrides)


__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "DEFAULT_OVERHEAD_GIB",
    "FP8_BYTES_PER_PARAM",
    "GIB",
    "INT4_BYTES_PER_PARAM",
    "KV_CACHE_DTYPE_BYTES",
    "LEVERS",
    "LEVER_TABLE",
    "MAMBA_BLOCK_ALIGNMENT",
    "QUANTIZATION_BYTES_PER_PARAM",
    "CapacityEstimate",
    "Deployment",
    "Expectation",
    "KvLayout",
    "LeverRow",
    "RequestShape",
    "ServerFacts",
    "analysis_levers",
    "blocks_per_request_at",
    "blocks_range_from_gib",
    "cdiv",
    "check_against_facts",
    "check_against_log",
    "default_weights_bytes",
    "deployment_from_analysis",
    "deployment_from_facts",
    "deployment_layout",
    "document_basis",
    "estimate",
    "expectation",
    "expected_capacity",
    "expected_estimate",
    "expected_from_facts",
    "kv_bytes_per_token",
    "kv_dtype_bytes",
    "kv_layout",
    "legacy_allocator",
    "lever_rows",
    "levers",
    "levers_for_analysis",
    "max_concurrency_at_max_model_len",
    "model_from_facts",
    "model_from_log",
    "nest_facts",
    "observed_architecture",
    "pool_bytes_from_gpu",
    "pp_partition",
    "printed_tokens_for",
    "request_bytes",
    "request_from_histograms",
    "request_from_stats",
    "resolve_model",
    "tokens_follow_concurrency",
]
