"""Running tensor-parallel ranks on a CPU.

Two ways, one contract (``fn(rank, reduce) -> result``; ``reduce`` sums a tensor over ranks):

* :func:`run_in_process` — every rank is a thread of this process and ``reduce`` is a
  barrier-synchronised sum. Fast; for property tests and quick checks.
* :func:`run_gloo` — every rank is a separate process with a ``torch.distributed`` gloo
  group on 127.0.0.1 and ``reduce`` is ``all_reduce``. This is real multi-process TP: the
  same collective calls a device backend would make, over real process boundaries.

``run_gloo`` refuses to run inside one of its own workers (the environment variable
``NEURON_PORT_TP_CHILD`` marks them), so an import-time launch can never fork-bomb, and it turns
a dead or failing rank into a :class:`~neuron_port.errors.ParallelRankError` naming the rank.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from neuron_port.errors import ParallelRankError

CHILD_ENV = "NEURON_PORT_TP_CHILD"
SPAWN_DIR_ENV = "NEURON_PORT_TP_SPAWN_DIR"
"""Set while ranks are spawned: where a rank that finds an unguarded ``__main__`` leaves word."""
UNGUARDED_MAIN = "unguarded_main"
_FRAME = re.compile(r'\s*File "([^"]+)", line (\d+), in (\S+)')
_SPAWN_LOCK = threading.Lock()  # the spawn folder travels in os.environ, which threads share
Reduce = Callable[[torch.Tensor], torch.Tensor]
RankFn = Callable[[int, Reduce], Any]


def identity_reduce(x: torch.Tensor) -> torch.Tensor:
    """The reduce of a single rank: nothing to sum with."""
    return x


def is_tp_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def rank_failure_message(rank: int, tp: int, trace: str) -> str:
    """``rank R of TP failed at FILE:LINE in FUNCTION: Exception: message`` from a formatted traceback
    (the innermost frame: where the exception was raised; the whole exception text after it)."""
    lines = trace.rstrip().splitlines()
    frames = [i for i, line in enumerate(lines) if _FRAME.match(line)]
    if not frames:
        return f"rank {rank} of {tp} failed: {lines[-1] if lines else '(no exception text)'}"
    last = frames[-1]
    path, line, function = _FRAME.match(lines[last]).groups()
    rest = lines[last + 1:]
    while rest and rest[0].startswith("    "):  # the frame's source line and its ^^^ markers
        rest = rest[1:]
    text = " ".join(part.strip() for part in rest if part.strip()) or "(no exception text)"
    return f"rank {rank} of {tp} failed at {path}:{line} in {function}: {text}"


def _rank_error(rank: int, tp: int, trace: str) -> ParallelRankError:
    error = ParallelRankError(rank_failure_message(rank, tp, trace))
    error.rank, error.rank_traceback = rank, trace
    return error


# ---- in-process ranks ------------------------------------------------------------------------
class _ThreadSum:
    """Sum of one tensor per rank, exchanged through a barrier (every rank gets the total)."""

    def __init__(self, tp: int):
        self.tp = tp
        self.slots: list[torch.Tensor | None] = [None] * tp
        self.result: torch.Tensor | None = None
        self.barrier = threading.Barrier(tp)

    def reducer(self, rank: int) -> Reduce:
        def reduce(x: torch.Tensor) -> torch.Tensor:
            self.slots[rank] = x
            if self.barrier.wait() == 0:
                total = self.slots[0].clone()
                for part in self.slots[1:]:
                    total = total + part
                self.result = total
            self.barrier.wait()
            out = self.result.clone()
            self.barrier.wait()
            return out

        return reduce


def run_in_process(fn: RankFn, tp: int) -> list[Any]:
    """Run ``fn(rank, reduce)`` for every rank as threads; results in rank order."""
    if tp == 1:
        return [fn(0, identity_reduce)]
    group = _ThreadSum(tp)
    results: list[Any] = [None] * tp
    errors: list[BaseException | None] = [None] * tp

    def body(rank: int) -> None:
        try:
            results[rank] = fn(rank, group.reducer(rank))
        except threading.BrokenBarrierError as exc:
            errors[rank] = exc
        except BaseException as exc:  # noqa: BLE001 - reported below with the rank
            errors[rank] = exc
            group.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for rank, err in enumerate(errors):
        if err is not None and not isinstance(err, threading.BrokenBarrierError):
            trace = "".join(traceback.format_exception(type(err), err, err.__traceback__))
            raise _rank_error(rank, tp, trace) from err
    if any(errors):
        raise ParallelRankError(f"a rank of {tp} left the group early")
    return results


# ---- gloo processes --------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_reduce(x: torch.Tensor) -> torch.Tensor:
    from neuron_port.parallel.collectives import process_group_reduce

    return process_group_reduce(x)


def join_process_group(init: str, rank: int, tp: int, timeout: datetime.timedelta | None = None) -> None:
    """Join the gloo group of ``tp`` ranks that meets at ``init`` (``tcp://127.0.0.1:PORT``) as
    ``rank``: the one place the package starts a process group (the gloo ranks here, the serving
    lockstep). ``timeout``: how long a collective waits (torch's default when None)."""
    import torch.distributed as dist

    extra = {"timeout": timeout} if timeout is not None else {}
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=tp, **extra)


def _gloo_entry(rank: int, tp: int, init: str, fn: RankFn, out_dir: str, threads: int) -> None:
    import torch.distributed as dist

    os.environ[CHILD_ENV] = "1"
    os.environ.pop(SPAWN_DIR_ENV, None)
    torch.set_num_threads(threads)
    join_process_group(init, rank, tp)
    try:
        result = fn(rank, _gloo_reduce)
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
    except BaseException:
        (Path(out_dir) / f"rank{rank}.error").write_text(traceback.format_exc())
        raise
    else:
        # Leave together: a rank that tears its group down while a peer is still inside gloo
        # can make the peer's gloo thread abort the process (seen once: rank 0 died with
        # SIGABRT, "terminate called without an active exception", after both had generated).
        try:
            dist.barrier()
        except Exception:  # a peer failed; its own error file says why
            pass
    finally:
        dist.destroy_process_group()


def run_gloo(fn: RankFn, tp: int, timeout_s: float = 600.0, threads_per_rank: int = 1) -> list[Any]:
    """Run ``fn(rank, reduce)`` in ``tp`` gloo processes on 127.0.0.1; JSON results in rank order.

    ``fn`` must be importable (a module-level function) and return JSON-able data.
    """
    _refuse_unguarded_main()
    if is_tp_child():
        raise ParallelRankError(f"run_gloo called inside a TP worker ({CHILD_ENV}=1): refusing to re-spawn")
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="neuron_port_tp_") as out_dir:
        init = f"tcp://127.0.0.1:{free_port()}"
        ctx = None
        try:
            ctx = _spawn(mp, (tp, init, fn, out_dir, threads_per_rank), tp, out_dir)
            deadline = time.monotonic() + timeout_s
            while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    for proc in ctx.processes:
                        proc.kill()
                    raise ParallelRankError(f"tensor-parallel group of {tp} did not finish within {timeout_s:.0f} s")
        except mp.ProcessRaisedException as exc:
            raise _rank_failure(out_dir, tp, str(exc), exc.error_index) from None
        except mp.ProcessExitedException as exc:
            unguarded = Path(out_dir) / UNGUARDED_MAIN
            if unguarded.exists():
                raise ParallelRankError(_unguarded_message(unguarded.read_text())) from None
            raise ParallelRankError(f"rank {exc.error_index} of {tp} died (exit code {exc.exit_code})") from None
        finally:
            _remove_error_files(ctx)
        results = []
        for rank in range(tp):
            path = Path(out_dir) / f"rank{rank}.json"
            if not path.exists():
                raise _rank_failure(out_dir, tp, f"rank {rank} produced no result")
            results.append(json.loads(path.read_text()))
        return results


def _remove_error_files(ctx) -> None:
    """torch.multiprocessing leaves a ``pytorch-errorfile-*.pickle`` in the temp folder for each rank
    that raised; the message has been read by now, so they go."""
    for name in getattr(ctx, "error_files", None) or ():
        if name:
            Path(name).unlink(missing_ok=True)


def _spawn(mp, args: tuple, tp: int, out_dir: str):
    """Start the rank processes with ``SPAWN_DIR_ENV`` in their environment (this process's is
    restored at once; each rank drops it once started)."""
    with _SPAWN_LOCK:
        previous = os.environ.get(SPAWN_DIR_ENV)
        os.environ[SPAWN_DIR_ENV] = out_dir
        try:
            return mp.start_processes(_gloo_entry, args=args, nprocs=tp, join=False, start_method="spawn")
        finally:
            if previous is None:
                os.environ.pop(SPAWN_DIR_ENV, None)
            else:
                os.environ[SPAWN_DIR_ENV] = previous


def _unguarded_message(script: str) -> str:
    return (f"the script {script} starts tensor-parallel ranks when it is imported: each gloo rank is a spawned "
            "process that imports the main script again, so the launch ran inside the ranks too. Put the code that "
            "runs the port under a guard:\n    if __name__ == \"__main__\":\n        main()")


def _refuse_unguarded_main() -> None:
    """Inside a rank still importing the parent's ``__main__`` (multiprocessing's bootstrap), a
    launch means the script has no ``__main__`` guard: leave word for the parent and stop."""
    import multiprocessing

    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    script = getattr(sys.modules.get("__mp_main__") or sys.modules.get("__main__"), "__file__", None) or "(unknown)"
    spawn_dir = os.environ.get(SPAWN_DIR_ENV)
    if spawn_dir and Path(spawn_dir).is_dir():
        (Path(spawn_dir) / UNGUARDED_MAIN).write_text(str(script))
    raise ParallelRankError(_unguarded_message(script))


def _rank_failure(out_dir: str, tp: int, fallback: str, first: int | None = None) -> ParallelRankError:
    """The error of rank ``first`` (the one multiprocessing saw fail), else of the lowest failed rank:
    a peer's secondary error (its group closed under it) must not hide the real one."""
    order = ([first] if first is not None else []) + [r for r in range(tp) if r != first]
    for rank in order:
        err = Path(out_dir) / f"rank{rank}.error"
        if err.exists():
            return _rank_error(rank, tp, err.read_text())
    return ParallelRankError(fallback)


__all__ = [
    "Reduce",
    "identity_reduce",
    "CHILD_ENV",
    "join_process_group",
    "is_tp_child",
    "rank_failure_message",
    "run_in_process",
    "run_gloo",
    "free_port",
]
