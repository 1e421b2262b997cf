"""Where saved scrapes' times come from: their files' times only when the log of the same run leaves
room for what the scrapes' counters say was done between them (kvwatch.reconcile.evidence
order_scrapes / TokenRateBound).

The run is the real open-loop recording (tests/fixtures/vllm-cpu-openloop, vLLM 0.32.0 CPU): 20
scrapes over 188 s and the server's log. After a copy or a git checkout its files' times are the
copy's, milliseconds apart; the test sets them both ways on a copy. The fixture's "# scraped at" first
lines are read here, by the test, to give the files their true times; kvwatch never reads them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run

RUN = Path(__file__).parent / "fixtures" / "vllm-cpu-openloop"
SCRAPES = [*sorted(RUN.glob("metrics-[0-9]*.prom")), RUN / "metrics-final.prom"]
START = 1_796_000_000.0  # any epoch: only the spacing matters here


def _copy(tmp_path: Path, spacing: str) -> list[Path]:
    """The log and the scrapes, the scrapes' files stamped ``spacing``: "copy" (0.1 ms apart, in
    order, as a checkout writes them) or "true" (the instants the scrapes were taken)."""
    shutil.copy(RUN / "server.log", tmp_path / "server.log")
    out = [tmp_path / "server.log"]
    for i, src in enumerate(SCRAPES):
        dst = tmp_path / src.name
        shutil.copy(src, dst)
        m = re.match(r"# scraped at t=\+([\d.]+)s", src.read_text().splitlines()[0])
        assert m, src
        t = START + (float(m.group(1)) if spacing == "true" else i * 1e-4)
        os.utime(dst, (t, t))
        out.append(dst)
    return out


def _evidence(paths: list[Path], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = run(["analyze", "--format", "json", *map(str, paths)], capsys)
    assert code == 0, err
    evidence: dict[str, Any] = json.loads(out)["evidence"]
    return evidence


def test_file_times_a_copy_gave_are_not_taken_for_scrape_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 360,041 prompt tokens between the first and the last scrape; the log's fastest interval
    # processed ~3,556 tokens/s: 0.002 s of file times cannot hold them.
    ev = _evidence(_copy(tmp_path, "copy"), capsys)
    assert ev["metrics_time_source"] is None


def test_file_times_that_leave_room_for_the_counters_are_the_scrapes_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ev = _evidence(_copy(tmp_path, "true"), capsys)
    assert ev["metrics_time_source"] == "mtime"


def test_without_a_log_nothing_bounds_the_file_times(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The scrapes alone state no rate: distinct file times in the counters' order are still taken.
    scrapes = _copy(tmp_path, "copy")[1:]
    assert _evidence(scrapes, capsys)["metrics_time_source"] == "mtime"
