"""Older name of ``kvwatch.reconcile.model_catalogue`` (the built-in model architectures).

Renamed so that "catalogue" means one thing per stage: ``kvwatch.export.catalogue`` is the
catalogue of kvwatch_* metrics, ``kvwatch.reconcile.model_catalogue`` the catalogue of models.
This module keeps ``from kvwatch.reconcile import catalogue`` working.
"""

from __future__ import annotations

from kvwatch.reconcile.model_catalogue import (
    CATALOGUE,
    HF,
    LLAMA_FIELDS,
    MLA_FIELDS,
    CatalogueEntry,
    _index,
    architecture,
    closest,
    find,
    lookup,
    names,
    normalise,
)

__all__ = [
    "CATALOGUE",
    "HF",
    "LLAMA_FIELDS",
    "MLA_FIELDS",
    "CatalogueEntry",
    "_index",
    "architecture",
    "closest",
    "find",
    "lookup",
    "names",
    "normalise",
]
