"""The server's facts per (server run, engine): a DP engine reads its own, a restart its own.

The logs here are synthetic (hand-made in vLLM 0.32.0's format, the same prefixes and messages as
tests/fixtures/vllm-cpu-seed/server.log and synthetic-dp-two-engines.log): no public log was found
whose data-parallel engines printed different pools, though vLLM sizes each engine's pool from its
own device (v1/engine/core.py EngineCore._initialize_kv_caches runs per engine core process).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvwatch.parse.log import LogParser, parse_line
from kvwatch.reconcile import facts as facts_module
from kvwatch.reconcile.analysis import Analysis
from kvwatch.reconcile.facts import FIELDS, MAX_RUNS, FactsBuilder
from kvwatch.reconcile.live import LiveState
from kvwatch.records import FactRecord, LogRecord

HEAD = "INFO 11-29 09:59:30 [kv_cache_utils.py:1146] GPU KV cache size: 65,536 tokens"


@pytest.mark.parametrize(
    ("prefix", "engine"),
    [
        ("(EngineCore_DP1 pid=9) ", 1),  # 0.32: data_parallel_size > 1
        ("(EngineCore_DP12 pid=9) ", 12),
        ("(EngineCore_1 pid=2095613) ", 1),  # 0.8.x naming (real fixture 016)
        ("(Worker_DP1_TP0 pid=11) ", 1),  # 0.32 multiproc_executor.py WorkerProc with DP
        ("(Worker_DP3_PP1_TP1_EP7 pid=11) ", 3),
        ("(EngineCore pid=8) ", None),  # one engine: no rank in the name
        ("(Worker_TP1 pid=11) ", None),  # a TP rank, not a DP one
        ("(Worker_3 pid=11) ", None),
        ("(APIServer pid=7) ", None),
        ("", None),
    ],
    ids=lambda v: str(v).strip() or "none",
)
def test_a_fact_carries_the_rank_of_the_dp_engine_whose_process_printed_it(prefix: str, engine: int | None) -> None:
    facts = [r for r in parse_line(prefix + HEAD, 1) if isinstance(r, FactRecord)]
    assert facts, "the KV cache line is a fact"
    assert {f.engine for f in facts} == {engine}


def _records(text: str) -> list[LogRecord]:
    parser = LogParser()
    out: list[LogRecord] = []
    for line in text.splitlines(keepends=True):
        out.extend(parser.feed_line(line))
    return out + parser.finish()


ARGS = (
    "(APIServer pid=7) INFO 11-29 {t} [api_utils.py:286] non-default args: {{'model_tag': 'org/model-a', "
    "'max_model_len': 16384, 'data_parallel_size': 2, 'max_num_seqs': {mns}}}\n"
)
POOL = (
    "(EngineCore_DP{dp} pid=8) INFO 11-29 {t} [kv_cache_utils.py:1146] GPU KV cache size: {tokens:,} tokens, "
    "Maximum concurrency for 16,384 tokens per request: {ratio:.2f}x\n"
)
STATS = (
    "(APIServer pid=7) INFO 11-29 {t} [loggers.py:336] Engine 00{e}: Avg prompt throughput: 100.0 tokens/s, "
    "Avg generation throughput: 50.0 tokens/s, Running: {r} reqs, Waiting: {w} reqs, GPU KV cache usage: {kv}%, "
    "Prefix cache hit rate: 0.0%\n"
)


def _dp_log() -> str:
    """Two DP engines; DP0's pool is 65,536 tokens, DP1's (printed last) 32,768; engine 0 memory-bound."""
    text = ARGS.format(t="09:59:00", mns=64)
    text += POOL.format(dp=0, t="09:59:30", tokens=65536, ratio=4.0)
    text += POOL.format(dp=1, t="09:59:31", tokens=32768, ratio=2.0)
    for i in range(8):
        t = f"10:0{i // 6}:{i % 6}0"
        text += STATS.format(t=t, e=0, r=4, w=12, kv=97.5)
        text += STATS.format(t=t, e=1, r=2, w=0, kv=20.0)
    return text


def test_the_memory_bound_engine_is_summarised_with_its_own_pool() -> None:
    analysis = Analysis()
    analysis.add(_records(_dp_log()))
    doc = analysis.document()
    assert doc["diagnosis"]["verdict"] == "memory_bound"
    assert doc["capacity"]["kv_cache_tokens"] == 32768  # the document keeps the last value, as before
    # Engine 0 was memory-bound on its own 65,536-token pool (the last-printed 32,768 is engine 1's).
    assert analysis.worst_pool == 65536
    assert "65,536-token pool" in analysis.summary("memory_bound")


def test_the_sidecar_exports_each_dp_engines_own_pool() -> None:
    state = LiveState()
    for i, rec in enumerate(_records(_dp_log())):
        state.on_log_record(rec, float(i))
    engines = {e.engine: e for e in state.view(100.0).engines}
    assert dict(engines["0"].pool_tokens)["log"] == 65536
    assert dict(engines["1"].pool_tokens)["log"] == 32768
    assert engines["0"].max_num_seqs == engines["1"].max_num_seqs == 64  # the server's args: both


def _restart_log() -> str:
    """Run 1 with max_num_seqs 4, a restart with 64 and no pool line of its own yet."""
    text = ARGS.format(t="09:59:00", mns=4) + POOL.format(dp=0, t="09:59:30", tokens=65536, ratio=4.0)
    text += STATS.format(t="10:00:00", e=0, r=4, w=12, kv=40.0)
    text += ARGS.format(t="10:05:00", mns=64)
    return text


def test_a_restart_keeps_each_runs_own_facts() -> None:
    records = _records(_restart_log())
    builder = FactsBuilder()
    for rec in records:
        if isinstance(rec, FactRecord):
            builder.add(rec)
        elif type(rec).__name__ == "RunStartRecord":
            builder.start_run()
    assert builder.runs == 2
    assert builder.facts_for(0, run=0).max_num_seqs == 4
    assert builder.facts_for(0, run=1).max_num_seqs == 64
    assert builder.facts_for(0).max_num_seqs == 64  # the latest run by default
    # The restart has not printed its pool yet: the engine's last stated pool stands.
    assert builder.facts_for(0).capacity.kv_cache_tokens == 65536


def test_the_sidecar_judges_a_restarted_server_by_the_new_runs_limit() -> None:
    state = LiveState()
    for i, rec in enumerate(_records(_restart_log())):
        state.on_log_record(rec, float(i))
    assert state.max_num_seqs(state.engines["0"]) == 64
    state.on_log_record(_records(STATS.format(t="10:06:00", e=0, r=4, w=12, kv=40.0))[0], 10.0)
    assert state.engines["0"].judge.max_num_seqs == 64


def test_an_engine_that_printed_nothing_of_its_own_reads_its_runs_facts() -> None:
    builder = FactsBuilder()
    builder.add(FactRecord(1, None, "config.max_num_seqs", 8))
    builder.add(FactRecord(2, None, "capacity.kv_cache_tokens", 1000, engine=0))
    # Engine 5 printed nothing: the run's last values (today's rule), never None.
    assert builder.facts_for(5).capacity.kv_cache_tokens == 1000
    assert builder.facts_for(5).max_num_seqs == 8
    assert builder.facts_for(None) == builder.facts()


PACKAGE = Path(__file__).resolve().parents[1] / "kvwatch"
# The parser writes the dotted names (its rows name the document field each value fills) and
# facts.py reads them; every other module reads ServerFacts' attributes.
WRITERS_AND_READER = {PACKAGE / "reconcile" / "facts.py", *(PACKAGE / "parse").glob("*.py")}
DOTTED = {*FIELDS, *(getattr(facts_module, n) for n in ("GRAPH_CAPTURE_STARTED", "ENGINE_READY", "SERVING"))}


def test_no_module_but_the_facts_record_reads_a_dotted_fact_name() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in WRITERS_AND_READER:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in DOTTED:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}")
    assert not found, "read the ServerFacts attribute instead: " + ", ".join(found)


def test_a_crash_looping_server_keeps_a_bounded_number_of_runs_and_the_latest_facts() -> None:
    builder = FactsBuilder()
    builder.add(FactRecord(1, None, "capacity.kv_cache_tokens", 1000, engine=1))
    for run in range(10 * MAX_RUNS):
        builder.start_run()
        builder.add(FactRecord(2, None, "config.max_num_seqs", run))
    assert builder.runs == MAX_RUNS
    assert builder.facts_for(1).max_num_seqs == 10 * MAX_RUNS - 1
    assert builder.facts_for(1).capacity.kv_cache_tokens == 1000  # stated once, in the first run
    assert builder.facts_for(1, run=MAX_RUNS - 2).max_num_seqs == 10 * MAX_RUNS - 2


MEMORY = "(Worker_DP{dp}_TP0 pid=1{dp}) INFO 11-29 {t} [gpu_worker.py:298] Available KV cache memory: {gib} GiB\n"


def _dp_memory_log(dp1_tokens: int) -> str:
    """Two DP ranks; DP1's GPU is shared with another process, so it profiled 4 GiB against DP0's 8
    (each rank sizes its own pool: vLLM 0.32.0 v1/engine/core.py EngineCore._initialize_kv_caches).
    At 131,072 bytes a token, 8 GiB is 65,536 tokens and 4 GiB 32,768."""
    text = ARGS.format(t="09:59:00", mns=64)
    text += MEMORY.format(dp=0, t="09:59:29", gib="8.0") + POOL.format(dp=0, t="09:59:30", tokens=65536, ratio=4.0)
    text += MEMORY.format(dp=1, t="09:59:30", gib="4.0")
    text += POOL.format(dp=1, t="09:59:31", tokens=dp1_tokens, ratio=dp1_tokens / 16384)
    return text + "".join(STATS.format(t="10:00:00", e=e, r=1, w=0, kv=5.0) for e in (0, 1))


def _reconciled(text: str) -> tuple[dict[str, dict[str, float]], list[str]]:
    from kvwatch.reconcile.live import Expected

    def expected(_facts: object) -> Expected:
        return Expected(bytes_per_token=131072, pool_tokens_for=lambda b: b // 131072)

    state = LiveState(expected=expected)
    events = []
    for i, rec in enumerate(_records(text)):
        events += state.on_log_record(rec, float(i))
    ratios = {e.engine: dict(e.reconcile) for e in state.view(100.0).engines}
    return ratios, [e.message for e in events if e.kind == "mismatch"]


def test_each_dp_engine_is_reconciled_against_its_own_memory() -> None:
    # A rank with less free memory has a smaller pool and is consistent: no mismatch for either.
    ratios, mismatches = _reconciled(_dp_memory_log(32768))
    assert ratios["0"]["pool_tokens"] == ratios["1"]["pool_tokens"] == 1.0
    assert mismatches == []


def test_a_mismatch_on_one_dp_engine_is_that_engines_alone() -> None:
    # DP1 printed half the pool its memory holds: only DP1's ratio moves, and the event names it.
    ratios, mismatches = _reconciled(_dp_memory_log(16384))
    assert ratios["0"]["pool_tokens"] == 1.0
    assert ratios["1"]["pool_tokens"] == 0.5
    # Half the pool for its memory: the pool, the bytes per token and the concurrency all disagree.
    assert sorted(m.split(": ")[1] for m in mismatches) == ["bytes_per_token", "max_concurrency", "pool_tokens"]
    assert all(m.startswith("engine 1 (") for m in mismatches)
    assert any("pool_tokens: vLLM reports 0.500x" in m for m in mismatches)


def _merged_reading(runs: list[tuple[dict, dict]], engine: int | None, index: int) -> dict:
    """facts_for's rule, read from scratch over the kept runs (the reading before the prefixes)."""
    merged: dict = {}
    for every, own in runs[: index + 1]:
        if engine is not None and engine in own:
            merged.update(own.get(None, {}))
            merged.update(own[engine])
        else:
            merged.update(every)
    return merged


