"""Print kvwatch's predicted KV pool and concurrency next to what real vLLM logs printed.

    .venv/bin/python benchmarks/capacity_vs_vllm.py [LOG_DIR ...]

Rows: every log under LOG_DIR (default tests/fixtures/real/logs) whose model resolves (catalogue,
HF cache or path) and that states its KV memory, plus the cases whose model comes from outside the
log text (the real vLLM CPU runs with their config.json; log 011, whose model the issue thread
names). The pool is predicted from vLLM's own KV-memory figure, which is rounded to 0.01 GiB, so
the prediction is a block range (docs/vllm-formats.md §7.5); "ok" = the printed pool lies within one
block of it. The concurrency is predicted from the printed blocks with vLLM's formula and compared
to 2 decimals. With --num-gpu-blocks-override vLLM prints its computed count in the override line;
that count is the one compared (read here with a regex, as the analyze reader keeps only the final
pool). TP and the other settings are the analyze document's, i.e. the last value the log states: in
a log of two runs (025) that can pair one run's TP with the other's KV memory.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from kvwatch.batch import analyze_paths
from kvwatch.errors import UsageError
from kvwatch.reconcile.architecture import resolve_model
from kvwatch.reconcile.capacity import check_against_log, deployment_from_analysis

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
# (log, model) where the model is not in the log text.
EXTRA: tuple[tuple[Path, str, str], ...] = (
    (FIX / "vllm-cpu" / "server.log", str(FIX / "vllm-cpu" / "tiny-llama"), "config.json of the run"),
    (FIX / "vllm-cpu-seed" / "server.log", str(FIX / "vllm-cpu-seed" / "seedllama"), "config.json of the run"),
    (next((FIX / "real" / "logs").glob("011-*.log")), "meta-llama/Llama-3.1-8B-Instruct", "named in the issue thread"),
)
OVERRIDE = re.compile(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=\d+")


def compare(log: Path, model: str | None, where: str) -> dict[str, Any] | None:
    """One table row, or None when the log names no known model or states no KV memory."""
    doc = analyze_paths([str(log)])
    name = model or doc["config"].get("model")
    if not name or doc["capacity"].get("kv_cache_memory_gib") is None:
        return None
    try:
        arch = resolve_model(name)
    except UsageError:
        return None
    computed = OVERRIDE.search(log.read_text(encoding="utf-8", errors="replace"))
    if computed:
        doc["capacity"]["computed_gpu_blocks"] = int(computed.group(1))
    check = check_against_log(doc, arch)
    return {
        "log": log.name if log.parent.name == "logs" else f"{log.parent.name}/{log.name}",
        "model": arch.name.split("/")[-1],
        "where": where,
        "tp": deployment_from_analysis(doc, arch).tp,
        **check,
    }


def _fmt(row: dict[str, Any]) -> str:
    printed = row["computed_gpu_blocks"] if row["computed_gpu_blocks"] is not None else row["gpu_blocks"]
    final = f" (final {row['gpu_blocks']:,})" if row["computed_gpu_blocks"] is not None else ""
    rng = row["predicted_blocks_range"]
    pool_ok = {True: "ok", False: "MISMATCH", None: "-"}[row["pool_within_one_block"]]
    conc_ok = {True: "ok", False: "MISMATCH", None: "-"}[row["max_concurrency_matches"]]
    return (
        f"| {row['log']} | {row['model']} ({row['where']}) | {row['tp']} | {row['kv_cache_memory_gib']} GiB | "
        f"{rng[0]:,}-{rng[1]:,} | {'-' if printed is None else f'{printed:,}'}{final} | {pool_ok} | "
        f"{row['tokens_per_request'] or '-'} | {row['predicted_max_concurrency'] or '-'} | "
        f"{row['max_concurrency'] or '-'} | {conc_ok} |"
    )


def main(argv: list[str]) -> int:
    """Print the table; exit 1 when a comparison mismatches."""
    dirs = [Path(a) for a in argv] or [FIX / "real" / "logs"]
    rows: list[dict[str, Any]] = []
    for log, model, where in EXTRA:
        row = compare(log, model, where)
        if row:
            rows.append(row)
    for d in dirs:
        for log in sorted(d.glob("*.log")):
            row = compare(log, None, "named in the log")
            if row:
                rows.append(row)
    print(
        "| log | model | TP | vLLM KV memory | predicted blocks | vLLM blocks | pool | max_model_len "
        "| predicted x | vLLM x | concurrency |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(_fmt(row))
    bad = [r for r in rows if r["pool_within_one_block"] is False or r["max_concurrency_matches"] is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
