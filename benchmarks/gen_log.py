"""Generate a realistic large vLLM server log for the analyze speed benchmark.

Shape (per 100 lines, roughly): 45 uvicorn access lines, 22 "Received request ... prompt: '...'"
lines (with SamplingParams), 22 "Added request" lines, 8 other INFO/WARNING lines, 3 periodic stats
records from two data-parallel engines; a full startup block (copied from the real vLLM CPU run's
shapes) at the start and after every 500,000 lines (a restart). Prefixes are mixed the way real
deployments mix them: plain, ``(APIServer pid=N)``, ANSI-coloured, and docker RFC3339 stamps.

    python benchmarks/gen_log.py OUT.log [--lines 2000000] [--seed 7]

Deterministic for a given seed. Writes in large blocks; memory stays small.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

WORDS = tuple(
    " ".join(
        (
            "the quick brown fox jumps over lazy dog summarize this report explain why answer briefly",
            "translate into french write python function sort list given numbers customer support ticket",
            "refund order delivery late please help weather tomorrow tokyo story about dragon poem",
        )
    ).split(" ")
)

STARTUP = [
    "INFO {ts} [api_utils.py:286] non-default args: {{'model_tag': 'meta-llama/Llama-3.1-8B-Instruct', "
    "'max_model_len': 32768, 'gpu_memory_utilization': 0.92, 'max_num_seqs': 128, 'data_parallel_size': 2}}",
    "INFO {ts} [startup.py:38] vLLM server version 0.33.0, serving model meta-llama/Llama-3.1-8B-Instruct",
    "INFO {ts} [core.py:133] Initializing a V1 LLM engine (v0.33.0) with config: "
    "model='meta-llama/Llama-3.1-8B-Instruct', "
    "speculative_config=None, tokenizer='meta-llama/Llama-3.1-8B-Instruct', skip_tokenizer_init=False, "
    "tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, "
    "max_seq_len=32768, download_dir=None, load_format=auto, tensor_parallel_size=1, pipeline_parallel_size=1, "
    "data_parallel_size=2, disable_custom_all_reduce=False, quantization=None, enforce_eager=False, "
    "kv_cache_dtype=auto, device_config=cuda, seed=0, served_model_name=meta-llama/Llama-3.1-8B-Instruct, "
    "enable_prefix_caching=True, enable_chunked_prefill=True, pooler_config=None, compilation_config={{'level': 3}}",
    "INFO {ts} [gpu_model_runner.py:5089] Model loading took 14.99 GiB memory and 6.123456 seconds",
    "INFO {ts} [gpu_worker.py:298] Available KV cache memory: 54.71 GiB",
    "INFO {ts} [kv_cache_utils.py:1146] GPU KV cache size: 448,224 tokens, Maximum concurrency for 32,768 tokens "
    "per request: 13.68x",
    "INFO {ts} [core.py:402] init engine (profile, create kv cache, warmup model) took 41.20 s",
    "INFO {ts} [entry.py:140] Starting vLLM server on http://0.0.0.0:8000",
]


def _prefix(rng: random.Random, t: float, style: int) -> str:
    """One of the prefix layouts real deployments produce."""
    if style == 0:
        return ""
    if style == 1:
        return "(APIServer pid=2871) "
    if style == 2:
        return "\x1b[1;36m(APIServer pid=2871)\x1b[0;0m "
    sec = t % 60
    minute = int(t // 60) % 60
    hour = int(t // 3600) % 24
    return f"2026-11-{29 + int(t // 86400):02d}T{hour:02d}:{minute:02d}:{sec:09.6f}Z (APIServer pid=1) "


def _ts(t: float) -> str:
    return f"11-{29 + int(t // 86400):02d} {int(t // 3600) % 24:02d}:{int(t // 60) % 60:02d}:{int(t) % 60:02d}"


def generate(path: str, lines: int, seed: int = 7) -> None:
    """Write ``lines`` lines to ``path``."""
    rng = random.Random(seed)
    t = 8 * 3600.0
    next_stats = t + 10
    out: list[str] = []
    n = 0
    style = 1
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        while n < lines:
            if n % 500_000 == 0:
                style = (style + 1) % 4  # a restart may come with another log shipper
                for tmpl in STARTUP:
                    out.append(_prefix(rng, t, style) + tmpl.format(ts=_ts(t)))
                    n += 1
            t += rng.random() * 0.3  # ~67 lines per 10 s stats interval: stats are ~3 % of lines
            p = _prefix(rng, t, style)
            r = rng.random()
            if t >= next_stats:
                next_stats += 10
                for engine in (0, 1):
                    running = rng.randint(20, 128)
                    waiting = rng.choice((0, 0, 0, rng.randint(1, 40)))
                    out.append(
                        f"{p}INFO {_ts(t)} [loggers.py:336] Engine {engine:03d}: Avg prompt throughput: "
                        f"{rng.random() * 9000:.1f} tokens/s, Avg generation throughput: {rng.random() * 3000:.1f} "
                        f"tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, GPU KV cache usage: "
                        f"{rng.random() * 100:.1f}%, Prefix cache hit rate: {rng.random() * 60:.1f}%"
                    )
                    n += 1
                continue
            rid = f"chatcmpl-{rng.getrandbits(128):032x}"
            if r < 0.45:
                out.append(
                    f"{p}INFO:     10.0.{rng.randint(0, 255)}.{rng.randint(1, 254)}:{rng.randint(1024, 65535)} - "
                    f'"POST /v1/chat/completions HTTP/1.1" 200 OK'
                )
            elif r < 0.67:
                prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60)))
                out.append(
                    f"{p}INFO {_ts(t)} [logger.py:39] Received request {rid}: prompt: '{prompt}', params: "
                    f"SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, temperature=0.7, top_p=1.0, "
                    f"top_k=-1, seed=None, stop=[], max_tokens={rng.randint(16, 4096)}, min_tokens=0, "
                    f"logprobs=None), prompt_token_ids: None, lora_request: None."
                )
            elif r < 0.89:
                out.append(f"{p}INFO {_ts(t)} [async_llm.py:228] Added request {rid}.")
            elif r < 0.95:
                out.append(f"{p}INFO {_ts(t)} [async_llm.py:310] Finished request {rid}.")
            else:
                out.append(
                    f"{p}WARNING {_ts(t)} [protocol.py:58] The following fields were present in the request "
                    "but ignored: {'stream_options'}"
                )
            n += 1
            if len(out) >= 20_000:
                fh.write("\n".join(out) + "\n")
                out.clear()
        if out:
            fh.write("\n".join(out) + "\n")


# One uvicorn access line: what fills a real server's log between vLLM's own records.
ACCESS_FILLER = '(APIServer pid=1) INFO:     10.0.0.{n}:4242 - "POST /v1/completions HTTP/1.1" 200 OK\n'


def real_logs(repo: Path) -> list[bytes]:
    """Every real log under tests/fixtures/real*/logs, in name order, each ending in one newline."""
    paths = sorted(p for d in ("real", "real-extra") for p in (repo / "tests/fixtures" / d / "logs").glob("*"))
    return [p.read_bytes().rstrip(b"\n") + b"\n" for p in paths if p.is_file()]


def main() -> None:
    """Command line: ``gen_log.py OUT [--lines N] [--seed S]``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    generate(args.out, args.lines, args.seed)


if __name__ == "__main__":
    main()
