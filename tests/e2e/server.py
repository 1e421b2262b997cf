"""Processes the e2e tests start, and how they are always stopped.

Every process is started in its own session (so its own process group) with its output in a file.
``stop_process_tree`` remembers the whole tree first (vLLM's API server forks an EngineCore, and
``kvwatch run`` starts vLLM, which may start its own session), asks the leader to stop with SIGINT
(vLLM exits cleanly in about 1 s), and SIGKILLs every remembered process group and pid that is still
there after a bounded grace period. Nothing listens or connects anywhere but 127.0.0.1.

``VllmServer`` is ``vllm serve`` with the recipe of shared/fixtures/vllm-cpu/README.md: the tiny
Llama, random weights, no tokenizer, a 32 x 32-token KV pool, max_num_seqs 8.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml

from .load import require_loopback

HOST = "127.0.0.1"


#: Ports this process has handed out: never twice, so two servers of one test cannot get the same.
_HANDED_OUT: set[int] = set()
#: How far below the kernel's ephemeral range free_port looks.
_PORTS_BELOW_EPHEMERAL = 12_000
_RNG = random.Random()  # seeded from the OS: two test processes start at different ports


def _ephemeral_low() -> int:
    """The first port of net.ipv4.ip_local_port_range (32768 when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = HOST) -> int:
    """A TCP port nobody listens on now, and one the kernel never hands out on its own.

    The port a server is told to bind is chosen here and bound by the child a moment later. A port
    from ``bind(host, 0)`` comes from the ephemeral range (net.ipv4.ip_local_port_range), which
    every ``connect()`` and every other ``bind(0)`` on the machine draws from too: vLLM's internal
    ZMQ and gloo sockets, Prometheus' scrapes, the harness's own polls. In that gap one of them can
    take it (CI saw Prometheus exit with "bind: address already in use" on such a port). Below the
    range a port is only ever taken by someone who names it, so the gap is closed; the range is
    read from the kernel, and this process never hands the same port out twice.
    """
    low = _ephemeral_low()
    first = max(1024, low - _PORTS_BELOW_EPHEMERAL)
    for _ in range(1000) if first < low else ():
        port = _RNG.randrange(first, low)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))  # no SO_REUSEADDR: a port with connections in TIME_WAIT is skipped
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free TCP port on {host} below the ephemeral range (from {low}): too many listeners")


def port_is_free(port: int, host: str = HOST) -> bool:
    """True when ``port`` can be bound on ``host`` (nothing left listening on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _children_map() -> dict[int, list[int]]:
    """ppid -> child pids, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
        fields = stat.rsplit(")", 1)[1].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants alive right now."""
    children = _children_map()
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@dataclass
class StartedProcess:
    """A process the harness started, with every pid and process group seen in its tree."""

    name: str
    popen: subprocess.Popen[bytes]
    output: Path
    pids: set[int] = field(default_factory=set)
    pgids: set[int] = field(default_factory=set)

    def remember_tree(self) -> None:
        """Record the current tree, so children that outlive the leader are still found."""
        for pid in process_tree(self.popen.pid):
            self.pids.add(pid)
            pgid = _pgid(pid)
            if pgid is not None and pgid != os.getpgid(0):
                self.pgids.add(pgid)

    def survivors(self) -> list[int]:
        """Remembered pids still alive."""
        return sorted(pid for pid in self.pids if pid_alive(pid))

    def output_tail(self, lines: int = 15) -> str:
        """Last lines of the process's output file (for failure messages)."""
        try:
            text = self.output.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def start_process(
    name: str,
    argv: Sequence[str],
    output: Path,
    env: Mapping[str, str] | None = None,
    stderr_output: Path | None = None,
    cwd: Path | None = None,
    busy_session: bool = False,
) -> StartedProcess:
    """Start ``argv`` in a new session with stdout (and stderr, unless ``stderr_output``) in files.

    ``busy_session``: the session yields the CPU to every other session (``yield_session``); for
    a session that holds vLLM's CPU engine, whether vLLM leads it or runs under ``kvwatch run``.
    """
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "wb") as out:
        err = open(stderr_output, "wb") if stderr_output else subprocess.STDOUT  # noqa: SIM115
        try:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
            )
        finally:
            if stderr_output:
                err.close()  # type: ignore[union-attr]
    if busy_session:
        yield_session(popen.pid)
    started = StartedProcess(name=name, popen=popen, output=output)
    started.remember_tree()
    return started


