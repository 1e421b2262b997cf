"""One reading at scale: a >= 1 GB log of the real fixtures holds every run, error and stats record.

Builds one "set": every real log under tests/fixtures/real*/logs, each followed by 300-3,000 lines
of access-log filler (records far from one another, crashes far from any "cache" line), and
repeats the set until the file passes --gb. Then ``kvwatch analyze --format json`` on it (the real
command, default workers) must report, per set, exactly what the set's fixtures give read alone:

* stats records: the sum over the fixtures of ``analyze``'s stats.count on each alone;
* errors: the sum of their errors_total;
* runs: every run start each fixture gives alone, plus the one that a fixture's own first start
  becomes once another log precedes it (counted on one set by tests/test_one_reading.py's rule).

    .venv/bin/python benchmarks/one_reading.py [--gb 1.0] [--dir /tmp/kvwatch-bench]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "benchmarks"))

from gen_log import ACCESS_FILLER as FILLER  # noqa: E402  (benchmarks/ is not a package)
from gen_log import real_logs  # noqa: E402

from kvwatch.batch import analyze_paths  # noqa: E402

KVWATCH = str(Path(sys.executable).with_name("kvwatch"))


def _one_set(rng: random.Random) -> bytes:
    out: list[bytes] = []
    for log in real_logs(REPO):
        out.append(log)
        out.append("".join(FILLER.format(n=rng.randint(1, 254)) for _ in range(rng.randint(300, 3000))).encode())
    return b"".join(out)


def main() -> int:
    """Build the log, run kvwatch on it, compare, print the figures (and one JSON line)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--dir", default="/tmp/kvwatch-bench")
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    one = _one_set(random.Random(12))
    copies = int(-(-args.gb * 1e9 // len(one)))
    set_path, two_path, big = d / "real-set.log", d / "real-set-x2.log", d / f"real-sets-{args.gb:g}gb.log"
    set_path.write_bytes(one)
    two_path.write_bytes(one + one)
    if not big.exists() or big.stat().st_size != copies * len(one):
        with big.open("wb") as out:
            for _ in range(copies):
                out.write(one)
    alone = [
        analyze_paths([str(p)])
        for dd in ("real", "real-extra")
        for p in sorted((REPO / "tests/fixtures" / dd / "logs").glob("*"))
        if p.is_file()
    ]
    per_set_stats = sum(doc["stats"]["count"] for doc in alone)
    per_set_errors = sum(doc["errors_total"] for doc in alone)
    runs_one = analyze_paths([str(set_path)])["runs"]
    runs_per_set = analyze_paths([str(two_path)])["runs"] - runs_one  # each later set's runs
    t0 = time.perf_counter()
    run = subprocess.run([KVWATCH, "analyze", "--format", "json", str(big)], capture_output=True, check=True)
    wall = time.perf_counter() - t0
    doc = json.loads(run.stdout)
    expected = {
        "stats": copies * per_set_stats,
        "errors": copies * per_set_errors,
        "runs": runs_one + (copies - 1) * runs_per_set,
    }
    got = {"stats": doc["stats"]["count"], "errors": doc["errors_total"], "runs": doc["runs"]}
    result = {
        "bytes": big.stat().st_size,
        "lines": doc["inputs"][0]["lines"],
        "sets": copies,
        "fixtures_per_set": len(alone),
        "expected": expected,
        "found": got,
        "every_record_found": got == expected,
        "wall_s": round(wall, 1),
    }
    print(f"{big}: {result['bytes'] / 1e9:.2f} GB, {result['lines']:,} lines, {copies} sets of {len(alone)} logs")
    for k, want in expected.items():
        print(f"  {k:6s} expected {want:>8,}  found {got[k]:>8,}  {'ok' if got[k] == want else 'MISSED'}")
    print(f"  kvwatch analyze took {wall:.1f} s")
    print(json.dumps(result))
    return 0 if got == expected else 1


if __name__ == "__main__":
    sys.exit(main())
