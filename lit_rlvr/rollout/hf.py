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
- A completion also stops at the token that closes an assistant turn in the tokenizer's chat
  template (:func:`chat_turn_end_ids`, e.g. ChatML's ``<|im_end|>``), not only at the
  tokenizer's and the generation config's EOS: base models with a chat template (Qwen2.5-Math)
  keep ``<|endoftext|>`` as EOS and would run on past the end of the turn.
- By default (``decode="fast"``) the tokens come from our own decode loop, :func:`decode_fast`,
  not ``generate``: one prefill of the left-padded batch, then one token per step on the KV
  cache under ``inference_mode``, dropping finished rows so late steps get cheaper. It draws
  exactly the random numbers ``generate``'s multinomial draws (one ``(B, V)`` exponential tensor
  per step, finished rows included), so with the same seed it returns the same rollouts, faster
  (``benchmarks/results/PERFORMANCE.md``). ``generate`` stays the path for encoder-decoder models,
  models without a dynamic KV cache, and sharded multi-process runs (``synced_gpus``).
- Inside :meth:`HFEngine.prefix_reuse` (the multi-turn loop enters it for a rollout) the fast loop
  keeps each row's keys and values between calls and prefills only the tokens after a kept prefix
  (:mod:`lit_rlvr.rollout.prefix`), as vLLM's prefix cache does: same rollouts, up to rounding.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from lit_rlvr.policy.loading import base_model
from lit_rlvr.policy.logprobs import eval_mode, reusable
from lit_rlvr.rollout.engine import ENGINES, EngineBase, announce, chat_turn_end_ids
from lit_rlvr.rollout.prefix import PrefixCache, RowKeeper, batch_past, weights_version
from lit_rlvr.rollout.types import Rollouts, SamplingParams
from lit_rlvr.rollout.weights import sync_weights


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


def sample_next(scores: Tensor, greedy: bool, rows: Tensor | None = None, batch: int | None = None) -> Tensor:
    """Next tokens from processed scores, drawing exactly what ``generate``'s sampler draws.

    ``torch.multinomial(softmax(scores), 1)`` is ``argmax(p / q)`` with ``q ~ Exp(1)`` of
    ``p``'s shape (ATen's one-sample path, the Gumbel-max trick). ``generate`` samples every row
    of its batch at every step, finished or not, so a loop that keeps only ``rows`` of a batch of
    ``batch`` rows still draws the full ``(batch, V)`` noise and reads its own rows of it: the RNG
    stream, and hence every sampled token, is the one ``generate`` would produce.

    Args:
        scores: ``(b, V)`` processed scores (:func:`process_logits`).
        greedy: argmax, no random numbers.
        rows: ``(b,)`` indices of these rows in the full batch; None = all ``batch`` rows.
        batch: rows of the full batch (default ``b``).

    Returns:
        ``(b,)`` long token ids.

    Example:
        >>> p = torch.tensor([[0.1, 0.9], [0.5, 0.5], [0.7, 0.3]])
        >>> _ = torch.manual_seed(3); torch.multinomial(p, 1).squeeze(1)
        tensor([0, 1, 0])
        >>> _ = torch.manual_seed(3); sample_next(p[[0, 2]].log(), greedy=False, rows=torch.tensor([0, 2]), batch=3)
        tensor([0, 0])
    """
    if greedy:
        return scores.argmax(-1)
    p = torch.softmax(scores, dim=-1)
    q = torch.empty((batch or p.shape[0], p.shape[-1]), dtype=p.dtype, device=p.device).exponential_()
    return (p / (q if rows is None else q[rows])).argmax(-1)


class _StopStrings:
    """Which completions' tail text now contains a stop string (completion text only, never the prompt)."""

    def __init__(self, stop: tuple[str, ...], tokenizer):
        self.stop = stop
        self.tokenizer = tokenizer
        self.window = 4 * max((len(s) for s in stop), default=0) + 8  # tokens of tail text to search

    def hits(self, tails: list[list[int]]) -> list[bool]:
        """``tails``: the last generated token ids of each row (at most ``window`` of them)."""
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        return [any(s in text for s in self.stop) for text in texts]


