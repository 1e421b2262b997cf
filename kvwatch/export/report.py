"""Human renderings of the ``kvwatch.analyze/1`` document: text for on-call, markdown for incidents.

Both are built from the JSON document only (never from log text), so nothing the document does
not hold (request content in particular) can reach a report. Order follows what an on-call
engineer asks in the first 30 seconds: what was the server, what happened, what is wrong.
"""

from __future__ import annotations

from typing import Any

_NA = "not stated"


def _n(value: Any, unit: str = "", digits: int | None = None) -> str:
    if value is None:
        return _NA
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}{unit}"
    if isinstance(value, float):
        text = f"{value:,.{digits}f}" if digits is not None else f"{value:,.2f}".rstrip("0").rstrip(".")
        return f"{text}{unit}"
    return f"{value}{unit}"


def _t(ts: str | None) -> str:
    """An ISO timestamp as people read it in a log: ``--11-29T14:45:37`` -> ``11-29 14:45:37``."""
    if ts is None:
        return "?"
    return ts.removeprefix("--").replace("T", " ", 1)


def _cause_suffix(diag: dict[str, Any]) -> str:
    """' (cause: kv_pool_too_small)' after the verdict, when the diagnosis names one."""
    cause = diag.get("cause")
    return f" (cause: {cause})" if cause else ""


def _engine_causes(diag: dict[str, Any]) -> str:
    """'engine 0 memory-bound (kv_pool_too_small), engine 1 ok (healthy)' for several engines."""
    return ", ".join(
        f"engine {e['engine']} {str(e['verdict']).replace('_', '-')} ({e['cause']})" for e in diag.get("engines") or []
    )


def _lever(lever: Any, said: str | None = None) -> str:
    """One lever row (a dict from the capacity model, or plain text) as a sentence.

    ``said``: why nothing was simulated, already printed above the levers (not repeated per row).
    """
    if not isinstance(lever, dict):
        return str(lever)
    text = str(lever.get("lever", "lever"))
    mc, mult = lever.get("max_concurrency"), lever.get("multiplier")
    if isinstance(mc, int | float):
        text += f": max concurrency {mc:,.1f}"
        if isinstance(mult, int | float):
            text += f" ({mult:g}x)"
    basis, req = lever.get("basis"), lever.get("basis_request")
    if isinstance(mc, int | float) and isinstance(req, dict) and isinstance(req.get("prompt_tokens"), int):
        size = req["prompt_tokens"] + (req.get("output_tokens") or 0)
        text += f" for {size:,}-token requests (from the {req.get('source') or 'flags'})"
    elif isinstance(mc, int | float) and basis == "max_model_len":
        text += " at max_model_len"
    if lever.get("note"):
        text += f" - {lever['note']}"
    sim = lever.get("simulated")
    why = lever.get("simulated_why_not")
    if isinstance(sim, dict):
        text += f"; simulated: {_outcome(sim)}"
    elif isinstance(why, str) and why != said and why not in str(lever.get("note") or ""):
        text += f"; not simulated: {why}"
    return text


def _outcome(sim: dict[str, Any]) -> str:
    """'7.8 waiting, 9.4 preempted per 100 requests, e2e p95 70.9 s' (a part unknown: '-')."""

    def f(x: Any, unit: str = "") -> str:
        return f"{x:,.1f}{unit}" if isinstance(x, int | float) else "-"

    return (
        f"{f(sim.get('mean_waiting'))} waiting, {f(sim.get('preemptions_per_100_requests'))} preempted per 100 "
        f"requests, e2e p95 {f(sim.get('e2e_p95_s'), ' s')}"
    )


def _simulation_line(diag: dict[str, Any]) -> str | None:
    """What the simulated outcomes are compared with, or why there are none (null: no levers)."""
    sim = diag.get("simulation")
    if not isinstance(sim, dict):
        return None
    if isinstance(sim.get("observed"), dict):
        return f"simulated on the evidence (vLLM's scheduler replayed), as observed: {_outcome(sim['observed'])}"
    return f"not simulated: {sim.get('why_not') or 'no evidence to calibrate on'}"


