"""`kvwatch fleet`: GPUs for a peak of concurrent conversations, with a sensitivity table."""

from __future__ import annotations

import json

import pytest

from kvwatch.cli import main
from kvwatch.errors import UsageError
from kvwatch.reconcile.fleet import gpus_needed, plan_fleet


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err


@pytest.mark.parametrize(
    ("avg_context", "gpus"),
    [(8_000, 66), (4_000, 33), (32_000, 263)],
    ids=["8k_context_66_gpus", "4k_context_33_gpus", "32k_context_263_gpus"],
)
def test_issue_reference_fleet(avg_context: int, gpus: int) -> None:
    assert gpus_needed(10_000, avg_context, 50_000, 61 * 10**9) == gpus


def test_exact_fit_does_not_round_up() -> None:
    assert gpus_needed(10, 100, 1_000, 1_000_000) == 1
    assert gpus_needed(10, 100, 1_000, 999_999) == 2


def test_fleet_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        [
            "fleet",
            "--peak-concurrent",
            "10000",
            "--avg-context",
            "8000",
            "--kv-bytes-per-token",
            "50000",
            "--usable-cache-gb",
            "61",
            "--format",
            "json",
        ],
        capsys,
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["schema"] == "kvwatch.fleet/1"
    assert doc["gpus"] == 66
    assert doc["cache_needed_bytes"] == 10_000 * 8_000 * 50_000
    assert doc["per_request_bytes"] == 8_000 * 50_000
    assert doc["sensitivity"] == [
        {"avg_context": 4000, "gpus": 33},
        {"avg_context": 8000, "gpus": 66},
        {"avg_context": 32000, "gpus": 263},
    ]


def test_fleet_from_a_model_and_gib(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        [
            "fleet",
            "--peak-concurrent",
            "100",
            "--avg-context",
            "8192",
            "--model",
            "llama-3.1-8b",
            "--usable-cache-gib",
            "64",
            "--sensitivity",
            "1024,16384",
            "--format",
            "json",
        ],
        capsys,
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["kv_bytes_per_token"] == 131_072
    assert doc["gpus"] == 2  # 100 x 8,192 x 128 KiB = 100 GiB over 64 GiB per card
    assert [s["gpus"] for s in doc["sensitivity"]] == [1, 4]


def test_fleet_text_shows_the_sensitivity_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        [
            "fleet",
            "--peak-concurrent",
            "10000",
            "--avg-context",
            "8000",
            "--kv-bytes-per-token",
            "50000",
            "--usable-cache-gb",
            "61",
        ],
        capsys,
    )
    assert code == 0
    assert "GPUs              66" in out
    assert "32,000       263" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-bytes-per-token", "50000", "--model", "llama-3.1-8b", "--usable-cache-gb", "61"], "exactly one of"),
        (["--kv-bytes-per-token", "50000"], "--usable-cache-gib and --usable-cache-gb"),
        (["--kv-bytes-per-token", "50000", "--usable-cache-gb", "61", "--sensitivity", "4k,8k"], "--sensitivity"),
        (["--kv-bytes-per-token", "0", "--usable-cache-gb", "61"], "--kv-bytes-per-token must be positive"),
    ],
    ids=["bytes_and_model", "no_usable_cache", "bad_sensitivity", "zero_bytes"],
)
def test_fleet_bad_flags_are_one_line_usage_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(["fleet", "--peak-concurrent", "10", "--avg-context", "100", *args], capsys)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1


def test_plan_refuses_non_positive_sensitivity() -> None:
    with pytest.raises(UsageError, match="positive context lengths"):
        plan_fleet(peak_concurrent=1, avg_context=1, kv_bytes_per_token=1, usable_cache_bytes=1, sensitivity=(0,))