def stop_process_tree(
    proc: StartedProcess, interrupt: signal.Signals = signal.SIGINT, grace_seconds: float = 15.0
) -> list[int]:
    """Stop ``proc`` and everything it started; return pids that had to be SIGKILLed.

    ``interrupt`` to the leader first (vLLM and kvwatch shut down cleanly on SIGINT; SIGTERM is
    what docker and kubernetes send), then, after the grace period or as soon as the leader and its
    children are gone, SIGKILL to every remembered process group and pid still there.
    """
    proc.remember_tree()
    if proc.popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.popen.send_signal(interrupt)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=grace_seconds)
    # Children get a moment after their parent exits (vLLM's EngineCore follows the API server).
    end = time.monotonic() + min(5.0, grace_seconds)
    while proc.survivors() and time.monotonic() < end:
        time.sleep(0.1)
    killed = proc.survivors()
    for pgid in proc.pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for pid in killed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.popen.wait(timeout=5)
    end = time.monotonic() + 5.0
    while proc.survivors() and time.monotonic() < end:
        time.sleep(0.1)
    return killed


def wait_for_http_ok(
    url: str,
    timeout_seconds: float,
    alive: Callable[[], bool] = lambda: True,
    poll_seconds: float = 0.5,
) -> float:
    """Poll ``url`` until it answers 200; return the seconds it took.

    Raise TimeoutError after ``timeout_seconds`` and RuntimeError as soon as ``alive()`` turns
    false (the process died: no point waiting out the timeout).
    """
    require_loopback(url)
    began = time.monotonic()
    while True:
        if not alive():
            raise RuntimeError(f"process exited before {url} answered")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return time.monotonic() - began
        except requests.RequestException:
            pass
        if time.monotonic() - began > timeout_seconds:
            raise TimeoutError(f"{url} did not answer 200 within {timeout_seconds:.0f} s")
        time.sleep(poll_seconds)


def start_prometheus(
    binary: str, workdir: Path, config: Mapping[str, object], ready_timeout_seconds: float = 60.0
) -> tuple[StartedProcess, str]:
    """Debian's ``prometheus`` with ``config`` (written to workdir/prometheus.yml), its TSDB and log
    in ``workdir``, on a ``free_port``; returns it once /-/ready answers, and its base URL.

    If it never gets ready it is stopped and the error carries the end of its log (a bind error,
    a bad rule file), not only "exited".
    """
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(dict(config)), encoding="utf-8")
    port = free_port()
    prom = start_process(
        "prometheus",
        [
            binary,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address={HOST}:{port}",
        ],
        workdir / "prometheus.log",
    )
    url = f"http://{HOST}:{port}"
    try:
        wait_for_http_ok(
            f"{url}/-/ready", ready_timeout_seconds, alive=lambda: prom.popen.poll() is None, poll_seconds=0.2
        )
    except (TimeoutError, RuntimeError) as exc:
        stop_process_tree(prom, grace_seconds=5)
        raise RuntimeError(
            f"prometheus did not get ready: {exc}\n--- {prom.output} (tail) ---\n{prom.output_tail()}"
        ) from exc
    return prom, url


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """``vllm serve`` flags for the tiny pool (shared/fixtures/vllm-cpu/README.md).

    32 blocks x 32 tokens = 1,024 tokens of KV: two 512-token requests fit, max_num_seqs 8 lets
    more start, so requests wait, usage sits near 100 % and vLLM preempts constantly.
    """

    served_model_name: str = "tiny-llama"
    max_model_len: int = 512
    block_size: int = 32  # CPU needs a multiple of 32 (16 is rejected)
    num_gpu_blocks_override: int = 32
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512
    enforce_eager: bool = False  # True starts ~20 s faster but skips torch.compile
    extra_args: tuple[str, ...] = ()


def serve_argv(vllm_bin: Path, model_dir: Path, port: int, config: ServeConfig) -> list[str]:
    """The ``vllm serve`` command line, bound to 127.0.0.1:``port``."""
    argv = [
        str(vllm_bin),
        "serve",
        str(model_dir),
        "--served-model-name",
        config.served_model_name,
        "--host",
        HOST,
        "--port",
        str(port),
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        str(config.max_model_len),
        "--block-size",
        str(config.block_size),
        "--num-gpu-blocks-override",
        str(config.num_gpu_blocks_override),
        "--max-num-seqs",
        str(config.max_num_seqs),
        "--max-num-batched-tokens",
        str(config.max_num_batched_tokens),
    ]
    if config.enforce_eager:
        argv.append("--enforce-eager")
    argv.extend(config.extra_args)
    return argv


#: The nice level vLLM runs at under the harness (see ``as_busy_neighbour``).
VLLM_NICE = 10


