"""The sidecar's settings in one place: defaults, types, validation, ``KVWATCH_*`` environment names.

``kvwatch watch`` and ``kvwatch run`` build a ``WatchSettings`` from the flags the user gave;
pydantic-settings fills every other field from ``KVWATCH_<FIELD>`` environment variables, then
the defaults here. ``--help`` shows each flag's variable (``env_name``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kvwatch.reconcile.saturation import DEFAULT_THRESHOLD, DEFAULT_WINDOW_SECONDS

ENV_PREFIX = "KVWATCH_"


def env_name(field: str) -> str:
    """The environment variable that sets ``field``."""
    return f"{ENV_PREFIX}{field.removesuffix('_path').upper()}"


class WatchSettings(BaseSettings):
    """Everything ``kvwatch watch`` / ``kvwatch run`` can be told."""

    # protected_namespaces=(): "model" here is the LLM, not pydantic's model_* namespace.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", frozen=True, populate_by_name=True, protected_namespaces=()
    )

    log: str | None = Field(None, description="vLLM log file to follow, or - for stdin")
    metrics_url: str | None = Field(None, description="vLLM /metrics URL to scrape")
    model_config_path: Path | None = Field(
        None,
        description="the model's config.json (or its folder)",
        validation_alias=AliasChoices("model_config_path", "KVWATCH_MODEL_CONFIG"),
    )
    model: str | None = Field(None, description="model id or catalogue name, instead of --model-config")
    listen: str = Field("0.0.0.0:9400", description="HOST:PORT for kvwatch's /metrics and /healthz")
    web_config_file: Path | None = Field(
        None, description="Prometheus exporter-toolkit web config (TLS, basic auth) for kvwatch's /metrics"
    )
    scrape_interval: float = Field(5.0, gt=0, description="seconds between /metrics scrapes")
    scrape_timeout: float = Field(3.0, gt=0, description="seconds before a scrape is abandoned")
    engine_expiry_scrapes: int | None = Field(
        None, gt=0, description="drop an engine /metrics stopped reporting after this many scrapes (default: 5 min)"
    )
    bearer_token: str | None = Field(None, description="bearer token for a protected /metrics", repr=False)
    insecure: bool = Field(False, description="skip TLS certificate verification for --metrics-url")
    ca_file: Path | None = Field(None, description="CA bundle to verify --metrics-url's certificate")
    from_start: bool = Field(False, description="read the log from its start instead of its end")
    state_dir: Path | None = Field(None, description="where the log position is kept across restarts")
    poll_interval: float = Field(1.0, gt=0, description="seconds between log polls when no file event comes")
    replay: Path | None = Field(None, description="feed a saved log through the pipeline at its recorded pace")
    speed: float = Field(1.0, gt=0, description="replay pace multiplier (10 = ten times faster)")
    window: float = Field(DEFAULT_WINDOW_SECONDS, gt=0, description="saturation window W in seconds")
    threshold: float = Field(
        DEFAULT_THRESHOLD, gt=0, le=1, description="KV usage peak (0..1) that makes waiting memory-bound"
    )
    max_num_seqs: int | None = Field(None, gt=0, description="vLLM's max_num_seqs when the log does not state it")
    kv_cache_dtype: str | None = Field(None, description="KV cache dtype when the log does not state it")
    tensor_parallel_size: int | None = Field(None, gt=0, description="TP size when the log does not state it")

    @field_validator("listen")
    @classmethod
    def _listen_is_host_port(cls, value: str) -> str:
        _, sep, port = value.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError(f"{value!r} is not HOST:PORT (e.g. 0.0.0.0:9400)")
        return value

    @model_validator(mode="after")
    def _one_model_source(self) -> WatchSettings:
        if self.model_config_path is not None and self.model is not None:
            raise ValueError("give --model-config or --model, not both")
        if self.replay is not None and self.log is not None:
            raise ValueError("give --log or --replay, not both")
        return self