@pytest.mark.parametrize("seed", range(40))
def test_the_latest_runs_facts_read_from_kept_prefixes_equal_a_reading_of_every_kept_run(seed: int) -> None:
    """facts_for keeps, per engine, what the finished runs give it and reads only the runs since;
    folds of the oldest runs past MAX_RUNS keep or drop those prefixes. Over random starts, facts of
    two DP engines and of none, a scrape's cache_config and questions about old runs, every answer
    equals facts_for's rule read afresh over the kept runs, field order included."""
    import random

    rng = random.Random(seed)
    builder = FactsBuilder()
    fields = ["capacity.kv_cache_tokens", "capacity.gpu_blocks", "config.max_num_seqs", "config.model", "x.extra"]
    asked = folds = 0
    for _ in range(400 if seed % 2 else 1500):
        step = rng.random()
        if step < 0.12:
            folds += len(builder._runs) == MAX_RUNS and builder._runs[-1] != ({}, {})
            builder.start_run()
        elif step < 0.14:
            builder.set_cache_config({"block_size": rng.choice(("16", "32"))})
        elif step < 0.7:
            field = rng.choice(fields)
            value = rng.choice((1, 2, 3)) if field != "config.model" else rng.choice(("m1", "m2"))
            builder.add(FactRecord(1, None, field, value, engine=rng.choice((None, None, 0, 1))))
        else:
            engine = rng.choice((None, 0, 1, 2))
            run = None if rng.random() < 0.8 else rng.randrange(len(builder._runs))
            index = len(builder._runs) - 1 if run is None else run
            want = facts_module.ServerFacts.from_fields(
                _merged_reading(builder._runs, engine, index), builder._cache_config
            )
            assert builder.facts_for(engine, run) == want
            asked += 1
    assert asked > 20
    assert len(builder._runs) <= MAX_RUNS
    assert folds > 0 or seed % 2  # half the seeds run past MAX_RUNS


