"""The sidecar's settings read without pydantic mean what pydantic-settings makes of them.

kvwatch.settings reads plain flags and ``KVWATCH_*`` variables itself and hands anything else to
the pydantic-settings model of the same fields (kvwatch.settings_model). Each case below goes both
ways: the same settings, or the same one-line error. A sidecar that reads only plain input never
imports pydantic (its ~24 MiB of resident memory: benchmarks/footprint.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvwatch.errors import UsageError
from kvwatch.settings import FIELDS, WatchSettings, env_names, load_settings
from kvwatch.settings_model import settings_model, validated

_ENV_TEXTS = {
    # numbers: plain decimals, and what only pydantic's lax parsing defines
    "KVWATCH_SCRAPE_INTERVAL": ["2", "2.5", "0.25", "10", "0", "-1", "1e1", " 2 ", "1_0", "inf", "nan", "", "x", "02"],
    "KVWATCH_THRESHOLD": ["0.9", "1", "1.0", "1.5", "0", "0.0"],
    "KVWATCH_MAX_NUM_SEQS": ["64", "0", "007", "1_0", "-3", "2.0", "2.5", "", "99999999999999999999", " 8"],
    # booleans: the words kvwatch reads itself, and the rest of pydantic's (t, y, ...) and non-words
    "KVWATCH_FROM_START": ["1", "0", "true", "false", "True", "FALSE", "yes", "no", "on", "off", "t", "y", "", "2"],
    "KVWATCH_INSECURE": ["true", "Yes", "maybe"],
    # strings and paths, as given
    "KVWATCH_LOG": ["/var/log/vllm.log", "-", "", " spaced ", "ünïcode.log"],
    "KVWATCH_STATE_DIR": ["/tmp/state", "", "relative/dir"],
    "KVWATCH_LISTEN": ["127.0.0.1:9400", "[::1]:9400", "nonsense", ":9400", "host:70000", "host:"],
    # the model config field's three names (alias choices, then the prefixed field name)
    "KVWATCH_MODEL_CONFIG": ["/models/llama/config.json"],
    "MODEL_CONFIG_PATH": ["/models/qwen"],
    "KVWATCH_MODEL_CONFIG_PATH": ["/models/c"],
    # names pydantic-settings matches without regard to case
    "kvwatch_speed": ["4"],
    "Kvwatch_Window": ["30"],
}
ENV_CASES = [(name, text) for name, texts in _ENV_TEXTS.items() for text in texts]

FLAG_CASES: list[dict[str, Any]] = [
    {},
    {"log": "/x.log", "metrics_url": "http://127.0.0.1:8000/metrics", "listen": "127.0.0.1:9401"},
    {"scrape_interval": 2.0, "scrape_timeout": 1, "window": 30.0, "threshold": 1.0},
    {"scrape_interval": 0.0},
    {"scrape_interval": float("nan")},
    {"threshold": 1.01},
    {"max_num_seqs": 0},
    {"max_num_seqs": 256, "tensor_parallel_size": 2, "engine_expiry_scrapes": 3},
    {"insecure": True, "from_start": True, "ca_file": Path("/ca.pem"), "state_dir": Path("/state")},
    {"model_config_path": Path("/m/config.json"), "model": "meta-llama/Llama-3.1-8B-Instruct"},
    {"replay": Path("/saved.log"), "log": "/x.log"},
    {"replay": Path("/saved.log"), "speed": 10.0},
    {"listen": "nonsense"},
    {"listen": "host:65536"},
    {"bearer_token": "s3cr3t", "kv_cache_dtype": "fp8"},
    {"no_such_setting": 1},
]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No variable that could set a field, whatever the machine running the tests has set."""
    names = {n for f in FIELDS for n in env_names(f)}
    for key in list(os.environ):
        if key.lower() in names:
            monkeypatch.delenv(key)
    return monkeypatch


def _outcome(read: Any, flags: dict[str, Any]) -> WatchSettings | str:
    try:
        result: WatchSettings = read(flags)
    except UsageError as exc:
        return f"error: {exc}"
    return result


@pytest.mark.parametrize(("name", "text"), ENV_CASES, ids=[f"{n}={t!r}" for n, t in ENV_CASES])
def test_a_variable_means_what_pydantic_settings_makes_of_it(
    clean_env: pytest.MonkeyPatch, name: str, text: str
) -> None:
    clean_env.setenv(name, text)
    assert _outcome(load_settings, {}) == _outcome(validated, {})


@pytest.mark.parametrize("flags", FLAG_CASES, ids=[",".join(f) or "none" for f in FLAG_CASES])
def test_a_flag_means_what_pydantic_settings_makes_of_it(clean_env: pytest.MonkeyPatch, flags: dict[str, Any]) -> None:
    got, want = _outcome(load_settings, flags), _outcome(validated, flags)
    if isinstance(got, str) or isinstance(want, str):
        assert got == want
    else:  # nan != nan: compare the fields' texts
        assert repr(got) == repr(want)


def test_a_flag_wins_over_its_variable_and_the_first_alias_over_the_others(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("KVWATCH_LISTEN", "10.0.0.1:9400")
    clean_env.setenv("KVWATCH_MODEL_CONFIG_PATH", "/third")
    clean_env.setenv("KVWATCH_MODEL_CONFIG", "/second")
    clean_env.setenv("MODEL_CONFIG_PATH", "/first")
    for read in (load_settings, validated):
        settings = read({"listen": "127.0.0.1:9500"})
        assert settings.listen == "127.0.0.1:9500"
        assert settings.model_config_path == Path("/first")


def test_each_field_is_read_from_the_variables_pydantic_settings_reads() -> None:
    from pydantic_settings import EnvSettingsSource

    model = settings_model()
    source = EnvSettingsSource(model)
    for f in FIELDS:
        looked_up = tuple(
            name for _key, name, _complex in source._extract_field_info(model.model_fields[f.name], f.name)
        )
        assert env_names(f) == looked_up, f.name


def test_the_model_has_the_fields_defaults_and_bounds_of_the_settings() -> None:
    model = settings_model()
    assert list(model.model_fields) == [f.name for f in FIELDS]
    assert model().model_dump() == {f.name: f.default for f in FIELDS}
    assert WatchSettings() == validated({})


_PROBE = """
import sys
from kvwatch.commands.watch import _settings
import kvwatch.sidecar
s = _settings(log=sys.argv[1], listen="127.0.0.1:9400", scrape_interval=2.0, from_start=True, insecure=False)
print(s.log, sorted(m for m in ("pydantic", "pydantic_settings", "pydantic_core") if m in sys.modules))
"""


def test_the_sidecar_with_plain_settings_never_imports_pydantic(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("KVWATCH_")}
    env.update({"KVWATCH_SCRAPE_TIMEOUT": "2", "KVWATCH_METRICS_URL": "http://127.0.0.1:8000/metrics"})
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path / "vllm.log")], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.split() == [str(tmp_path / "vllm.log"), "[]"]
