"""The server's stated facts: one typed, frozen record built from what vLLM said about itself.

vLLM states its pool, block size, limits, dtype, model and version in three places: startup log
lines (``FactRecord``: a dotted field of the analyze document and its value), ``/metrics``'
``vllm:cache_config_info`` labels, and the operator's flags to kvwatch. ``FactsBuilder`` folds
them; ``ServerFacts`` is the record analysis, the live state, capacity and the sidecar read. This
module is the only place that knows the dotted field names (``FIELDS``); everything else reads
attributes.

Precedence, where two places state one thing: the log first (it is what the engine printed for
this run), then cache_config_info (what /metrics says; e.g. a sidecar started after the startup
block), then kvwatch's own flags (what the operator says the server runs with).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # an annotation only: `kvwatch capacity` need not build the log records (start-up)
    from kvwatch.records import FactRecord

GIB = 1 << 30

FactValue = str | int | float | bool | None

_NOT_A_KEY = {"document_key": False}


@dataclass(frozen=True, slots=True)
class StatedCapacity:
    """What vLLM's startup block printed about its KV pool (the analyze document's ``capacity``)."""

    device: FactValue = None
    gpu_blocks: FactValue = None
    cpu_blocks: FactValue = None
    block_size: FactValue = None
    kv_cache_tokens: FactValue = None
    kv_cache_memory_gib: FactValue = None
    weights_gib: FactValue = None
    # Additive (not in docs/contracts.md): the blocks vLLM computed from its KV memory before
    # --num-gpu-blocks-override replaced them; what the memory figure is to be checked against.
    computed_gpu_blocks: FactValue = None
    # Not keys of the document's capacity object: its max_concurrency object, and what the cause
    # table reads.
    max_concurrency_tokens_per_request: FactValue = field(default=None, metadata=_NOT_A_KEY)
    max_concurrency_ratio: FactValue = field(default=None, metadata=_NOT_A_KEY)
    # "Graph capturing finished in N secs, took X GiB", and the profiler's CUDA-graph estimate
    cuda_graph_gib: FactValue = field(default=None, metadata=_NOT_A_KEY)
    cuda_graph_estimate_gib: FactValue = field(default=None, metadata=_NOT_A_KEY)


@dataclass(frozen=True, slots=True)
class StatedMemory:
    """The device memory vLLM's startup profile printed (the cause table's start-up checks)."""

    total_gib: FactValue = None
    startup_free_gib: FactValue = None
    initial_usage_gib: FactValue = None


@dataclass(frozen=True, slots=True)
class StatedConfig:
    """The engine configuration vLLM printed (the analyze document's ``config``)."""

    vllm_version: FactValue = None
    model: FactValue = None
    served_model_name: FactValue = None
    dtype: FactValue = None
    kv_cache_dtype: FactValue = None
    max_seq_len: FactValue = None
    block_size: FactValue = None
    gpu_memory_utilization: FactValue = None
    tensor_parallel_size: FactValue = None
    pipeline_parallel_size: FactValue = None
    data_parallel_size: FactValue = None
    enable_prefix_caching: FactValue = None
    quantization: FactValue = None
    max_num_seqs: FactValue = None
    max_num_batched_tokens: FactValue = None


# The analyze document's capacity.* and config.* keys, in the order docs/contracts.md lists them
# (the records' field order).
CAPACITY_KEYS = tuple(f.name for f in fields(StatedCapacity) if f.metadata.get("document_key", True))
CONFIG_KEYS = tuple(f.name for f in fields(StatedConfig))

# Dotted analyze-document field -> (section, attribute). The one table of those names.
FIELDS: dict[str, tuple[str, str]] = {
    **{f"capacity.{k}": ("capacity", k) for k in CAPACITY_KEYS},
    "capacity.max_concurrency.tokens_per_request": ("capacity", "max_concurrency_tokens_per_request"),
    "capacity.max_concurrency.ratio": ("capacity", "max_concurrency_ratio"),
    "capacity.cuda_graph_gib": ("capacity", "cuda_graph_gib"),
    "capacity.cuda_graph_estimate_gib": ("capacity", "cuda_graph_estimate_gib"),
    **{f"config.{k}": ("config", k) for k in CONFIG_KEYS},
    **{f"memory.{f.name}": ("memory", f.name) for f in fields(StatedMemory)},
}

# Facts that mark a point of the server's start rather than state a value (kvwatch.parse.logpatterns
# rows graph_capture_*, init_engine, output_handler): the cause table's ProgressTracker reads their
# order, not their value. Named here so that no other module spells a dotted field.
GRAPH_CAPTURE_STARTED = "startup.graph_capture"
GRAPH_CAPTURE_FINISHED = "capacity.cuda_graph_gib"  # capture runs after the KV cache is allocated
ENGINE_READY = "startup.ready"
SERVING = "runtime.serving"
KV_CACHE_MEMORY = "capacity.kv_cache_memory_gib"


def _section(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = doc.get(key)
    return value if isinstance(value, Mapping) else {}


def as_number(value: object) -> float | None:
    """A number, or None (booleans and strings are not sizes)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def as_positive_int(value: object) -> int | None:
    """A positive whole number, or None (a size of 0 or less in a log is not a size)."""
    number = as_number(value)
    return int(number) if number is not None and number > 0 else None


def as_int(value: object) -> int | None:
    """A whole number, or None."""
    number = as_number(value)
    return None if number is None else int(number)


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """Everything one vLLM server stated about itself, typed; absent facts are None.

    ``cache_config`` holds /metrics' ``vllm:cache_config_info`` labels as (name, value) pairs (a
    tuple, so the record is hashable and can key caches). ``flags`` are kvwatch's own
    ``--kv-cache-dtype`` / ``--tp`` stand-ins for what neither source stated.
    """

    capacity: StatedCapacity = StatedCapacity()
    config: StatedConfig = StatedConfig()
    memory: StatedMemory = StatedMemory()
    cache_config: tuple[tuple[str, FactValue], ...] = ()
    flag_kv_cache_dtype: str | None = None
    flag_tensor_parallel_size: int | None = None
    extra: tuple[tuple[str, FactValue], ...] = ()  # fields the parser emits that are not in FIELDS

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_fields(cls, facts: Mapping[str, Any], cache_config: Mapping[str, Any] | None = None) -> ServerFacts:
        """From dotted fields (``{"capacity.gpu_blocks": 1478}``) and cache_config_info labels."""
        sections: dict[str, dict[str, Any]] = {"capacity": {}, "config": {}, "memory": {}}
        extra: list[tuple[str, Any]] = []
        for key, value in facts.items():
            where = FIELDS.get(key)
            if where is None:
                extra.append((key, value))
            else:
                sections[where[0]][where[1]] = value
        return cls(
            StatedCapacity(**sections["capacity"]),
            StatedConfig(**sections["config"]),
            StatedMemory(**sections["memory"]),
            tuple(sorted((cache_config or {}).items())),
            extra=tuple(extra),
        )

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> ServerFacts:
        """From a ``kvwatch.analyze/1`` document's ``capacity`` / ``config`` / ``requests`` sections."""
        cap = _section(doc, "capacity")
        cfg = _section(doc, "config")
        conc = _section(cap, "max_concurrency")
        known = {f.name for f in fields(StatedCapacity)}
        capacity = StatedCapacity(
            **{k: cap.get(k) for k in CAPACITY_KEYS if k in known},
            max_concurrency_tokens_per_request=conc.get("tokens_per_request"),
            max_concurrency_ratio=conc.get("ratio"),
        )
        config = StatedConfig(**{k: cfg.get(k) for k in CONFIG_KEYS})
        return cls(capacity, config)

    def with_flags(self, kv_cache_dtype: str | None, tensor_parallel_size: int | None) -> ServerFacts:
        """The same facts with kvwatch's flags as the last resort for dtype and TP."""
        return replace(self, flag_kv_cache_dtype=kv_cache_dtype, flag_tensor_parallel_size=tensor_parallel_size)

    # ---------------------------------------------------------------- the analyze document

    def capacity_section(self) -> dict[str, Any]:
        """The analyze document's ``capacity`` object (every key present)."""
        out: dict[str, Any] = {k: getattr(self.capacity, k) for k in CAPACITY_KEYS}
        out["max_concurrency"] = {
            "tokens_per_request": self.capacity.max_concurrency_tokens_per_request,
            "ratio": self.capacity.max_concurrency_ratio,
        }
        return out

    def config_section(self) -> dict[str, Any]:
        """The analyze document's ``config`` object (every key present)."""
        return {k: getattr(self.config, k) for k in CONFIG_KEYS}

    # ---------------------------------------------------------------- derived values

    def stated(self, field: str) -> FactValue:
        """One fact by its dotted analyze-document field (``"capacity.gpu_blocks"``), or None.

        For code written against those names (FIELDS); everything else reads the attributes.
        """
        where = FIELDS.get(field)
        if where is not None:
            return getattr(getattr(self, where[0]), where[1])  # type: ignore[no-any-return]
        for key, value in self.extra:
            if key == field:
                return value
        return None

    def metric(self, name: str) -> FactValue:
        """One cache_config_info label's typed value (None when /metrics did not state it)."""
        for key, value in self.cache_config:
            if key == name:
                return value
        return None

    @property
    def empty(self) -> bool:
        """Nothing stated yet (no startup line, no cache_config_info)."""
        return (
            self.capacity == StatedCapacity()
            and self.config == StatedConfig()
            and self.memory == StatedMemory()
            and not self.cache_config
        )

    @property
    def block_size(self) -> int | None:
        """Tokens per KV block: the pool line's, else the engine config's, else cache_config_info's."""
        return (
            as_positive_int(self.capacity.block_size)
            or as_positive_int(self.config.block_size)
            or as_positive_int(self.metric("block_size"))
        )

    @property
    def config_block_size(self) -> int | None:
        """The configured block size (engine config, else cache_config_info): no pool line."""
        return as_positive_int(self.config.block_size) or as_positive_int(self.metric("block_size"))

    @property
    def max_model_len(self) -> int | None:
        """max_model_len as the engine config or the concurrency line states it."""
        return as_positive_int(self.config.max_seq_len) or as_positive_int(
            self.capacity.max_concurrency_tokens_per_request
        )

    @property
    def max_num_seqs(self) -> int | None:
        """vLLM's max_num_seqs as its args state it."""
        return as_int(self.config.max_num_seqs)

    @property
    def max_num_batched_tokens(self) -> int | None:
        """vLLM's max_num_batched_tokens as its args state it."""
        return as_positive_int(self.config.max_num_batched_tokens)

    @property
    def kv_memory_bytes(self) -> float | None:
        """KV-cache memory vLLM reports: the log's GiB, else cache_config's kv_cache_memory_bytes."""
        gib = as_number(self.capacity.kv_cache_memory_gib)
        if gib is not None:
            return gib * GIB
        return as_number(self.metric("kv_cache_memory_bytes"))

    @property
    def log_pool_tokens(self) -> float | None:
        """The pool the log printed: its tokens, else blocks x block size."""
        tokens = as_number(self.capacity.kv_cache_tokens)
        if tokens is not None:
            return tokens
        blocks = as_number(self.capacity.gpu_blocks)
        size = as_positive_int(self.capacity.block_size) or as_positive_int(self.config.block_size)
        return blocks * size if blocks is not None and size else None

    @property
    def metrics_pool_tokens(self) -> float | None:
        """The pool cache_config_info states: kv_cache_size_tokens, else num_gpu_blocks x block_size."""
        tokens = as_number(self.metric("kv_cache_size_tokens"))
        if tokens is not None:
            return tokens
        blocks = as_number(self.metric("num_gpu_blocks"))
        size = as_positive_int(self.metric("block_size"))
        return blocks * size if blocks is not None and size else None

    @property
    def override_blocks(self) -> float | None:
        """The --num-gpu-blocks-override pool in blocks, when one replaced vLLM's computed pool."""
        if self.capacity.computed_gpu_blocks is not None:
            return as_number(self.capacity.gpu_blocks)
        return as_number(self.metric("num_gpu_blocks_override"))

    @property
    def computed_blocks(self) -> int | None:
        """The blocks vLLM computed from its KV memory before an override replaced them."""
        return as_int(self.capacity.computed_gpu_blocks)

    @property
    def printed_max_concurrency(self) -> float | None:
        """vLLM's own "Maximum concurrency for L tokens per request: X.XXx" (log, else /metrics)."""
        return as_number(self.capacity.max_concurrency_ratio) or as_number(self.metric("kv_cache_max_concurrency"))

    @property
    def kv_cache_dtype(self) -> str | None:
        """--kv-cache-dtype as the log, cache_config_info's cache_dtype, or kvwatch's flag states it."""
        for value in (self.config.kv_cache_dtype, self.metric("cache_dtype"), self.flag_kv_cache_dtype):
            if isinstance(value, str) and value:
                return value
        return None

    @property
    def tensor_parallel_size(self) -> int | None:
        """TP as the log or kvwatch's --tp states it."""
        return as_positive_int(self.config.tensor_parallel_size) or self.flag_tensor_parallel_size

    @property
    def model_name(self) -> str | None:
        """The served name, else the model path the log names."""
        for value in (self.config.served_model_name, self.config.model):
            if isinstance(value, str) and value:
                return value
        return None

    @property
    def model(self) -> str | None:
        """The model (path or hub id) the engine config names; a served name is only a label."""
        value = self.config.model
        return value if isinstance(value, str) and value else None

    @property
    def vllm_version(self) -> str | None:
        """The vLLM version the log states."""
        value = self.config.vllm_version
        return value if isinstance(value, str) else None


MAX_RUNS = 64  # server runs kept apart; older ones are folded together (start_run)


class FactsBuilder:
    """Folds FactRecords and cache_config_info into ``ServerFacts``, per (server run, engine).

    Each server start (``start_run``, on a RunStartRecord) opens a run; a fact belongs to the run it
    was printed in and, when a data-parallel engine's own process printed it
    (``FactRecord.engine``), to that engine. ``facts_for(engine)`` is what that engine stated in
    the run, over what its run stated without naming an engine, over earlier runs' facts where the
    run did not restate them (never another engine's own lines, in a run this engine spoke in);
    an engine that printed nothing of its own reads its run's last values. ``facts()`` keeps the
    analyze document's rule: the last value seen of each field. Records are rebuilt only on change.
    """

    __slots__ = ("_built", "_cache", "_cache_config", "_facts", "_fields", "_prefix", "_runs")

    def __init__(self) -> None:
        self._fields: dict[str, FactValue] = {}
        self._cache_config: dict[str, FactValue] = {}
        self._facts: ServerFacts | None = ServerFacts()
        # Per run: (every fact of the run, last value; each engine's own facts, and under None the
        # facts no engine's process printed: the server's own, e.g. the API server's args).
        self._runs: list[tuple[dict[str, FactValue], dict[int | None, dict[str, FactValue]]]] = [({}, {})]
        self._cache: dict[tuple[int, int | None], ServerFacts] = {}
        # Per engine: (k, what runs[:k] give it), so that the latest run's record reads one run more
        # than the last time, not every kept run again (a crash-looping server's log starts a run
        # every few hundred lines, and each start asked for a merge of up to MAX_RUNS runs).
        self._prefix: dict[int | None, tuple[int, dict[str, FactValue]]] = {}
        # Per engine: the last record built, with the fields it was built from (in their order, which
        # ServerFacts.extra keeps) and the cache_config dict: a restart restating the same facts
        # gets the same record without building it again.
        self._built: dict[int | None, tuple[tuple[tuple[str, FactValue], ...], dict[str, FactValue], ServerFacts]] = {}

    def add(self, record: FactRecord) -> None:
        """One startup fact from the log."""
        run, engines = self._runs[-1]
        own = engines.setdefault(record.engine, {})
        changed = self._fields.get(record.field, _MISSING) != record.value
        changed |= run.get(record.field, _MISSING) != record.value
        changed |= own.get(record.field, _MISSING) != record.value
        own[record.field] = record.value
        if changed:
            self._fields[record.field] = record.value
            run[record.field] = record.value
            self._facts = None
            self._cache.clear()

    def start_run(self) -> None:
        """A new server start: the facts that follow are this run's."""
        if self._runs[-1] != ({}, {}):
            if len(self._runs) >= MAX_RUNS:
                # A crash-looping server restarts without end under a sidecar: fold the two oldest
                # runs into one, so memory stays bounded and later runs inherit exactly as before.
                (every, own), (every2, own2) = self._runs[0], self._runs[1]
                self._fold_prefixes(own, own2)
                every.update(every2)
                for engine, facts in own2.items():
                    own.setdefault(engine, {}).update(facts)
                del self._runs[1]
            self._runs.append(({}, {}))
            self._cache.clear()

    def _fold_prefixes(
        self, own: dict[int | None, dict[str, FactValue]], own2: dict[int | None, dict[str, FactValue]]
    ) -> None:
        """Runs 0 and 1 are about to become one run: the kept prefixes that covered both still hold,
        one run shorter, for every engine that printed nothing of its own in either (for it each
        run reads its run's facts, and the two runs' facts in order are their update), and are
        read afresh for the others."""
        for engine, (k, merged) in list(self._prefix.items()):
            if k < 2 or (engine is not None and (engine in own or engine in own2)):
                del self._prefix[engine]
            else:
                self._prefix[engine] = (k - 1, merged)

    def set_cache_config(self, labels: Mapping[str, FactValue]) -> None:
        """The latest scrape's cache_config_info labels (replacing the previous scrape's)."""
        if dict(labels) != self._cache_config:
            self._cache_config = dict(labels)
            self._facts = None
            self._cache.clear()

    def get(self, field: str) -> FactValue:
        """One dotted field's last value (for fields outside ServerFacts, e.g. a new parser row)."""
        return self._fields.get(field)

    @property
    def stated(self) -> bool:
        """Anything stated at all (a startup fact or cache_config_info)."""
        return bool(self._fields or self._cache_config)

    def engines_with_own_pool(self) -> list[int]:
        """The DP ranks whose own process printed its pool in the latest run (empty: one engine)."""
        return sorted(e for e, own in self._runs[-1][1].items() if e is not None and "capacity.kv_cache_tokens" in own)

    @property
    def runs(self) -> int:
        """Server runs seen so far (1 before any restart)."""
        return len(self._runs)

    def facts(self) -> ServerFacts:
        """The record for everything folded so far (the last value of each field)."""
        if self._facts is None:
            self._facts = ServerFacts.from_fields(self._fields, self._cache_config)
        return self._facts

    def facts_for(self, engine: int | None, run: int | None = None) -> ServerFacts:
        """What ``engine`` (a DP rank; None: not named) stated in ``run`` (default: the latest)."""
        index = len(self._runs) - 1 if run is None else min(max(run, 0), len(self._runs) - 1)
        key = (index, engine)
        cached = self._cache.get(key)
        if cached is None:
            merged: dict[str, FactValue]
            if index == len(self._runs) - 1:
                k, prefix = self._prefix.get(engine, (0, {}))
                for every, own in self._runs[k:index]:
                    _read_run(prefix, engine, every, own)
                self._prefix[engine] = (index, prefix)
                merged = dict(prefix)
                _read_run(merged, engine, *self._runs[index])
            else:
                merged = {}
                for every, own in self._runs[: index + 1]:
                    _read_run(merged, engine, every, own)
            items = tuple(merged.items())
            built = self._built.get(engine)
            if built is not None and built[1] is self._cache_config and built[0] == items:
                cached = built[2]
            else:
                cached = ServerFacts.from_fields(merged, self._cache_config)
                self._built[engine] = (items, self._cache_config, cached)
            self._cache[key] = cached
        return cached


def _read_run(
    merged: dict[str, FactValue],
    engine: int | None,
    every: dict[str, FactValue],
    own: dict[int | None, dict[str, FactValue]],
) -> None:
    """Add what one run gives ``engine`` to ``merged`` (FactsBuilder.facts_for)."""
    if engine is not None and engine in own:
        # A rank that spoke for itself in this run reads its own lines and the server's, never
        # another rank's: each DP engine core profiles its own device and prints its own memory,
        # pool and concurrency (vLLM 0.32.0 v1/engine/core.py EngineCore._initialize_kv_caches),
        # so a neighbour's value is never this one's.
        merged.update(own.get(None, {}))
        merged.update(own[engine])
    else:
        merged.update(every)


_MISSING = object()