def test_a_crash_loop_restating_its_facts_builds_its_record_once() -> None:
    """A restart that states what the last run stated reads the kept prefix and reuses the record."""
    builder = FactsBuilder()
    built = []
    real = facts_module.ServerFacts.from_fields
    facts_module.ServerFacts.from_fields = classmethod(  # type: ignore[method-assign]
        lambda cls, f, c=None: built.append(1) or real.__func__(cls, f, c)  # type: ignore[attr-defined]
    )
    try:
        for _ in range(3 * MAX_RUNS):
            builder.start_run()
            builder.add(FactRecord(1, None, "capacity.kv_cache_tokens", 65536))
            assert builder.facts_for(0).capacity.kv_cache_tokens == 65536
    finally:
        facts_module.ServerFacts.from_fields = real  # type: ignore[method-assign]
    assert len(built) == 1


def test_a_fold_past_max_runs_reads_a_dp_engines_facts_afresh() -> None:
    """Run 0: DP engine 0 states its pool; run 1: the server states another; no later run restates
    it. Folding runs 0 and 1 changes what engine 0 reads (its own lines now share one run with the
    server's), so its kept prefix must not stand: the answer is the rule read over the kept runs."""
    builder = FactsBuilder()
    builder.add(FactRecord(1, None, "capacity.kv_cache_tokens", 1000, engine=0))
    builder.start_run()
    builder.add(FactRecord(2, None, "capacity.kv_cache_tokens", 2000))
    for n in range(MAX_RUNS + 2):
        builder.start_run()
        builder.add(FactRecord(3 + n, None, "capacity.gpu_blocks", n))
        want = _merged_reading(builder._runs, 0, len(builder._runs) - 1)
        assert builder.facts_for(0) == facts_module.ServerFacts.from_fields(want, builder._cache_config)
