"""CPU per followed line of the sidecar's whole log step, ``Sidecar.read_log_once``, by log form.

What the sidecar's log thread does for each batch: the follower's read and line split, the
scanner, the parser, the state, the position commit. Lines are benchmarks/footprint.py's (access
and "Received request" lines, a stats record now and then), as a plain log or as a kubelet's CRI
file (``--form cri``: a uvicorn warning on stderr every 100 lines), appended ``--batch`` lines at
a time before each ``read_log_once`` (500: what a 100 ms poll finds at 5,000 lines/s). The CPU is
this process's, per line, median of ``--runs``; at 5,000 lines/s, 1 us a line is 0.5 % of a core.

``--baseline-src DIR`` runs an older kvwatch (a directory holding its ``kvwatch/`` package, e.g.
``git archive REV kvwatch | tar -x -C DIR``) on the same lines, interleaved run by run.

    .venv/bin/python benchmarks/followed_path_cost.py [--form plain|cri] [--lines 100000] [--runs 5]
        [--baseline-src DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# One measurement, run in a fresh interpreter whose sys.path starts with the tree under test.
_ONE = r"""
import json, os, random, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, {bench!r})
from footprint import FORMS, filler, stats_line
from kvwatch.settings import WatchSettings
from kvwatch import sidecar as sc
form, lines, batch = {form!r}, {lines}, {batch}
random.seed(1)
texts = []
for i in range(1, lines + 1):
    periodic = i % 50_000 == 0
    texts.append(FORMS[form](1 if periodic else i, stats_line(40) if periodic else filler(i)))
chunks = ["".join(texts[i : i + batch]) for i in range(0, lines, batch)]
d = Path(tempfile.mkdtemp())
log = d / "vllm.log"
log.write_text("")
settings = WatchSettings(log=log, listen="127.0.0.1:0", state_dir=d / "state")
side = sc.build_sidecar(settings, sc.line_source_for(settings))
spent = 0.0
with log.open("a") as fh:
    for n, chunk in enumerate(chunks):
        fh.write(chunk)
        fh.flush()
        t0 = time.process_time()
        side.read_log_once()
        if n >= 20:  # after a warm-up
            spent += time.process_time() - t0
print(json.dumps({{"us_per_line": spent / ((len(chunks) - 20) * batch) * 1e6}}))
"""


def _one(src: Path, form: str, lines: int, batch: int) -> float:
    code = _ONE.format(bench=str(HERE), form=form, lines=lines, batch=batch)
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=tempfile.gettempdir()
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["us_per_line"])


def main() -> int:
    """Print the CPU per line (and the share of a core at 5,000 lines/s) of this tree and the baseline."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--form", choices=("plain", "cri"), default="cri")
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline-src", type=Path, default=None)
    args = ap.parse_args()
    trees = {"this tree": REPO} | ({"baseline": args.baseline_src} if args.baseline_src else {})
    got: dict[str, list[float]] = {name: [] for name in trees}
    random.seed(time.time())
    for _ in range(args.runs):  # interleaved, so both see the same machine load
        for name, src in trees.items():
            got[name].append(_one(src, args.form, args.lines, args.batch))
    result = {name: round(statistics.median(v), 2) for name, v in got.items()}
    print(f"{args.form} log, {args.batch}-line batches, median of {args.runs}:")
    for name, us in result.items():
        print(f"  {name:10s} {us:5.2f} us CPU per line = {us * 5000 / 1e4:4.2f} % of a core at 5,000 lines/s")
    if "baseline" in result:
        print(f"  ratio {result['this tree'] / result['baseline']:.2f}")
    print(json.dumps({"form": args.form, "us_per_line": result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