def _server_lines(doc: dict[str, Any]) -> list[tuple[str, str]]:
    cfg, cap = doc["config"], doc["capacity"]
    mc = cap["max_concurrency"]
    pool = _n(cap["kv_cache_tokens"], " tokens")
    pool_gib = cap.get("pool_memory_gib", cap["kv_cache_memory_gib"])
    if pool_gib is not None:
        # the blocks' bytes: with --num-gpu-blocks-override they are not the memory vLLM had
        pool += f" in {_n(pool_gib * 1024, ' MiB') if pool_gib < 1 else _n(pool_gib, ' GiB')}"
    if cap["gpu_blocks"] is not None:
        overridden = pool_gib is not None and pool_gib != cap["kv_cache_memory_gib"]
        extra = f"; --num-gpu-blocks-override, vLLM had {_n(cap['kv_cache_memory_gib'], ' GiB')}" if overridden else ""
        pool += f" ({_n(cap['gpu_blocks'])} blocks{extra})"
    conc = _NA
    if mc["ratio"] is not None:
        conc = f"{_n(mc['ratio'])}x at {_n(mc['tokens_per_request'])} tokens per request"
    model = cfg["served_model_name"] or cfg["model"]
    return [
        ("model", _n(model) + (f" ({cfg['model']})" if cfg["model"] and cfg["model"] != model else "")),
        ("vLLM", _n(cfg["vllm_version"])),
        (
            "device",
            f"{_n(cap['device'])}, TP {_n(cfg['tensor_parallel_size'])}, PP {_n(cfg['pipeline_parallel_size'])}",
        ),
        ("KV pool", pool),
        ("block size", _n(cap["block_size"] or cfg["block_size"])),
        ("max concurrency", conc),
        ("max_model_len", _n(cfg["max_seq_len"])),
        ("max_num_seqs", _n(cfg["max_num_seqs"])),
        ("weights", _n(cap["weights_gib"], " GiB")),
        ("prefix caching", _n(cfg["enable_prefix_caching"])),
    ]


def _v1_stated_preemptions(doc: dict[str, Any]) -> str:
    """What the log's V1 stats lines say about preemptions, worded so that none stated is never read
    as a count of none ("" when the log has no V1 stats lines)."""
    st, pre = doc["stats"], doc["preemptions"]
    last = st.get("last") or {}
    if not st["count"] or last.get("swapped") is not None:  # no stats lines, or V0's (they state Swapped)
        return ""
    if pre["from_stats"]:
        return f"{pre['from_stats']:,} stated by V1 stats lines"
    # vLLM 0.32.0 v1/metrics/loggers.py LoggingStatLogger.log(): _update_stats() calls _reset(), which
    # zeroes num_preemptions before `if self.num_preemptions > 0` would add "Preemptions: %d"; every
    # release since the part was added has that order (the fix is still open upstream:
    # https://github.com/vllm-project/vllm/pull/38452), so none stated is no count at all.
    return (
        "V1 stats lines state none (not a count: vLLM's LoggingStatLogger zeroes its count before printing it,"
        " so a V1 log never shows one)"
    )


def _happened_lines(doc: dict[str, Any]) -> list[tuple[str, str]]:
    st, pre, sat = doc["stats"], doc["preemptions"], doc["saturation"]
    rows: list[tuple[str, str]] = [("server starts", _n(doc["runs"]))]
    if st["count"]:
        span = f"{_t(st['first_ts'])} .. {_t(st['last_ts'])}"
        inferred = (doc.get("evidence") or {}).get("year_inferred_from")
        if inferred:  # vLLM's own stamps have no year: say where it came from
            span += f"; year from {inferred}"
        rows.append(("stats records", f"{st['count']:,} ({span})"))
        mx = st["max"]
        rows.append(
            (
                "peaks",
                f"{_n(mx['running'])} running, {_n(mx['waiting'])} waiting, {_n(mx['kv_usage_pct'], ' %', 1)} KV usage",
            )
        )
        last = st["last"]
        rows.append(
            (
                "last record",
                f"{_n(last['running'])} running, {_n(last['waiting'])} waiting, "
                f"{_n(last['kv_usage_pct'], ' %', 1)} KV usage",
            )
        )
        if len(st.get("engines", [])) > 1:
            for e in st["engines"]:
                name = f"engine {e['engine']}" + (f" of {e['source']}" if e["source"] else "")
                rows.append(
                    (
                        name,
                        f"{e['verdict']}: peaks {_n(e['max_running'])} running, "
                        f"{_n(e['max_waiting'])} waiting, {_n(e['max_kv_usage_pct'], ' %', 1)}",
                    )
                )
    else:
        rows.append(("stats records", "none"))
    if sat["memory_bound_records"]:
        secs = sat["memory_bound_seconds"]
        rows.append(
            (
                "memory-bound",
                f"{sat['memory_bound_records']} records"
                + (f", {secs:,.0f} s" if secs is not None else "")
                + f" in {sat['episodes_total']} episode(s)",
            )
        )
        for ep in sat["episodes"][:10]:
            rows.append(
                (
                    "  episode",
                    f"{_t(ep['start_ts'])} .. {_t(ep['end_ts'])}: up to {ep['peak_waiting']} waiting, "
                    f"KV {_n(ep['peak_kv_usage_pct'], ' %', 1)}",
                )
            )
    preempt = f"{pre['warnings']} V0 warnings"
    if pre["max_cumulative"] is not None:
        preempt += f" (cumulative {pre['max_cumulative']:,})"
    v1 = _v1_stated_preemptions(doc)
    if v1:
        preempt += f"; {v1}"
    from_metrics = pre.get("from_metrics")
    # V1 logs no line per preemption: only vLLM's counter is complete (CONTRACTS "analyze additions").
    counted = f"{from_metrics:,} by vLLM's counter" if from_metrics is not None else f"counter {pre.get('note', '')}"
    preempt += f"; {counted}"
    rows.append(("preemptions", preempt))
    if doc["errors"]:
        for err in doc["errors"][:10]:
            rows.append((f"error {err['kind']}", f"line {err['line']}: {err['message']}"))
    else:
        rows.append(("errors", "none"))
    return rows


