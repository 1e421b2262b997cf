"""Plain option values are coerced without pydantic, to exactly what typer's own adapter gives.

kvwatch.cli_coercion takes the values that need no validation library (a string, a default of its
own type, a decimal number within its bounds, a choice by its value) and hands everything else to
typer's pydantic adapter, so results and error messages stay typer's. These tests compare the two
paths value by value, check that the start-up of ``capacity`` and ``snapshot`` no longer imports
pydantic, and that a bad value still gets typer's own words.
"""

from __future__ import annotations

import os
import subprocess
import sys
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
from typer import _coercion
from typer.models import ArgumentInfo, OptionInfo

from kvwatch import cli_coercion

FIXTURES = Path(__file__).parent / "fixtures"
SCRAPE = FIXTURES / "real" / "metrics" / "106-v033-cache-config-info-curl.prom"


class Colour(StrEnum):
    red = "red"
    dark_blue = "dark-blue"


CASES: list[tuple[str, Any, Any, Any]] = [
    ("str", str, OptionInfo(), "meta-llama/Llama-3.1-8B-Instruct"),
    ("str-empty", str, OptionInfo(), ""),
    ("str-unicode", str, OptionInfo(), "模型"),
    ("int", int, OptionInfo(), "42"),
    ("int-zero", int, OptionInfo(), "0"),
    ("int-default", int, OptionInfo(), 7),
    ("int-at-min", int, OptionInfo(min=1), "1"),
    ("int-big", int, OptionInfo(), "123456789012345678"),
    ("float", float, OptionInfo(), "0.92"),
    ("float-integral", float, OptionInfo(), "5"),
    ("float-long-fraction", float, OptionInfo(), "0.100000000000000005"),
    ("float-default", float, OptionInfo(), 0.9),
    ("float-within-bounds", float, OptionInfo(min=0.0, max=1.0), "1.0"),
    ("enum-member", Colour, OptionInfo(), Colour.red),
    ("enum-by-value", Colour, OptionInfo(), "dark-blue"),
    ("list-of-str", list[str], ArgumentInfo(), ("a.log", "b.log.gz", "-")),
    ("path-absent", Path, OptionInfo(), "/nonexistent/state"),
    ("path-relative", Path, OptionInfo(), "x.json"),
    ("path-existing-dir", Path, OptionInfo(), str(FIXTURES)),
    ("path-existing-file", Path, ArgumentInfo(), str(SCRAPE)),
    ("path-dash", Path, OptionInfo(), "-"),
    ("path-tilde", Path, OptionInfo(), "~/models/llama"),
]


def _typer_own(annotation: Any, info: Any, value: Any) -> Any:
    """What typer's pydantic-backed runtime param gives for ``value``."""
    descriptor = _coercion.resolve_type_descriptor(annotation, info)
    return _coercion.build_runtime_param(descriptor)._coerce_value(value, param=None, ctx=None)


@pytest.mark.parametrize(("annotation", "info", "value"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_plain_value_is_coerced_to_what_typer_s_adapter_gives(annotation: Any, info: Any, value: Any) -> None:
    class Ctx:
        token_normalize_func = None

    ours = cli_coercion.plain_value(annotation, info, value, Ctx())
    assert ours is not cli_coercion._NO
    theirs = _typer_own(annotation, info, value)
    assert (type(ours), ours) == (type(theirs), theirs)


@pytest.mark.parametrize(
    ("annotation", "info", "value"),
    [
        (int, OptionInfo(), "-3"),  # a sign
        (int, OptionInfo(), "1_000"),  # what pydantic may read otherwise
        (int, OptionInfo(), " 5"),
        (int, OptionInfo(), "007"),
        (int, OptionInfo(min=1), "0"),  # out of bounds: typer's message
        (int, OptionInfo(clamp=True, max=3), "9"),
        (float, OptionInfo(), "1e3"),
        (float, OptionInfo(), "inf"),
        (float, OptionInfo(), 5),  # an int for a float: pydantic converts it
        (str, OptionInfo(), b"bytes"),
        (Path, OptionInfo(), ""),  # Path("."): pydantic's reading
        (Path, OptionInfo(exists=True), "x.json"),  # a check typer makes
        (Path, OptionInfo(resolve_path=True), "x.json"),
        (Path, OptionInfo(dir_okay=False), "x.json"),
        (Path, OptionInfo(), Path("x.json")),
        (Colour, OptionInfo(case_sensitive=False), "RED"),
        (Colour, OptionInfo(), "dark_blue"),  # a member's name, not its value
        (bool, OptionInfo(), "yes"),
        (list[int], ArgumentInfo(), ("1",)),
    ],
    ids=lambda v: repr(v)[:30],
)
def test_any_other_value_goes_to_typer_s_adapter(annotation: Any, info: Any, value: Any) -> None:
    class Ctx:
        token_normalize_func = None

    assert cli_coercion.plain_value(annotation, info, value, Ctx()) is cli_coercion._NO


_IMPORTS = """
import contextlib, io, sys
from kvwatch.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit as exc:
        assert not exc.code, exc.code
print("pydantic" in sys.modules)
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["capacity", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--kv-cache-gib", "5"],
        ["capacity", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--kv-cache-gib", "5", "--format", "json"],
        ["snapshot", str(SCRAPE)],
    ],
    ids=["help", "capacity", "capacity-json", "snapshot-of-a-saved-file"],
)
def test_these_commands_start_without_pydantic(argv: list[str]) -> None:
    out = subprocess.run([sys.executable, "-c", _IMPORTS, *argv], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_a_bad_value_still_gets_typer_s_own_message() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvwatch", "analyze", "--jobs", "0", str(SCRAPE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1  # one line (docs/contracts.md)
    assert "--jobs" in out.stderr
    assert "greater than or equal to 1" in out.stderr  # pydantic's words, through typer's adapter


def test_an_existing_path_that_cannot_be_read_goes_to_typer_s_adapter(tmp_path: Path) -> None:
    locked = tmp_path / "locked.json"
    locked.write_text("{}")
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):  # root reads anything: then typer finds it readable too
            assert cli_coercion.plain_value(Path, OptionInfo(), str(locked), None) == locked
        else:
            assert cli_coercion.plain_value(Path, OptionInfo(), str(locked), None) is cli_coercion._NO
    finally:
        locked.chmod(0o600)


def test_watch_with_a_state_dir_and_model_config_starts_without_pydantic(tmp_path: Path) -> None:
    """Kubernetes runs the sidecar with --state-dir (deploy/kubernetes/deployment.yaml)."""
    probe = (
        "import functools, sys\n"
        "from kvwatch.cli import _single\n"
        "from kvwatch.commands import watch\n"
        "watch.watch = functools.wraps(watch.watch)(lambda **kw: print(kw['state_dir'], kw['model_config']))\n"
        "_single('watch')(args=sys.argv[1:], prog_name='kvwatch', standalone_mode=False)\n"
        "print('pydantic' in sys.modules)\n"
    )
    config = tmp_path / "config.json"
    config.write_text("{}")
    args = ["watch", "--log", "x.log", "--state-dir", str(tmp_path), "--model-config", str(config)]
    out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines() == [f"{tmp_path} {config}", "False"]
