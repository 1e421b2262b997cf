"""``kvwatch watch`` (tail + scrape + reconcile + export) and ``kvwatch run`` (wrapper mode).

Flags and ``KVWATCH_*`` variables land in one ``WatchSettings`` (kvwatch.settings.load_settings,
which imports pydantic only for input it does not read itself); this module
builds the sources, the parser and the expectation from them and hands them to
``kvwatch.sidecar.Sidecar``.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import typer

from kvwatch import cli_options as opt
from kvwatch.errors import UsageError
from kvwatch.reconcile.saturation import DEFAULT_THRESHOLD, DEFAULT_WINDOW_SECONDS
from kvwatch.settings import WatchSettings, env_name, load_settings


def _opt(field: str, help_text: str, *flags: str, **kw: Any) -> Any:
    """A typer option whose help names the KVWATCH_* variable that also sets it."""
    return typer.Option(*flags, help=f"{help_text} (env {env_name(field)})", show_default=False, **kw)


LogOpt = Annotated[str | None, _opt("log", "vLLM log file to follow, or - for stdin.", "--log")]
MetricsOpt = Annotated[str | None, _opt("metrics_url", "vLLM /metrics URL to scrape.", "--metrics-url")]
ModelConfigOpt = Annotated[
    Path | None, _opt("model_config_path", "The model's config.json (or its folder).", "--model-config")
]
ModelOpt = Annotated[str | None, _opt("model", "Model id or catalogue name (instead of --model-config).", "--model")]
ListenOpt = Annotated[
    str | None, _opt("listen", "HOST:PORT for /metrics and /healthz (default 0.0.0.0:9400).", "--listen")
]
WebConfigOpt = Annotated[
    Path | None,
    _opt("web_config_file", "TLS/basic-auth config for /metrics (exporter-toolkit format).", "--web-config-file"),
]
IntervalOpt = Annotated[
    float | None, _opt("scrape_interval", "Seconds between /metrics scrapes (default 5).", "--scrape-interval")
]
ExpiryOpt = Annotated[
    int | None,
    _opt(
        "engine_expiry_scrapes",
        "Drop an engine /metrics stopped reporting after N scrapes (default: 5 min).",
        "--engine-expiry-scrapes",
    ),
]
TimeoutOpt = Annotated[
    float | None, _opt("scrape_timeout", "Seconds before a scrape is abandoned (default 3).", "--scrape-timeout")
]
TokenOpt = Annotated[str | None, _opt("bearer_token", "Bearer token for a protected /metrics.", "--bearer-token")]
InsecureOpt = Annotated[bool, _opt("insecure", "Skip TLS verification of --metrics-url.", "--insecure")]
CaOpt = Annotated[Path | None, _opt("ca_file", "CA bundle for --metrics-url.", "--ca-file")]
FromStartOpt = Annotated[bool, _opt("from_start", "Read the log from its start, not its end.", "--from-start")]
StateDirOpt = Annotated[Path | None, _opt("state_dir", "Keep the log position here across restarts.", "--state-dir")]
ReplayOpt = Annotated[Path | None, _opt("replay", "Replay a saved log at its recorded pace.", "--replay")]
SpeedOpt = Annotated[float | None, _opt("speed", "Replay pace multiplier (default 1).", "--speed")]
_WINDOW_HELP = f"Saturation window W in seconds (default {DEFAULT_WINDOW_SECONDS:g})."
_THRESHOLD_HELP = f"KV usage peak 0..1 for memory_bound (default {DEFAULT_THRESHOLD:g})."
WindowOpt = Annotated[float | None, _opt("window", _WINDOW_HELP, "--window")]
ThresholdOpt = Annotated[float | None, _opt("threshold", _THRESHOLD_HELP, "--threshold")]
MaxSeqsOpt = Annotated[
    int | None, _opt("max_num_seqs", "vLLM's max_num_seqs if the log does not say.", "--max-num-seqs")
]
DtypeOpt = Annotated[str | None, _opt("kv_cache_dtype", "KV cache dtype if the log does not say.", "--kv-cache-dtype")]
TpOpt = Annotated[
    int | None, _opt("tensor_parallel_size", "TP size if the log does not say.", "--tensor-parallel-size")
]


def _settings(**flags: Any) -> WatchSettings:
    """The command's flags (named as its parameters) over KVWATCH_* variables over defaults."""
    if "model_config" in flags:  # --model-config; the settings field avoids pydantic's model_ namespace
        flags["model_config_path"] = flags.pop("model_config")
    # Unset flags (None, or a boolean flag left off) leave the field to KVWATCH_* or the default.
    given = {k: v for k, v in flags.items() if v is not None and v is not False}
    return load_settings(given)


def watch(
    log: LogOpt = None,
    metrics_url: MetricsOpt = None,
    model_config: ModelConfigOpt = None,
    model: ModelOpt = None,
    listen: ListenOpt = None,
    web_config_file: WebConfigOpt = None,
    scrape_interval: IntervalOpt = None,
    scrape_timeout: TimeoutOpt = None,
    engine_expiry_scrapes: ExpiryOpt = None,
    bearer_token: TokenOpt = None,
    insecure: InsecureOpt = False,
    ca_file: CaOpt = None,
    from_start: FromStartOpt = False,
    state_dir: StateDirOpt = None,
    replay: ReplayOpt = None,
    speed: SpeedOpt = None,
    window: WindowOpt = None,
    threshold: ThresholdOpt = None,
    max_num_seqs: MaxSeqsOpt = None,
    kv_cache_dtype: DtypeOpt = None,
    tensor_parallel_size: TpOpt = None,
) -> None:
    """The sidecar: tail vLLM's log, scrape its /metrics, reconcile, export kvwatch_* metrics."""
    settings = _settings(**locals())
    if settings.log is None and settings.replay is None and settings.metrics_url is None:
        raise UsageError("nothing to watch: give --log FILE (or -), --replay FILE, and/or --metrics-url URL")
    from kvwatch.sidecar import build_sidecar, line_source_for

    sidecar = build_sidecar(settings, line_source_for(settings))
    _serve_until_signal(sidecar)


def run(ctx: typer.Context, **flags: Any) -> None:
    """Wrapper mode: start vLLM as a child (after --), pass its output through, read and export it."""
    argv = list(ctx.args)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("no command to run: kvwatch run [watch options] -- vllm serve MODEL ...")
    settings = _settings(**flags)
    from kvwatch.sidecar import build_sidecar, child_process

    # Everything that can refuse (settings, model, --listen) is checked before vLLM starts, so a
    # usage error never leaves an orphaned server behind.
    child = child_process(argv)
    sidecar = build_sidecar(settings, child.lines, log_name=f"the output of {argv[0]}")
    # From here kvwatch's own lines go through the child's pass-through gate: never inside a child's line.
    own_log = logging.getLogger("kvwatch")
    own_log.handlers[:] = [child.log_handler(own_log.handlers[0].formatter if own_log.handlers else None)]
    try:
        child.start()
    except BaseException:
        sidecar.stop()
        raise
    code = child.wait()
    sidecar.log_finished.wait(timeout=5)
    sidecar.stop()
    raise typer.Exit(code)


# What picks the log source of ``watch``: ``run`` reads its child's output instead.
_LOG_SOURCE_OPTIONS = ("log", "from_start", "state_dir", "replay", "speed")


opt.share_options(run, watch, _LOG_SOURCE_OPTIONS)


def _serve_until_signal(sidecar: Any) -> None:
    stop = threading.Event()

    def handle(signum: int, _frame: object) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handle)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        sidecar.stop()
    sys.exit(0)