class _StepLog:
    """State shared by the processor (sees scores) and the stopper (sees the sampled token)."""

    def __init__(self, params: SamplingParams, prompt_len: int, batch: int, tokenizer):
        self.params = params
        self.prompt_len = prompt_len
        self.pending: Tensor | None = None  # (B, V) processed log-probs of the current step
        self.logprobs: list[Tensor] = []  # T tensors (B,)
        self.stop_len = [0] * batch  # completion length at which a stop string completed (0 = not)
        self.stops = _StopStrings(params.stop, tokenizer)


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
        start = max(log.prompt_len, input_ids.shape[1] - log.stops.window)
        for b, hit in enumerate(log.stops.hits(input_ids[:, start:].tolist())):
            if log.stop_len[b] == 0 and hit:
                log.stop_len[b] = n_gen
            done[b] = log.stop_len[b] > 0
        return done


@torch.inference_mode()
def decode_fast(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    params: SamplingParams,
    eos_ids: list[int],
    pad_id: int,
    tokenizer=None,
    drop_finished: bool = True,
    past: tuple[Any, Tensor] | None = None,
    keep: RowKeeper | None = None,
) -> tuple[Tensor, Tensor, list[int]]:
    """Sample completions of a left-padded batch with a lean KV-cache loop (``generate``'s output).

    Prefill once with position ids from the attention mask (left padding does not shift
    positions), then feed one token per row and step. Each step applies :func:`process_logits`
    (as ``generate`` does through ``_Processor``), records the log-prob of the sampled token under
    the processed distribution, and samples with :func:`sample_next`, which consumes the global
    RNG exactly as ``generate`` does. A row stops at an EOS id, at a completed stop string or at
    ``max_new_tokens``; finished rows leave the batch and its KV cache (``drop_finished``), or,
    for caches that cannot drop rows, stay in it fed with ``pad_id``. Rows leave in bulk, once an
    eighth of the batch has finished, so the cache is copied O(log B) times, not once per row,
    and at most an eighth of a step's rows are finished ones (a quarter computed ~10% dead
    row-steps on ragged 256-token completions, an eighth ~3%; a copy costs ~1 ms per layer).

    Args:
        model: a decoder-only transformers causal LM (possibly PEFT-wrapped) whose forward takes
            ``position_ids``, ``past_key_values`` and ``use_cache``.
        input_ids: ``(B, Lp)`` left-padded prompts.
        attention_mask: ``(B, Lp)``, 0 on padding.
        params: temperature (0 = greedy), top-k, top-p, max_new_tokens, stop strings.
        eos_ids: token ids that end a row (the EOS token is kept).
        pad_id: fills the completion after a row's end.
        tokenizer: decodes completion tails when ``params.stop`` is set.
        drop_finished: remove finished rows from the batch (False keeps them, as ``generate``).
        past: ``(cache, past_mask)``: keys and values the rows start with (a ``DynamicCache`` of
            ``(B, H, Lc, D)`` layers and its ``(B, Lc)`` mask, :func:`~lit_rlvr.rollout.prefix.batch_past`);
            ``input_ids`` are then the tokens after them, and positions count on from each row's cached tokens.
        keep: collects each row's keys and values (prompt and fed completion tokens) as it leaves
            the batch (:class:`~lit_rlvr.rollout.prefix.RowKeeper`), for caches that hold every token.

    Returns:
        ``tokens (B, S)`` (``pad_id`` after a row's end), ``logprobs (B, S)`` float32 (0 after a
        row's end) and, per row, the completion length at which a stop string completed (0 = none);
        S ≤ ``max_new_tokens`` is the number of steps run (until every row finished).

    Example:
        >>> from lit_rlvr.demo.tiny import build_char_tokenizer, build_tiny_llama
        >>> tok = build_char_tokenizer(); model = build_tiny_llama(tok, num_layers=1).eval()
        >>> ids = torch.tensor([[0, 5, 6], [7, 8, 9]]); mask = (ids != 0).long()  # ragged, left-padded
        >>> params = SamplingParams(temperature=0.0, max_new_tokens=4)
        >>> tokens, logprobs, stop_len = decode_fast(model, ids, mask, params, [tok.eos_token_id], 0)
        >>> tokens.shape, logprobs.shape, stop_len
        (torch.Size([2, 4]), torch.Size([2, 4]), [0, 0])
        >>> bool((logprobs <= 0).all())
        True
    """
    B = input_ids.shape[0]
    T, greedy = params.max_new_tokens, params.temperature == 0
    dev = input_ids.device
    tokens = torch.full((B, T), pad_id, dtype=torch.long, device=dev)
    logprobs = torch.zeros((B, T), dtype=torch.float32, device=dev)
    stops = _StopStrings(params.stop, tokenizer) if params.stop else None
    stop_len = [0] * B
    eos = torch.tensor(eos_ids, dtype=torch.long, device=dev)
    rows = torch.arange(B, device=dev)  # (b,) batch rows still in the forward
    live = torch.ones(B, dtype=torch.bool, device=dev)  # (b,) rows of the forward still generating
    position_ids = attention_mask.long().cumsum(-1) - 1  # as generate
    mask, cached = attention_mask, {}
    if past is not None:  # positions count on from each row's cached tokens; padding may sit between
        position_ids = position_ids + past[1].sum(-1, keepdim=True)
        mask, cached = torch.cat([past[1], attention_mask], dim=-1), {"past_key_values": past[0]}
    position_ids = position_ids.masked_fill(attention_mask == 0, 0)
    out = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=position_ids,
        use_cache=True,
        **cached,
        **_logits_to_keep(model),
    )
    cache, pos = out.past_key_values, position_ids[:, -1:]
    drop = drop_finished and _can_drop_rows(cache)
    keep = keep if keep is not None and reusable(cache) else None
    prompt_len = mask.sum(-1)  # (B,) real tokens before the completion
    ends = torch.full((B,), T, dtype=torch.long, device=dev)  # (B,) completion lengths (T while running)

    def leave(index: Tensor) -> None:  # rows at ``index`` of the forward leave: their fed tokens' keys and values
        b = rows[index]
        lengths = prompt_len[b] + ends[b].clamp(max=t - 1)  # step t - 1's token was sampled, never fed
        keep.take(b.tolist(), index.tolist(), lengths.tolist(), cache, mask)

    t = 0
    while True:
        scores = process_logits(out.logits[:, -1], params.temperature, params.top_k, params.top_p)  # (b, V)
        tok = sample_next(scores, greedy, rows, B)  # (b,)
        tok = torch.where(live, tok, pad_id)
        tokens[rows, t] = tok  # step t writes column t
        logprobs[rows, t] = torch.where(live, torch.log_softmax(scores, -1).gather(-1, tok[:, None]).squeeze(-1), 0.0)
        done = torch.isin(tok, eos)  # (b,)
        if stops is not None:
            idx = rows[live].tolist()
            for b, hit in zip(idx, stops.hits(tokens[idx, max(0, t + 1 - stops.window) : t + 1].tolist())):
                if hit:
                    stop_len[b] = t + 1
            done |= torch.tensor([stop_len[b] > 0 for b in rows.tolist()], device=dev)
        if keep is not None:
            ends[rows] = torch.where(live & done, t + 1, ends[rows])
        live &= ~done
        t += 1
        if t == T or not live.any():
            if keep is not None:
                leave(torch.arange(rows.numel(), device=dev))
            return tokens[:, :t], logprobs[:, :t], stop_len
        if drop and 8 * int(live.sum()) <= 7 * live.numel():  # an eighth finished: copying the cache pays
            if keep is not None:
                leave((~live).nonzero().squeeze(-1))
            stay = live.nonzero().squeeze(-1)
            cache.batch_select_indices(stay)
            rows, live, tok, mask, pos = rows[stay], live[stay], tok[stay], mask[stay], pos[stay]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
        pos = pos + 1
        out = model(
            input_ids=tok[:, None], attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True
        )


