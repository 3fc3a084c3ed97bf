"""Rollouts with ``transformers`` ``generate`` on the live policy: the fallback without vLLM.

The engine samples from the module being trained, so it needs no weight sync (when given a
separate inference copy, :meth:`HFEngine.update_weights` copies the policy's weights into it).

Where this departs from plain ``model.generate(do_sample=True, temperature=...)``, and why:

- Temperature, top-k and top-p are applied by one logits processor of ours,
  :func:`process_logits`, with vLLM's semantics (top-k keeps ties, then top-p keeps the
  smallest head of the sorted distribution whose mass reaches p), and the model's own
  ``generation_config`` (repetition penalty, default top_k=50, ...) is masked for the call, so
  both engines sample the same distribution and report its log-probs (vLLM's
  ``processed_logprobs``).
- Log-probs are gathered step by step (one ``(B, V)`` buffer), not from ``output_scores``, which
  would keep ``(T, B, V)`` floats.
- Stop strings are matched on the completion text only (never across the prompt boundary) and
  the text is cut after the stop string, as vLLM does with ``include_stop_str_in_output``.
- A seed makes sampling reproducible without touching the caller's global RNG state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from lit_rlvr.rollout.engine import EngineBase, announce
from lit_rlvr.rollout.types import Rollouts, SamplingParams
from lit_rlvr.rollout.weights import is_peft_model, sync_weights


def process_logits(logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """The sampler's processed scores: temperature, then top-k, then top-p (vLLM's order).

    Removed tokens get ``-inf``; ``log_softmax`` of the result is the distribution sampled from.
    Temperature 0 means greedy: the logits are returned unscaled (greedy log-probs are those at
    temperature 1, as in vLLM).

    Args:
        logits: ``(B, V)`` next-token logits.
        temperature: > 0 to scale, 0 for greedy.
        top_k: keep the k largest (ties with the k-th kept); 0 = off.
        top_p: keep the smallest set of largest tokens with mass >= top_p; 1.0 = off.

    Returns:
        ``(B, V)`` float32 processed scores.

    Example:
        >>> x = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
        >>> process_logits(x, 1.0, top_k=2).softmax(-1)
        tensor([[0.6250, 0.3750, 0.0000, 0.0000]])
        >>> process_logits(x, 1.0, top_p=0.8).softmax(-1)  # 0.5 + 0.3 reaches 0.8
        tensor([[0.6250, 0.3750, 0.0000, 0.0000]])
        >>> process_logits(x, 1.0, top_p=0.81).softmax(-1)
        tensor([[0.5263, 0.3158, 0.1579, 0.0000]])
    """
    x = logits.float()
    if temperature > 0 and temperature != 1.0:
        x = x / temperature
    if temperature == 0 or (top_k == 0 and top_p >= 1.0):
        return x
    sorted_x, idx = x.sort(dim=-1, descending=False)  # ascending, as vLLM
    V = x.shape[-1]
    if 0 < top_k < V:
        kth = sorted_x[:, V - top_k : V - top_k + 1]
        sorted_x = sorted_x.masked_fill(sorted_x < kth, float("-inf"))
    if top_p < 1.0:
        cum = sorted_x.softmax(-1).cumsum(-1)
        drop = cum <= 1 - top_p
        drop[:, -1] = False  # at least one token
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    return torch.empty_like(x).scatter_(-1, idx, sorted_x)


class _StepLog:
    """State shared by the processor (sees scores) and the stopper (sees the sampled token)."""

    def __init__(self, params: SamplingParams, prompt_len: int, batch: int, tokenizer):
        self.params = params
        self.prompt_len = prompt_len
        self.tokenizer = tokenizer
        self.pending: Tensor | None = None  # (B, V) processed log-probs of the current step
        self.logprobs: list[Tensor] = []  # T tensors (B,)
        self.stop_len = [0] * batch  # completion length at which a stop string completed (0 = not)
        self.window = 4 * max((len(s) for s in params.stop), default=0) + 8  # tokens of tail text to search


class _Processor:
    def __init__(self, log: _StepLog):
        self.log = log

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        p = self.log.params
        x = process_logits(scores, p.temperature, p.top_k, p.top_p)
        self.log.pending = torch.log_softmax(x, dim=-1)
        return x


class _Stopper:
    def __init__(self, log: _StepLog):
        self.log = log

    def __call__(self, input_ids: Tensor, scores, **kwargs) -> Tensor:
        log = self.log
        tok = input_ids[:, -1:]
        log.logprobs.append(log.pending.gather(-1, tok).squeeze(-1))
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        if not log.params.stop:
            return done
        n_gen = input_ids.shape[1] - log.prompt_len
        start = max(log.prompt_len, input_ids.shape[1] - log.window)
        tails = log.tokenizer.batch_decode(input_ids[:, start:].tolist(), skip_special_tokens=True)
        for b, text in enumerate(tails):
            if log.stop_len[b] == 0 and any(s in text for s in log.params.stop):
                log.stop_len[b] = n_gen
            done[b] = log.stop_len[b] > 0
        return done


class HFEngine(EngineBase):
    """Sample with ``transformers`` ``generate`` from the live policy module.

    Args:
        model: the policy (a transformers causal LM, possibly PEFT-wrapped). When it is the
            trainer's module itself, :meth:`update_weights` is a no-op.
        tokenizer: its tokenizer (pad id, EOS ids, decoding, stop strings).
        max_batch_rows: cap on rows (prompt × sample) per ``generate`` call; None = all at once.
        generate_timeout_s / sync_timeout_s: see :func:`~lit_rlvr.rollout.engine.run_with_timeout`.
    """

    name = "hf"

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        *,
        max_batch_rows: int | None = None,
        generate_timeout_s: float | None = None,
        sync_timeout_s: float | None = None,
    ):
        super().__init__(generate_timeout_s, sync_timeout_s)
        if max_batch_rows is not None and max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be >= 1 or None, got {max_batch_rows}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_rows = max_batch_rows
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_id is None:
            raise ValueError("HFEngine needs a tokenizer with a pad or EOS token for left padding, it has neither")
        self.eos_ids = _eos_ids(self._hf_model(), tokenizer)
        arch = type(self._hf_model()).__name__
        announce(f"lit_rlvr rollout engine: transformers generate on the live policy (HFEngine, {arch})")

    def _hf_model(self) -> nn.Module:
        return self.model.get_base_model() if is_peft_model(self.model) else self.model

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        rows = [list(p) for p in prompt_ids for _ in range(params.n)]  # prompt-major
        step = self.max_batch_rows or len(rows)
        parts: list[tuple[list[list[int]], list[list[float]], list[str], list[str]]] = []
        with _sampling_rng(params.seed, self.device), _eval_mode(self.model), torch.no_grad():
            for i in range(0, len(rows), step):
                parts.append(self._generate_rows(rows[i : i + step], params))
        return Rollouts(
            prompt_ids=[list(p) for p in prompt_ids],
            completion_ids=[c for part in parts for c in part[0]],
            sampler_logprobs=[lp for part in parts for lp in part[1]],
            finish_reasons=[f for part in parts for f in part[2]],
            n=params.n,
            texts=[t for part in parts for t in part[3]],
        )

    def _generate_rows(self, rows: list[list[int]], params: SamplingParams):
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        B, Lp = len(rows), max(len(r) for r in rows)
        input_ids = torch.full((B, Lp), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((B, Lp), dtype=torch.long)
        for b, r in enumerate(rows):  # left padding: every completion starts at column Lp
            input_ids[b, Lp - len(r) :] = torch.tensor(r, dtype=torch.long)
            attention_mask[b, Lp - len(r) :] = 1
        log = _StepLog(params, Lp, B, self.tokenizer)
        # sampling knobs are neutral here: _Processor applies them (warpers would come after it)
        neutral = {"temperature": 1.0, "top_k": 0, "top_p": 1.0} if params.temperature > 0 else {}
        config = GenerationConfig(
            do_sample=params.temperature > 0,
            max_new_tokens=params.max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids,
            **neutral,
        )
        with _plain_generation_config(self._hf_model()):
            out = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                generation_config=config,
                logits_processor=LogitsProcessorList([_Processor(log)]),
                stopping_criteria=StoppingCriteriaList([_Stopper(log)]),
                synced_gpus=_sharded_world(),  # FSDP: every rank runs as many forwards as the longest
            )
        seqs = out[:, Lp:].tolist()
        lps = torch.stack(log.logprobs, dim=1).float().cpu().tolist() if log.logprobs else [[] for _ in rows]
        completions, logprobs, reasons, texts = [], [], [], []
        for b in range(B):
            ids, length, reason = self._trim(seqs[b], log.stop_len[b], params.max_new_tokens)
            completions.append(ids)
            logprobs.append(lps[b][:length])
            reasons.append(reason)
            texts.append(_cut_after_stop(self.tokenizer.decode(ids, skip_special_tokens=True), params.stop))
        return completions, logprobs, reasons, texts

    def _trim(self, seq: list[int], stop_len: int, max_new_tokens: int) -> tuple[list[int], int, str]:
        """Cut a padded generated row at its first EOS (kept) or completed stop string."""
        ends = [stop_len] if stop_len > 0 else []
        eos_at = next((t for t, tok in enumerate(seq) if tok in self.eos_ids), None)
        if eos_at is not None:
            ends.append(eos_at + 1)
        if ends:
            length = min(ends)
            return seq[:length], length, "stop"
        length = min(len(seq), max_new_tokens)
        return seq[:length], length, "length"

    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """Per-token log-probs at temperature 1 of ``completion_ids`` after ``prompt_ids``."""
        from lit_rlvr.policy import sequence_logprob

        with _eval_mode(self.model):
            return sequence_logprob(self.model, prompt_ids, completion_ids).float().cpu().tolist()

    def _update_weights(self, model: nn.Module) -> None:
        if model is self.model:
            return  # sampling from the live module: nothing to copy
        target = self.model.state_dict()
        with torch.no_grad(), sync_weights(model) as weights:
            seen = set()
            for name, tensor in weights:
                if name not in target:
                    raise KeyError(
                        f"HFEngine.update_weights: policy tensor {name!r} has no counterpart in the engine's "
                        f"model ({type(self.model).__name__}); engine keys look like {sorted(target)[:3]}"
                    )
                target[name].copy_(tensor)
                seen.add(name)
        missing = set(target) - seen
        if missing:
            raise KeyError(f"HFEngine.update_weights: the policy did not provide {sorted(missing)[:5]}")


def _eos_ids(model: nn.Module, tokenizer) -> list[int]:
    """EOS ids from the tokenizer and the model's generation config (vLLM uses both)."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    cfg_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if cfg_eos is not None:
        ids += [cfg_eos] if isinstance(cfg_eos, int) else list(cfg_eos)
    return list(dict.fromkeys(ids))


def _cut_after_stop(text: str, stop: tuple[str, ...]) -> str:
    """Keep text up to the end of the earliest stop string.

    Example:
        >>> _cut_after_stop("1+1=2;junk", (";", "=9"))
        '1+1=2;'
    """
    ends = [text.find(s) + len(s) for s in stop if s in text]
    return text[: min(ends)] if ends else text


@contextlib.contextmanager
def _plain_generation_config(model: nn.Module) -> Iterator[None]:
    """Hide the model's generation_config defaults (top_k, penalties, ...) for one call."""
    from transformers import GenerationConfig

    saved = getattr(model, "generation_config", None)
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextlib.contextmanager
def _sampling_rng(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed sampling without changing the caller's RNG streams."""
    if seed is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
        torch.manual_seed(seed)
        yield


def _sharded_world() -> bool:
    """True in a multi-process run: sharded (FSDP) forwards are collectives, so ranks stay in step."""
    return torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