_BARS = "▁▂▃▄▅▆▇█"


def _spark(values: list[Any], top: float | None = None) -> str:
    """One character per bucket, scaled to ``top`` (the row's peak); blank where unknown."""
    known = [v for v in values if isinstance(v, int | float)]
    peak = top if top is not None else max(known, default=0)
    if not peak:
        return "".join(" " if v is None else _BARS[0] for v in values)
    return "".join(
        " " if v is None else _BARS[min(len(_BARS) - 1, int(v / peak * (len(_BARS) - 1) + 0.5))] for v in values
    )


def timeline_lines(doc: dict[str, Any], max_engines: int = 4) -> list[str]:
    """Sparklines of peak running, waiting and KV usage per engine (each column a time bucket)."""
    out: list[str] = []
    engines = [e for e in doc["stats"].get("engines", []) if e.get("timeline")][:max_engines]
    for e in engines:
        tl = e["timeline"]
        if len(engines) > 1:
            out.append(f"engine {e['engine']}" + (f" of {e['source']}" if e["source"] else ""))
        per = max(b["records"] for b in tl)
        out.append(f"  {_t(tl[0]['start_ts'])} .. {_t(tl[-1]['end_ts'])}, {per} record(s) per column, peaks:")
        running = [b["peak_running"] for b in tl]
        waiting = [b["peak_waiting"] for b in tl]
        kv = [b["peak_kv_usage_pct"] for b in tl]
        out.append(f"  running  {_spark(running)}  max {_n(max((v for v in running if v is not None), default=None))}")
        out.append(f"  waiting  {_spark(waiting)}  max {_n(max((v for v in waiting if v is not None), default=None))}")
        peak_kv = max((v for v in kv if v is not None), default=None)
        out.append(f"  KV %     {_spark(kv, 100.0)}  max {_n(peak_kv, ' %', 1)}")
    return out


def render_text(doc: dict[str, Any]) -> str:
    """A plain-text report: server, what happened, diagnosis."""
    out: list[str] = []
    diag = doc["diagnosis"]
    out.append(f"kvwatch analyze: {diag['verdict'].replace('_', '-').upper()}" + _cause_suffix(diag))
    out.append(f"  {diag['summary']}")
    per_engine = _engine_causes(diag)
    if per_engine:
        out.append(f"  per engine: {per_engine}")
    for title, items in (("Advice", diag.get("advice")), ("Warnings", diag.get("warnings"))):
        if items:
            out += ["", title, *(f"  - {item}" for item in items)]
    for title, rows in (("Server", _server_lines(doc)), ("What happened", _happened_lines(doc))):
        out.append("")
        out.append(title)
        width = max(len(k) for k, _ in rows)
        out.extend(f"  {k:<{width}}  {v}" for k, v in rows)
    spark = timeline_lines(doc)
    if spark:
        out += ["", "Timeline", *spark]
    if diag["levers"]:
        out.append("")
        out.append("Levers")
        line = _simulation_line(diag)
        if line:
            out.append(f"  {line}")
        said = (diag.get("simulation") or {}).get("why_not")
        out.extend(f"  - {_lever(lever, said)}" for lever in diag["levers"])
    inputs = ", ".join(f"{i['path']} ({i['lines']:,} lines)" for i in doc["inputs"])
    out.append("")
    out.append(f"Read: {inputs}")
    return "\n".join(out)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(doc: dict[str, Any]) -> str:
    """Markdown for pasting into an incident document."""
    diag = doc["diagnosis"]
    out = [
        "## vLLM postmortem (kvwatch analyze)",
        "",
        f"**Verdict: {diag['verdict'].replace('_', '-')}**{_cause_suffix(diag)}. {_md_cell(diag['summary'])}",
    ]
    per_engine = _engine_causes(diag)
    if per_engine:
        out += ["", f"Per engine: {_md_cell(per_engine)}."]
    for title, items in (("Advice", diag.get("advice")), ("Warnings", diag.get("warnings"))):
        if items:
            out += ["", f"### {title}", ""] + [f"- {_md_cell(str(item))}" for item in items]
    for title, rows in (("Server", _server_lines(doc)), ("What happened", _happened_lines(doc))):
        out += ["", f"### {title}", "", "| | |", "| --- | --- |"]
        out += [f"| {_md_cell(k.strip())} | {_md_cell(v)} |" for k, v in rows]
    spark = timeline_lines(doc)
    if spark:
        out += ["", "### Timeline", "", "```", *spark, "```"]
    if diag["levers"]:
        out += ["", "### Levers", ""]
        line = _simulation_line(diag)
        if line:
            out += [_md_cell(line[0].upper() + line[1:]) + ".", ""]
        said = (diag.get("simulation") or {}).get("why_not")
        out += [f"- {_md_cell(_lever(lever, said))}" for lever in diag["levers"]]
    out += ["", "Inputs: " + ", ".join(f"`{i['path']}` ({i['lines']:,} lines)" for i in doc["inputs"])]
    return "\n".join(out)