def _fast_decode_supported(model: nn.Module) -> bool:
    """Whether :func:`decode_fast` can drive ``model`` (decoder-only, position ids, dynamic KV cache)."""
    base = base_model(model)
    config = getattr(base, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    supports_cache = getattr(base, "_supports_default_dynamic_cache", None)
    params = inspect.signature(base.forward).parameters
    return callable(supports_cache) and supports_cache() and "position_ids" in params and "past_key_values" in params


def _logits_to_keep(model: nn.Module) -> dict:
    """``logits_to_keep=1`` for the prefill when the model takes it (as ``generate`` passes)."""
    base = base_model(model)
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(base.forward).parameters else {}


def _can_drop_rows(cache) -> bool:
    """Attention-only dynamic caches drop rows exactly; recurrent or static layers are left alone."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(cache, "layers", None)
    return (
        isinstance(cache, DynamicCache)
        and bool(layers)
        and all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)
    )


DECODE_MODES = ("fast", "generate")


class HFEngine(EngineBase):
    """Sample with transformers models from the live policy module.

    Args:
        model: the policy (a transformers causal LM, possibly PEFT-wrapped). When it is the
            trainer's module itself, :meth:`update_weights` is a no-op.
        tokenizer: its tokenizer (pad id, EOS ids, decoding, stop strings).
        max_batch_rows: cap on rows (prompt × sample) per ``generate`` call; None = all at once.
        decode: ``"fast"`` (default) samples with :func:`decode_fast` where it applies (decoder-only
            models with a dynamic KV cache, not in a sharded multi-process run) and with
            ``generate`` elsewhere; ``"generate"`` always uses ``model.generate``. Both give the
            same rollouts for the same seed.
        prefix_cache_mb: the most megabytes of keys and values :meth:`prefix_reuse` keeps between the
            turns of a multi-turn rollout (an integer >= 0; 0 turns prefix reuse off).
        generate_timeout_s / sync_timeout_s: see :func:`~lit_rlvr.rollout.engine.run_with_timeout`.
    """

    name = "hf"

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        *,
        max_batch_rows: int | None = None,
        decode: str = "fast",
        prefix_cache_mb: int = 1024,
        generate_timeout_s: float | None = None,
        sync_timeout_s: float | None = None,
    ):
        super().__init__(generate_timeout_s, sync_timeout_s)
        if max_batch_rows is not None and max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be >= 1 or None, got {max_batch_rows}")
        if not isinstance(prefix_cache_mb, int) or isinstance(prefix_cache_mb, bool) or prefix_cache_mb < 0:
            raise ValueError(
                f"HFEngine prefix_cache_mb must be an integer >= 0 (megabytes; 0 = no prefix reuse), got {prefix_cache_mb!r}"
            )
        if decode not in DECODE_MODES:
            raise ValueError(f"HFEngine decode must be one of {DECODE_MODES}, got {decode!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_rows = max_batch_rows
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_id is None:
            raise ValueError("HFEngine needs a tokenizer with a pad or EOS token for left padding, it has neither")
        self.eos_ids = _eos_ids(self._hf_model(), tokenizer)
        self.fast = decode == "fast" and _fast_decode_supported(model)
        self.prefix_cache_mb = prefix_cache_mb
        self.prefix_cache: PrefixCache | None = None  # set inside prefix_reuse()
        self._reuse_depth = 0
        arch = type(self._hf_model()).__name__
        how = "a KV-cache decode loop" if self.fast else "transformers generate"
        announce(f"lit_rlvr rollout engine: {how} on the live policy (HFEngine, {arch})")

    def _hf_model(self) -> nn.Module:
        return base_model(self.model)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @contextlib.contextmanager
    def prefix_reuse(self) -> Iterator[None]:
        """Keep each row's keys and values between ``generate`` calls for the duration of the block.

        A call inside it prefills only the tokens after each prompt's longest kept prefix (a row it
        generated earlier: prompt and completion), and keeps its own rows for the next call
        (:mod:`lit_rlvr.rollout.prefix`), within ``prefix_cache_mb``. The multi-turn loop enters it
        for one rollout, whose turns extend the trajectories of the turn before. The kept rows are
        dropped when the weights change (:meth:`update_weights`, or any parameter written in place)
        and when the outermost block ends. A no-op with ``prefix_cache_mb: 0``, with
        ``decode="generate"`` and in sharded multi-process runs; completions and log-probs are those
        of a full prefill up to floating-point rounding.
        """
        if self._reuse_depth == 0 and self.prefix_cache_mb > 0 and self.fast:
            self.prefix_cache = PrefixCache(self.prefix_cache_mb * 2**20)
        self._reuse_depth += 1
        try:
            yield
        finally:
            self._reuse_depth -= 1
            if self._reuse_depth == 0:
                self.prefix_cache = None

    def _generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        if self.prefix_cache is not None:
            self.prefix_cache.check(weights_version(self.model))
        rows = [list(p) for p in prompt_ids for _ in range(params.n)]  # prompt-major
        step = self.max_batch_rows or len(rows)
        parts: list[tuple[list[list[int]], list[list[float]], list[str], list[str]]] = []
        with _sampling_rng(params.seed, self.device), eval_mode(self.model), torch.no_grad():
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
        fast = self.fast and not _sharded_world()  # sharded forwards need generate's synced_gpus
        reuse = self.prefix_cache if fast else None
        hits = [reuse.lookup(r) for r in rows] if reuse is not None else [None] * len(rows)
        new = [r[hit[1] :] if hit else r for r, hit in zip(rows, hits)]  # the tokens to prefill
        B, Lp = len(new), max(len(r) for r in new)
        input_ids = torch.full((B, Lp), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((B, Lp), dtype=torch.long)
        for b, r in enumerate(new):  # left padding: every completion starts at column Lp
            input_ids[b, Lp - len(r) :] = torch.tensor(r, dtype=torch.long)
            attention_mask[b, Lp - len(r) :] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        keep = RowKeeper(reuse.max_bytes) if reuse is not None else None
        if fast:
            past = batch_past([(hit[0].kv, hit[1]) if hit else None for hit in hits]) if any(hits) else None
            tokens, lps, stop_len = decode_fast(
                self.model,
                input_ids,
                attention_mask,
                params,
                self.eos_ids,
                self.pad_id,
                self.tokenizer,
                past=past,
                keep=keep,
            )
        else:
            tokens, lps, stop_len = self._decode_generate(input_ids, attention_mask, params)
        seqs, lps = tokens.tolist(), lps.float().cpu().tolist()
        completions, logprobs, reasons, texts = [], [], [], []
        for b in range(B):
            ids, length, reason = self._trim(seqs[b], stop_len[b], params.max_new_tokens)
            completions.append(ids)
            logprobs.append(lps[b][:length])
            reasons.append(reason)
            texts.append(_cut_after_stop(self.tokenizer.decode(ids, skip_special_tokens=True), params.stop))
        if keep is not None:
            self._keep_rows(rows, completions, hits, keep)
        return completions, logprobs, reasons, texts

    def _keep_rows(self, rows: list[list[int]], completions: list[list[int]], hits: list, keep: RowKeeper) -> None:
        """Store the call's rows (prompt and the completion tokens that were fed) in place of the
        entries they extend: the next turn continues each trajectory from its latest tokens."""
        for hit in filter(None, hits):
            self.prefix_cache.discard(hit[0])
        for b, kv in keep.kept.items():
            self.prefix_cache.store(rows[b] + completions[b][: kv.length - len(rows[b])], kv)

    def _decode_generate(self, input_ids: Tensor, attention_mask: Tensor, params: SamplingParams):
        """``model.generate`` with our processor and stopper: ``tokens (B, S)``, ``logprobs (B, S)``, stop lengths."""
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        B, Lp = input_ids.shape
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
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                logits_processor=LogitsProcessorList([_Processor(log)]),
                stopping_criteria=StoppingCriteriaList([_Stopper(log)]),
                synced_gpus=_sharded_world(),  # FSDP: every rank runs as many forwards as the longest
            )
        lps = torch.stack(log.logprobs, dim=1) if log.logprobs else torch.zeros((B, 0))
        return out[:, Lp:], lps, log.stop_len

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

    def probe_logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """Per-token log-probs at temperature 1 of ``completion_ids`` after ``prompt_ids``."""
        from lit_rlvr.policy import sequence_logprob

        with eval_mode(self.model):
            return sequence_logprob(self.model, prompt_ids, completion_ids).float().cpu().tolist()

    def _update_weights(self, model: nn.Module) -> None:
        if self.prefix_cache is not None:  # computed with the old weights
            self.prefix_cache.clear()
        if model is self.model:
            return  # sampling from the live module: nothing to copy
        target = self.model.state_dict()
        seen, unknown = set(), []
        with torch.no_grad(), sync_weights(model) as weights:
            for name, tensor in weights:  # always exhausted: under FSDP2 every tensor is an all-gather
                if name not in target:
                    unknown.append(name)
                    continue
                target[name].copy_(tensor)
                self._stats.sync_bytes += tensor.numel() * tensor.element_size()
                seen.add(name)
        if unknown:
            raise KeyError(
                f"HFEngine.update_weights: policy tensor {unknown[0]!r} has no counterpart in the engine's "
                f"model ({type(self.model).__name__}); engine keys look like {sorted(target)[:3]}"
            )
        missing = set(target) - seen
        if missing:
            raise KeyError(f"HFEngine.update_weights: the policy did not provide {sorted(missing)[:5]}")


@ENGINES.register("hf", signature=HFEngine)
def build_hf_engine(
    *, model: nn.Module | None = None, tokenizer=None, model_path: str | None = None, **kwargs
) -> HFEngine:
    """``engine: hf``: an :class:`HFEngine` sampling from the live policy (``model_path`` unused)."""
    if model is None or tokenizer is None:
        raise ValueError("build_engine('hf') needs the live policy model and its tokenizer")
    return HFEngine(model, tokenizer, **kwargs)


def _eos_ids(model: nn.Module, tokenizer) -> list[int]:
    """EOS ids: the tokenizer's, the model's generation config's (vLLM uses both), and the chat's turn end."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    cfg_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if cfg_eos is not None:
        ids += [cfg_eos] if isinstance(cfg_eos, int) else list(cfg_eos)
    return list(dict.fromkeys(ids + chat_turn_end_ids(tokenizer)))


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
    return (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )
