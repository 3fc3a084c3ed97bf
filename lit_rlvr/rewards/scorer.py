"""Score many completions in a pool of killable worker processes, each item under a deadline.

Design (why processes, and which kind):

- Deadlines must hold for pure-Python sympy work and for single long C calls, so the only hard
  guarantee is a process that can be killed. Each worker enforces a *soft* deadline itself
  (``setitimer`` for math, a progress handler for SQL: status ``timeout``, worker kept); the
  parent enforces a *hard* one, ``timeout_s + kill_grace_s`` after the item started: it kills
  the worker (SIGKILL), scores the item 0 with status ``timeout``, requeues the rest of that
  worker's chunk and starts a replacement. A worker that dies (segfault, OOM kill, ``exit``)
  costs only its current item (status ``error``, reason ``worker died …``).
- Workers are forks of one launcher process per training process (:mod:`lit_rlvr.rewards.launcher`):
  a fresh interpreter, without torch or threads, that imported ``lit_rlvr.rewards`` and built its
  parsers once. Nothing of the training process is forked, so its torch/vLLM threads are never
  duplicated, and unlike ``multiprocessing``'s spawn and forkserver the training script
  (``__main__``) is never re-imported in a worker. A worker talks over a socketpair in frames
  (:mod:`lit_rlvr.rewards.frames`; the parent reads all pending results in one call); it imports the
  plug-in modules of the run (:mod:`lit_rlvr.plugins`), and the module of a reward registered
  elsewhere only with the first chunk that names it (a registered reward the run never uses is
  never imported there; that import runs under ``start_timeout_s``, not the first item's
  deadline), so a worker, or the replacement of one that was killed, starts in milliseconds
  (a fresh interpreter took ~0.6 s of CPU). A worker whose parent has gone exits at its next
  read (EOF on the socket).
- Scores and, for validation, the rewards' canonical answers (maj@k, distinct answers) are
  computed in the workers: answer keys run sympy and SQL too.
- Items go to workers in chunks (one message per chunk, at most two chunks in flight per
  worker); each result comes back as soon as it is scored, which is what lets the parent know
  when the current item started (the worker scores its items in order). Gold parses and
  results are cached inside each worker (see the math and SQL modules), so keep one scorer alive
  for the whole run.
- A :class:`~lit_rlvr.rewards.base.GoldAnswerError` (malformed gold, a data error) does not stop
  the batch: the other items are scored and then the first such error is raised.
- ``workers=0`` scores in the calling thread with the same code (so does a pool, with a warning,
  for a reward that cannot be pickled to a worker: a lambda, a closure), each item under
  :func:`~lit_rlvr.rewards.base.deadline` at the hard deadline (status ``timeout``): it interrupts
  Python code, sleeps and regular expressions (in the main thread), but not a single long C
  call, which finishes first; only a worker that can be killed makes the deadline hard.

Each worker's address space is capped (``RLIMIT_AS``, ``memory_limit_mb``) so a memory bomb
raises ``MemoryError`` in that worker instead of waking the system's OOM killer.
"""

from __future__ import annotations

import inspect
import math
import pickle
import pickletools
import signal
import socket
import subprocess
import time
import warnings
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import wait

from lit_rlvr.plugins import loaded_modules
from lit_rlvr.rewards import frames
from lit_rlvr.rewards.base import (
    REWARDS,
    STATUS_ERROR,
    STATUS_TIMEOUT,
    STATUSES,
    GoldAnswerError,
    Reward,
    RewardRegistry,
    RewardTimeout,
    ScoreResult,
    as_result,
    deadline,
    error_result,
    in_range,
    stripped_completion,
)
from lit_rlvr.rewards.launcher import Launcher, LauncherGone

_PRELOAD = "lit_rlvr.rewards.scorer:_prepare_worker"  # what the launcher imports once for every worker
_TARGET = "lit_rlvr.rewards.scorer:_worker_main"


def reward_table(rewards: Mapping[str, Callable | Reward] | None = None) -> RewardRegistry:
    """Every registered reward, plus ``rewards`` (plain functions by name, wrapped in records, or
    whole :class:`~lit_rlvr.rewards.base.Reward` records; they override the registry), as one
    :class:`~lit_rlvr.rewards.base.RewardRegistry`.

    Example:
        >>> import lit_rlvr.rewards
        >>> table = reward_table()
        >>> table["math"].takes_timeout, {"math", "sql"} <= set(table), table.options("sql")
        (True, True, ['mode'])
    """
    extra = RewardRegistry("reward")
    for name, fn in (rewards or {}).items():
        if isinstance(fn, Reward):
            extra.add(replace(fn, name=name))
        else:
            extra.register(name)(fn)
    return REWARDS.merged(extra)


def _shipping_problem(record: Reward) -> str | None:
    """Why a worker cannot receive ``record``'s functions (None if it can): they must pickle, by
    reference to a module the worker imports (not ``__main__``) or by value."""
    for fn in (record.score, record.answer_key, record.check_gold):
        if fn is None:
            continue
        try:
            data = pickle.dumps(fn)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            return f"it is not picklable ({e})"
        if any(
            isinstance(arg, str) and (arg == "__main__" or arg.startswith("__main__ "))
            for _, arg, _ in pickletools.genops(data)
        ):
            return "it is defined in __main__, which workers do not import"
    return None


def check_reward_options(options: Mapping[str, Mapping], table: RewardRegistry, key: str = "scoring.options") -> None:
    """Raise ``ValueError`` unless every ``{reward: {option: value}}`` names a reward, options it
    takes and values it accepts (:meth:`~lit_rlvr.registry.Registry.get_checked`).

    Example:
        >>> import lit_rlvr.rewards
        >>> check_reward_options({"sql": {"mode": "bird"}}, reward_table())
        >>> check_reward_options({"sql": {"moed": "bird"}}, reward_table())
        Traceback (most recent call last):
        ...
        ValueError: scoring.options.sql: unknown option(s) ['moed'] of reward 'sql'; accepted: ['mode']
        >>> check_reward_options({"sql": {"mode": "birds"}}, reward_table())
        Traceback (most recent call last):
        ...
        ValueError: scoring.options.sql: sql reward mode must be one of ('spider', 'bird'); got 'birds'
    """
    for name, opts in options.items():
        table.get_checked(name, key, opts, f"{key}.{name}")


def score_one(
    table: Mapping[str, Reward],
    completion: str,
    row: dict,
    timeout_s: float | None,
    options: Mapping[str, Mapping] | None = None,
    with_answer: bool = False,
) -> ScoreResult:
    """Score one completion with ``row["reward"]`` from ``table``; never raises except
    :class:`GoldAnswerError`. Plain reward functions may return a float or a ``ScoreResult``.

    Args:
        table: name → reward record (:func:`reward_table`).
        completion: the model's text.
        row: the prompt row (``reward``, ``answer``, ``id``, extras).
        timeout_s: per-item deadline passed to rewards that take ``timeout_s``.
        options: ``{reward name: keyword options}`` (the config's ``model.scoring.options``).
        with_answer: also compute the reward's canonical answer (``ScoreResult.answer``).

    Example:
        >>> import lit_rlvr.rewards
        >>> score_one(reward_table(), "#### 18", {"id": "g", "reward": "math", "answer": "18"}, 5.0, with_answer=True)
        ScoreResult(reward=1.0, status='ok', answer='18')
    """
    record = table[row["reward"]]
    own = dict((options or {}).get(record.name, {}))
    if record.takes_timeout:
        own["timeout_s"] = timeout_s
    try:
        result = as_result(record.score(completion, row["answer"], **call_kwargs(record.score, row, own, 2)))
    except GoldAnswerError:
        raise
    except Exception as e:
        return error_result(e)
    checked = in_range(result, record.value_range)
    if checked is not result:  # out of range: an error, no answer
        return checked
    if with_answer:
        key_own = {k: v for k, v in own.items() if k != "timeout_s" or _takes(record.answer_key, "timeout_s")}
        try:
            answer = record.answer_key(completion, **call_kwargs(record.answer_key, row, key_own, 1))
        except Exception:  # an answer that cannot be canonicalised votes as its text
            answer = stripped_completion(completion)
        result = replace(result, answer=answer)
    return result


def check_gold_one(table: Mapping[str, Reward], row: dict, timeout_s: float | None) -> ScoreResult:
    """Run ``row``'s reward's gold check; ``ok`` when it passes (or the reward has none).

    Raises:
        GoldAnswerError: the gold is malformed (any exception of the check counts as that).

    Example:
        >>> import lit_rlvr.rewards
        >>> check_gold_one(reward_table(), {"id": "g", "reward": "math", "answer": "\\\\frac{1}{2}"}, 5.0)
        ScoreResult(reward=1.0, status='ok')
    """
    record = table[row["reward"]]
    if record.check_gold is not None:
        own = {"timeout_s": timeout_s} if _takes(record.check_gold, "timeout_s") else {}
        try:
            record.check_gold(row["answer"], **call_kwargs(record.check_gold, row, own, 1))
        except GoldAnswerError:
            raise
        except Exception as e:
            raise GoldAnswerError(
                f"row id={row.get('id')!r}: the gold check of {record.name!r} raised {type(e).__name__}: {e}"
            ) from e
    return ScoreResult(1.0, "ok")


def run_task(
    table: Mapping[str, Reward],
    task: str,
    completion: str,
    row: dict,
    timeout_s: float | None,
    options: Mapping[str, Mapping] | None = None,
) -> ScoreResult:
    """One item of a worker's (or the in-process) work: ``task`` is one of :data:`TASKS`."""
    if task == "gold":
        return check_gold_one(table, row, timeout_s)
    return score_one(table, completion, row, timeout_s, options, with_answer=task == "answer")


TASKS = ("score", "answer", "gold")  # score; score + canonical answer; check the row's gold