def as_busy_neighbour(argv: list[str]) -> list[str]:
    """``argv`` run at nice ``VLLM_NICE`` (``nice`` execs it: same pid, same children).

    In a pod, kvwatch is a sidecar container with its own CPU request, which the kernel turns
    into a cgroup CPU weight: vLLM cannot take its share. Here every process shares one cgroup
    on 2 cores, and vLLM's CPU engine keeps both spinning under load; kvwatch and the harness's
    own polls then waited seconds for a core (measured: a poll accepted 1.4 s late, handed to a
    worker 0.7 s later, answered 0.7 s after that; once over 10 s). A lower priority for vLLM
    gives kvwatch that precedence without changing anything vLLM computes or reports.

    A nice value only orders the processes of one session, though, where the kernel groups
    sessions: the session that holds vLLM must also yield to the harness's own (``yield_session``).
    """
    return ["nice", "-n", str(VLLM_NICE), *argv]


def yield_session(pid: int) -> None:
    """Give the session ``pid`` leads the CPU weight of nice ``VLLM_NICE`` against other sessions.

    With sched_autogroup (CONFIG_SCHED_AUTOGROUP, /proc/sys/kernel/sched_autogroup_enabled = 1, as
    on this machine and most distribution kernels) the scheduler first shares the CPU between
    sessions, each an autogroup of weight nice 0, and only inside a session by each process's own
    nice value (sched(7), "The autogroup feature"). vLLM started by the harness leads a session of
    its own, so its ``nice`` ordered it against nothing: measured with vLLM under the e2e load, a
    scrape of kvwatch took up to 14.2 s (kvwatch's threads 0.21 s on a CPU and 103 s waiting for
    one in 35 s) and 0.06 s once the session's own weight was lowered as here. The value is the
    autogroup's, shared by every process of the session, so vLLM's EngineCore and workers, forked
    later or already, are covered too. Raising it needs no privilege; a kernel without autogroups
    has no such file, and there the ``nice`` of ``as_busy_neighbour`` already orders processes.

    Under ``kvwatch run`` vLLM shares kvwatch's session, as it shares the pod's container: the
    whole session yields to the harness (Prometheus and the clients, outside the pod), and inside
    it vLLM's ``nice`` yields to kvwatch. Without that the harness's polls themselves waited for a
    core (a clean run: 5 polls in 36 s of load, the slowest 6.5 s, too few to see vLLM's pool full).
    """
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{VLLM_NICE}\n")


def serve_env(cache_dir: Path | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for ``vllm serve``: offline, no usage stats, loopback-only internal sockets.

    ``cache_dir`` (VLLM_CACHE_ROOT) keeps torch.compile's AOT cache between runs, which takes
    ~20 s off every warm start.
    """
    env = dict(os.environ if base is None else base)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_HOST_IP=HOST,  # keeps vLLM's internal ZMQ/gloo sockets on loopback too
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB; overridden to 32 blocks by the flag, but sizes the profile
        PYTHONUNBUFFERED="1",
    )
    if cache_dir is not None:
        env["VLLM_CACHE_ROOT"] = str(cache_dir)
    return env


class VllmServer:
    """One ``vllm serve`` on 127.0.0.1 with its output in ``log_path``; a context manager."""

    def __init__(
        self,
        vllm_bin: Path,
        model_dir: Path,
        log_path: Path,
        config: ServeConfig | None = None,
        port: int | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        self.config = config or ServeConfig()
        self.port = port or free_port()
        self.log_path = log_path
        self.argv = serve_argv(vllm_bin, model_dir, self.port, self.config)
        self.env = serve_env(cache_dir)
        self.process: StartedProcess | None = None
        self.ready_seconds: float | None = None

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT"""
        return f"http://{HOST}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """vLLM's own Prometheus endpoint."""
        return self.base_url + "/metrics"

    def start(self, ready_timeout_seconds: float = 240.0) -> float:
        """Start and wait for /health; return the seconds to ready. On failure stop and raise."""
        self.process = start_process(
            "vllm serve", as_busy_neighbour(self.argv), self.log_path, env=self.env, busy_session=True
        )
        proc = self.process
        try:
            self.ready_seconds = wait_for_http_ok(
                self.base_url + "/health", ready_timeout_seconds, alive=lambda: proc.popen.poll() is None
            )
        except (TimeoutError, RuntimeError) as exc:
            tail = proc.output_tail()
            self.stop()
            message = f"vllm serve did not become ready: {exc}\n--- {self.log_path} (tail) ---\n{tail}"
            raise RuntimeError(message) from exc
        proc.remember_tree()
        return self.ready_seconds

    def stop(self) -> list[int]:
        """Stop the server and its children; return pids that needed SIGKILL."""
        if self.process is None:
            return []
        return stop_process_tree(self.process)

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def all_survivors(processes: Iterable[StartedProcess]) -> list[int]:
    """Pids of every remembered process still alive."""
    return sorted(pid for proc in processes for pid in proc.survivors())