def call_kwargs(fn: Callable, row: Mapping, own: Mapping, positional: int) -> dict:
    """The keyword arguments of one call ``fn(<positional arguments>, **kwargs)`` of a reward's
    scorer (2: completion, answer), answer key (1: completion) or gold check (1: answer): ``own``
    (the configured ``model.scoring.options`` and the scorer's ``timeout_s``) and the row's fields,
    less those that would collide with an argument the call already gives (a ``TypeError``, and an
    item scored 0 with status ``error``): ``answer`` and ``completion``, as
    :attr:`~lit_rlvr.envs.base.EnvironmentBase.scoring_row` leaves them out; the names of ``fn``'s
    first ``positional`` parameters; and ``fn``'s keyword-only parameters, its options and
    ``timeout_s``, which the config and the scorer set and a row column never does. A function
    without ``**row`` gets only the fields it names.

    Example:
        >>> def exact(completion, answer, *, strip=True, timeout_s=None, **row): ...
        >>> row = {"id": "q", "answer": "4", "completion": "c", "strip": "yes", "timeout_s": "x", "mode": "m"}
        >>> call_kwargs(exact, row, {"timeout_s": 5.0}, 2)
        {'id': 'q', 'mode': 'm', 'timeout_s': 5.0}
        >>> def plain(completion, answer, id): ...
        >>> call_kwargs(plain, row, {}, 2)
        {'id': 'q'}
    """
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read: every field but the two arguments
        params = [inspect.Parameter("row", inspect.Parameter.VAR_KEYWORD)]
    taken = {"answer", "completion", *own}
    taken.update(p.name for p in params[:positional])
    taken.update(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        fields = {k: v for k, v in row.items() if k not in taken}
    else:
        named = {p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL}
        fields = {k: v for k, v in row.items() if k in named and k not in taken}
    return {**fields, **own}


def _takes(fn: Callable, name: str) -> bool:
    params = inspect.signature(fn).parameters
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _prepare_worker() -> None:
    """What every worker needs before its first item (run once in the launcher, which forks the
    workers; again, at no cost, in each worker): the built-in rewards and their parsers (math-verify's
    LaTeX grammar takes ~0.1 s on first use), so no item's deadline pays for them."""
    import logging

    import lit_rlvr.rewards  # registers math and sql

    logging.getLogger("sqlglot").setLevel(logging.ERROR)  # "falling back to Command" on bad SQL
    lit_rlvr.rewards.REWARDS["math"].score("\\boxed{\\frac{1}{2}}", "0.5", timeout_s=None)
    lit_rlvr.rewards.sql.check_read_only("SELECT 1")


def _worker_main(fd: int) -> None:
    """Worker loop: read the config, say ready, then score chunks, sending one result per item."""
    sock = socket.socket(fileno=fd)
    (timeout_s, memory_limit_mb, plugin_modules, options), _ = frames.recv(sock)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    if memory_limit_mb:
        import resource

        limit = memory_limit_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from lit_rlvr.plugins import load_plugins

    _prepare_worker()
    load_plugins(plugin_modules)  # the user's rewards, as in the parent
    table = dict(reward_table())
    frames.send(sock, ("ready",))
    while True:
        try:
            chunk, _ = frames.recv(sock)
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        records, items = chunk
        if records:  # rewards defined elsewhere, first used now: importing their modules is not an item's time
            table.update(records)
            frames.send(sock, ("loaded",))
        for index, completion, row, task in items:
            try:
                r = run_task(table, task, completion, row, timeout_s, options)
                frames.send(sock, (index, r.reward, r.status, r.reason, r.answer, r.traceback, False))
            except GoldAnswerError as e:
                frames.send(sock, (index, 0.0, STATUS_ERROR, f"malformed gold: {e}", None, "", True))


class _Batch:
    """One ``score`` call's bookkeeping: chunks still to send, results, gold errors."""

    def __init__(self, completions: list[str], rows: list[dict], chunk_size: int):
        n = len(completions)
        self.queue = deque(list(range(i, min(i + chunk_size, n))) for i in range(0, n, chunk_size))
        self.results: list[ScoreResult | None] = [None] * n
        self.gold_errors: list[str] = []
        self.remaining = n


class _Worker:
    """One worker process, its connection, and the items it still owes results for."""

    def __init__(self, config: tuple):
        parent_sock, child_sock = socket.socketpair()
        try:
            self.proc = Launcher.get(_PRELOAD).spawn(_TARGET, child_sock)
        except LauncherGone as e:
            child_sock.close()
            parent_sock.close()
            raise RuntimeError(
                f"a reward worker could not be started: {e}; its traceback is on stderr — check that lit_rlvr "
                "and any plug-in modules import in a fresh interpreter"
            ) from None
        child_sock.close()
        self.sock = parent_sock
        self.reader = frames.FrameReader(parent_sock)
        frames.send(parent_sock, config)
        self.ready = False
        self.broken = False  # a send failed: it is dead, and EOF will be read soon
        self.started = time.monotonic()
        self.pending: deque[int] = deque()
        self.clock = 0.0  # when the item at pending[0] started (approximately)
        self.known: set[str] = set()  # shipped rewards this worker has been sent
        self.loading_at: int | None = None  # the item before which it imports newly shipped rewards

    def exit_reason(self) -> str:
        return self.proc.exit_reason()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.sock.close()


LOUD_ERROR_SHARE = 0.25
"""From this share of a batch's items failed (status ``error`` or ``timeout``), :meth:`ScoreSummary.loud` is True."""


@dataclass(frozen=True)
class ScoreSummary:
    """What one batch of scores came to: items per status, and the first failure's reason verbatim.

    Attributes:
        counts: items per status (every status of :data:`~lit_rlvr.rewards.base.STATUSES`).
        first_reason: the reason of the first ``error`` item (else of the first ``timeout``), or
            None when nothing failed.
        first_traceback: the traceback of the first ``error`` the reward raised, or None.

    Example:
        >>> s = summarize([ScoreResult(1.0), ScoreResult(0.0, "error", "KeyError: 'x'"), ScoreResult(0.0, "no_answer")])
        >>> s.errors, s.failures, s.loud, str(s)
        (1, 1, True, "3 scored: ok 1, no_answer 1, error 1; first error: KeyError: 'x'")
        >>> str(summarize([ScoreResult(0.0, "timeout"), ScoreResult(1.0)]))
        '2 scored: ok 1, timeout 1; first timeout: no reason given'
    """

    counts: dict[str, int]
    first_reason: str | None = None
    first_traceback: str | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def errors(self) -> int:
        """Items whose reward failed (status ``error``)."""
        return self.counts.get(STATUS_ERROR, 0)

    @property
    def failures(self) -> int:
        """Items whose reward failed or ran out of time (status ``error`` or ``timeout``)."""
        return self.errors + self.counts.get(STATUS_TIMEOUT, 0)

    @property
    def loud(self) -> bool:
        """Whether at least :data:`LOUD_ERROR_SHARE` of the items failed."""
        return self.total > 0 and self.failures >= LOUD_ERROR_SHARE * self.total

    def __str__(self) -> str:
        counts = ", ".join(f"{status} {n}" for status, n in self.counts.items() if n)
        first = "error" if self.errors else STATUS_TIMEOUT
        return f"{self.total} scored: {counts}" + (
            f"; first {first}: {self.first_reason}" if self.first_reason is not None else ""
        )


def summarize(results: Sequence[ScoreResult]) -> ScoreSummary:
    """Count ``results`` by status and keep the first failure's reason and traceback (:class:`ScoreSummary`)."""
    counts = {status: 0 for status in STATUSES}
    for r in results:
        counts[r.status] += 1
    failed = [r for status in (STATUS_ERROR, STATUS_TIMEOUT) for r in results if r.status == status]
    tracebacks = [r.traceback for r in failed if r.traceback]
    return ScoreSummary(
        counts, (failed[0].reason or "no reason given") if failed else None, tracebacks[0] if tracebacks else None
    )


class BatchScorer:
    """Score completions against their rows in worker processes, with a per-item deadline.

    Args:
        workers: worker processes; 0 scores in the calling thread, each item interrupted at
            the hard deadline between bytecodes (a single long C call finishes first).
        timeout_s: per-item deadline in seconds, passed to the reward (soft) and enforced by
            killing the worker after ``timeout_s + kill_grace_s`` (hard).
        kill_grace_s: extra time the soft deadline gets before the worker is killed.
        chunk_size: items sent to a worker per message.
        memory_limit_mb: address-space cap per worker (``RLIMIT_AS``); None for no cap.
        rewards: extra reward functions ``fn(completion, answer, **row) -> float | ScoreResult``
            or whole :class:`~lit_rlvr.rewards.base.Reward` records, by name (override the
            registry). They, and every reward registered in ``REWARDS`` by other modules, reach
            the workers pickled: by reference for module-level functions of an importable module,
            by value for objects. One that cannot (a lambda, a closure, anything of ``__main__``)
            is scored in this process instead, with a warning that says why.
        options: ``{reward name: {option: value}}``, keyword options passed to that
            reward's scorer and answer key (e.g. ``{"sql": {"mode": "bird"}}``); names and
            options are checked here.
        start_timeout_s: how long a new worker may take to import before ``RuntimeError``.
        coalesce_s: after a result arrives the parent waits this long before reading, so one
            wake-up collects many results (workers keep working meanwhile); 0 to disable.

    Example:
        >>> rows = [{"id": "a", "reward": "math", "answer": "#### 18"},
        ...         {"id": "b", "reward": "math", "answer": "\\\\frac{1}{2}"}]
        >>> with BatchScorer(workers=1, timeout_s=5.0) as scorer:
        ...     scorer.score(["so \\\\boxed{18}", "no idea"], rows)
        [ScoreResult(reward=1.0, status='ok'), ScoreResult(reward=0.0, status='no_answer')]
        >>> with BatchScorer(workers=0) as scorer:
        ...     scorer.score(["so \\\\boxed{18}"], rows[:1], with_answers=True)
        [ScoreResult(reward=1.0, status='ok', answer='18')]
    """

    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = 5.0,
        *,
        kill_grace_s: float = 1.0,
        chunk_size: int = 16,
        memory_limit_mb: int | None = 4096,
        rewards: Mapping[str, Callable] | None = None,
        options: Mapping[str, Mapping] | None = None,
        start_timeout_s: float = 120.0,
        coalesce_s: float = 0.002,
    ):
        if workers < 0:
            raise ValueError(f"workers must be >= 0 (0 = in-process); got {workers}")
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds; got {timeout_s!r}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1; got {chunk_size}")
        self.workers, self.timeout_s, self.chunk_size = workers, float(timeout_s), chunk_size
        self.hard_timeout_s = self.timeout_s + kill_grace_s
        self.start_timeout_s = start_timeout_s
        self.coalesce_s = coalesce_s
        self._extra_rewards = dict(rewards or {})
        self._warned_local: set[str] = set()
        self.reward_options = {k: dict(v) for k, v in (options or {}).items()}
        check_reward_options(self.reward_options, reward_table(self._extra_rewards))
        self._memory_limit_mb = memory_limit_mb
        self._workers: list[_Worker] = []
        self._build_table()
        self._warn_local(self._extra_rewards)
        self._start_workers()

    def _warn_local(self, names) -> None:
        """Warn once per reward that runs in this process although there are workers, and say why."""
        for name in sorted((set(names) & set(self.local_only)) - self._warned_local if self.workers else ()):
            self._warned_local.add(name)
            warnings.warn(
                f"reward {name!r} runs in the training process, not in a killable worker: "
                f"{self.local_only[name]}. Its deadline interrupts Python code only, and a crash in it stops "
                "the run; define it at module level of an importable module to run it in the workers",
                stacklevel=3,
            )

    def _build_table(self) -> None:
        """Snapshot the registry; every reward defined outside this package and the run's plug-in
        modules goes to the workers pickled, unless it cannot (``self.local_only`` says why: those
        are scored in this process)."""
        self.table = reward_table(self._extra_rewards)
        plugins = loaded_modules()
        shipped, self.local_only = {}, {}
        for name, record in self.table.items():
            module = getattr(record.score, "__module__", "") or ""
            if name not in self._extra_rewards and (module.startswith("lit_rlvr.rewards.") or module in plugins):
                continue  # workers register these themselves
            if problem := _shipping_problem(record):
                self.local_only[name] = problem
            else:
                shipped[name] = record
        self.shipped = shipped  # sent to a worker with the first chunk that names them (imported there then)
        self._config = (self.timeout_s, self._memory_limit_mb, plugins, self.reward_options)

    def _start_workers(self) -> None:
        while len(self._workers) < self.workers:
            self._workers.append(_Worker(self._config))

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers[self._workers.index(worker)] = _Worker(self._config)

    def score(self, completions: Sequence[str], rows: Sequence[dict], with_answers: bool = False) -> list[ScoreResult]:
        """Score ``completions[i]`` against ``rows[i]`` (``rows[i]["reward"]`` names the function,
        ``rows[i]["answer"]`` is the gold).

        Args:
            completions: B completion texts.
            rows: B prompt rows (a prompt's row repeated for each of its samples).
            with_answers: also compute each completion's canonical answer (``.answer``), in the
                workers (validation's maj@k and distinct answers).

        Returns:
            B ``ScoreResult``; statuses ``ok``, ``no_answer``, ``timeout``, ``rejected``, ``error``.

        Raises:
            ValueError: lengths differ, or a row lacks ``reward``/``answer`` or names an unknown
                reward (checked before any work).
            GoldAnswerError: some row's gold is malformed (raised after the batch is scored).
        """
        if len(completions) != len(rows):
            raise ValueError(f"got {len(completions)} completions for {len(rows)} rows; they must pair up")
        self._check_rows(rows)
        results, gold_errors = self._run("answer" if with_answers else "score", list(completions), list(rows))
        if gold_errors:
            raise GoldAnswerError(f"{len(gold_errors)} row(s) with malformed gold answers; first: {gold_errors[0]}")
        return results

    def _check_rows(self, rows: Sequence[dict]) -> None:
        """Every row names a reward this scorer can run (rebuilding the table for rewards or
        plug-ins registered after it was built); raise ``ValueError`` otherwise."""
        for row in rows:
            if "reward" not in row or "answer" not in row:
                raise ValueError(f"row id={row.get('id')!r} needs 'reward' and 'answer' keys; has {sorted(row)}")
        names = {row["reward"] for row in rows}
        if not names <= set(self.table) and names <= set(reward_table(self._extra_rewards)):
            self._build_table()  # registered after this scorer was built: restart workers with it
            self._restart_workers()
        elif self._config[2] != loaded_modules():
            self._build_table()  # plug-ins loaded after this scorer was built
            self._restart_workers()
        for name in sorted(names):
            if name not in self.table:
                raise ValueError(f"unknown reward {name!r} in rows; valid names: {sorted(self.table)}")
        self._warn_local(names)

    def check_golds(self, rows: Sequence[dict]) -> list[str | None]:
        """Check every row's gold once (its reward's ``check_gold``), in the workers.

        Args:
            rows: prompt rows (names checked as in :meth:`score`).

        Returns:
            Per row, None when the gold is usable, else why not (a malformed gold, or a check
            that ran past the hard deadline). Rows whose reward has no gold check pass.
        """
        self._check_rows(rows)
        todo = [i for i, row in enumerate(rows) if self.table[row["reward"]].check_gold is not None]
        problems: list[str | None] = [None] * len(rows)
        if not todo:
            return problems
        results, _ = self._run("gold", [""] * len(todo), [rows[i] for i in todo])
        for i, result in zip(todo, results):
            if result.status == STATUS_TIMEOUT:
                problems[i] = f"row id={rows[i].get('id')!r}: the gold check did not finish ({result.reason})"
            elif result.status != "ok":
                problems[i] = result.reason.removeprefix("malformed gold: ")
        return problems

    def _run(self, task: str, completions: list[str], rows: list[dict]) -> tuple[list[ScoreResult], list[str]]:
        """``task`` on every item, in the workers or in this thread (with ``workers=0``, and for the
        rewards that cannot be sent to a worker): results and gold errors."""
        local = [i for i, row in enumerate(rows) if not self.workers or row["reward"] in self.local_only]
        if len(local) == len(rows):
            return self._run_here(task, completions, rows)
        pooled = sorted(set(range(len(rows))) - set(local))
        try:
            results, gold_errors = self._score_pool([completions[i] for i in pooled], [rows[i] for i in pooled], task)
        except BaseException:  # interrupted mid-batch: workers hold stale work, start afresh
            self._restart_workers()
            raise
        here, here_errors = self._run_here(task, [completions[i] for i in local], [rows[i] for i in local])
        merged: list[ScoreResult | None] = [None] * len(rows)
        for indices, part in ((pooled, results), (local, here)):
            for i, result in zip(indices, part):
                merged[i] = result
        return merged, gold_errors + here_errors  # type: ignore[return-value]

    def _run_here(self, task: str, completions: list[str], rows: list[dict]) -> tuple[list[ScoreResult], list[str]]:
        """``task`` on every item in this thread, each under the hard deadline as far as a thread can enforce it."""
        results, gold_errors = [], []
        for c, r in zip(completions, rows):
            try:
                with deadline(self.hard_timeout_s):
                    results.append(run_task(self.table, task, c, dict(r), self.timeout_s, self.reward_options))
            except RewardTimeout:
                reason = f"interrupted after the hard deadline of {self.hard_timeout_s:g} s (in-process scoring)"
                results.append(ScoreResult(0.0, STATUS_TIMEOUT, reason))
            except GoldAnswerError as e:
                results.append(ScoreResult(0.0, STATUS_ERROR, f"malformed gold: {e}"))
                gold_errors.append(str(e))
        return results, gold_errors

    def _restart_workers(self) -> None:
        for worker in self._workers:
            worker.kill()
        self._workers.clear()
        self._start_workers()

    def _score_pool(self, completions: list[str], rows: list[dict], task: str) -> tuple[list[ScoreResult], list[str]]:
        batch = _Batch(completions, rows, self.chunk_size)
        while batch.remaining:
            now = time.monotonic()
            for worker in self._workers:
                # up to two chunks in flight, so a worker never waits for the parent to wake up
                while worker.ready and not worker.broken and batch.queue and len(worker.pending) <= self.chunk_size:
                    chunk = batch.queue.popleft()
                    if not worker.pending:
                        worker.clock = now
                    worker.pending.extend(chunk)
                    try:
                        new = {rows[i]["reward"] for i in chunk} & set(self.shipped) - worker.known
                        worker.known |= new
                        if new:  # the worker imports their modules before this chunk's first item
                            worker.loading_at = chunk[0]
                        frames.send(
                            worker.sock,
                            (
                                {n: self.shipped[n] for n in sorted(new)},
                                [(i, completions[i], rows[i], task) for i in chunk],
                            ),
                        )
                    except OSError:  # it died on an earlier item; reading its socket will say EOF
                        worker.broken = True
            deadlines = [w.clock + self._limit(w) for w in self._workers if w.pending]
            deadlines += [w.started + self.start_timeout_s for w in self._workers if not w.ready]
            by_sock = {w.sock: w for w in self._workers}
            readable = wait(list(by_sock), timeout=max(0.0, min(deadlines) - now))
            if readable and self.coalesce_s:
                time.sleep(self.coalesce_s)  # let results pile up: one wake-up per many items
            for sock in readable:
                self._collect(by_sock[sock], batch)
            self._enforce_deadlines(batch)
        return batch.results, batch.gold_errors  # type: ignore[return-value]

    def _collect(self, worker: _Worker, batch: _Batch) -> None:
        """Record what ``worker`` has sent; if it has died, its current item fails."""
        try:
            messages = worker.reader.read_available()
        except (EOFError, OSError):
            if not worker.ready:
                raise RuntimeError(
                    f"a reward worker exited while starting ({worker.exit_reason()}); its traceback is on "
                    "stderr — check that lit_rlvr and any custom reward modules import in a fresh interpreter"
                ) from None
            self._fail_current(worker, ScoreResult(0.0, STATUS_ERROR, f"worker died ({worker.exit_reason()})"), batch)
            return
        for message in messages:
            if message == ("ready",):
                worker.ready = True
                continue
            if message == ("loaded",):  # it imported new reward modules: its current item starts now
                worker.clock, worker.loading_at = time.monotonic(), None
                continue
            index, reward, status, reason, answer, traceback, is_gold_error = message
            worker.pending.popleft()
            worker.clock = time.monotonic()  # the next item started about now
            batch.results[index] = ScoreResult(reward, status, reason, answer, traceback)
            if is_gold_error:
                batch.gold_errors.append(reason.removeprefix("malformed gold: "))
            batch.remaining -= 1

    def _limit(self, worker: _Worker) -> float:
        """How long ``worker``'s current item may run: the hard deadline, or while it imports the
        modules of rewards it meets for the first time (torch, say), the start-up allowance."""
        importing = worker.loading_at is not None and worker.pending and worker.pending[0] == worker.loading_at
        return self.start_timeout_s if importing else self.hard_timeout_s

    def _enforce_deadlines(self, batch: _Batch) -> None:
        """Kill workers stuck on an item past the hard deadline; fail workers that never start."""
        for worker in list(self._workers):
            now = time.monotonic()
            if worker.pending and now > worker.clock + self._limit(worker):
                if wait([worker.sock], 0):  # a result landed just now: the item finished in time
                    self._collect(worker, batch)
                else:
                    reason = f"killed after the hard deadline of {self.hard_timeout_s:g} s"
                    self._fail_current(worker, ScoreResult(0.0, STATUS_TIMEOUT, reason), batch)
            elif not worker.ready and now > worker.started + self.start_timeout_s:
                raise RuntimeError(
                    f"a reward worker did not start within {self.start_timeout_s} s "
                    f"(exit status {worker.proc.poll()}); check that lit_rlvr imports in a fresh interpreter"
                )

    def _fail_current(self, worker: _Worker, result: ScoreResult, batch: _Batch) -> None:
        """Score the worker's current item with ``result``, requeue the rest, replace the worker."""
        if worker.pending:
            batch.results[worker.pending.popleft()] = result
            batch.remaining -= 1
        if worker.pending:
            batch.queue.appendleft(list(worker.pending))
        self._replace(worker)

    def close(self) -> None:
        """Stop the workers (politely, then by force)."""
        for worker in self._workers:
            try:
                frames.send(worker.sock, None)
            except OSError:
                pass
        for worker in self._workers:
            try:
                worker.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
            worker.kill()
        self._workers.clear()

    def __enter__(self) -> BatchScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_workers", None):
            self.close()
