"""Scoring completions with a causal LM: the one place that lines up logits with completion tokens.

Used by the trainer (current log-probs), the reference cache (stored log π_ref), the rollout
engines' weight-sync fingerprint and the drift check, so all of them agree on positions, padding
and temperature.

Two forwards give the same per-token log-probs (to float rounding; ``tests/policy/test_padding_free.py``):

- padded (:func:`completion_logprobs`): the ``Rollouts.to_padded`` layout, position ids from the
  attention mask, logits only for the completion window (``logits_to_keep``);
- padding-free (``padding_free=True``): each row's real tokens packed end to end into a few rows,
  position ids restarting at 0 for every sequence and no attention mask, so transformers keeps
  the sequences apart: flash-attention through its varlen kernel (one packed row), sdpa / eager
  through a block-diagonal causal mask (rows of at most the longest sequence, first-fit
  decreasing). :func:`packs_sequences` checks once per model, on a probe, that it really does;
- shared prompts (``shared_prompts=True``): each distinct prompt forwarded once, its keys and
  values repeated for its rows' completions (:func:`shares_prompts` checks the model once).

:func:`batched_completion_logprobs` splits a batch into length-sorted micro-batches under a row
cap and a token budget (:class:`MicroBatching`), each cropped to its own longest row.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_rlvr.functional.batching import (
    crop_padding,
    pack_bins,
    segment_lengths,
    token_budget_batches,
)
from lit_rlvr.functional.logprobs import token_entropy, token_logprobs
from lit_rlvr.policy.loading import base_model


def completion_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_len: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    padding_free: bool = False,
    entropy_grad: bool = False,
    shared_prompts: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs (and optionally entropies) of the last ``response_len`` columns.

    The layout is :meth:`lit_rlvr.rollout.types.Rollouts.to_padded`'s: prompts left-padded,
    completions right-padded, so the completion occupies the last T = ``response_len`` columns.
    Position ids are derived from the attention mask, so left padding does not shift positions.
    Every row needs at least one prompt token (the first completion token is predicted from it).

    Args:
        model: a transformers causal LM (returns ``.logits``).
        input_ids: ``(B, Lp+T)``.
        attention_mask: ``(B, Lp+T)``.
        response_len: T.
        temperature: the sampling temperature the log-probs should describe.
        with_entropy: also return token entropies (token masks, entropy-adaptive Pass@k, logging).
        padding_free: run the packed forward instead (only for a model that
            :func:`packs_sequences`; the values are the same).
        entropy_grad: keep the entropies differentiable (the entropy bonus); detached otherwise.
        shared_prompts: forward each distinct prompt once (:func:`_shared_prompt_logprobs`; only for a
            model that :func:`shares_prompts`; the values are the same). Takes precedence over ``padding_free``.

    Returns:
        ``logprobs (B, T)`` float32 and ``entropy (B, T)`` or None. Values on padded completion
        positions are meaningless (0 in the padding-free forward) and must be masked with
        ``response_mask``.
    """
    if shared_prompts:
        return _shared_prompt_logprobs(
            model, input_ids, attention_mask, response_len, temperature, with_entropy, entropy_grad
        )
    if padding_free:
        return _packed_logprobs(model, input_ids, attention_mask, response_len, temperature, with_entropy, entropy_grad)
    T = response_len
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        **_logits_to_keep(model, T + 1),
    ).logits
    logits = logits[:, -T - 1 : -1]  # (B, T, V): position t predicts token t+1
    labels = input_ids[:, -T:]  # (B, T)
    logprobs = token_logprobs(logits, labels, temperature)
    entropy = token_entropy(logits if entropy_grad else logits.detach(), temperature) if with_entropy else None
    return logprobs, entropy


def _packed_logprobs(model, input_ids, attention_mask, response_len, temperature, with_entropy, entropy_grad=False):
    """:func:`completion_logprobs` with every row's real tokens packed end to end (no padding)."""
    B, T, dev = input_ids.shape[0], response_len, input_ids.device
    lengths = segment_lengths(attention_mask, attention_mask[:, -T:])  # (B, 2) real (prompt, completion) tokens
    if not int(lengths[:, 1].sum()):  # no completion token: nothing to pack, keep the graph of the padded forward
        return completion_logprobs(
            model, input_ids, attention_mask, T, temperature, with_entropy, entropy_grad=entropy_grad
        )
    n = lengths.sum(-1)  # (B,) real tokens per row
    varlen = _attention_kind(model) == "varlen"  # flash-attention's varlen path takes one packed row
    bins = pack_bins(n, capacity=None if varlen else int(n.max()))
    flat = input_ids[attention_mask.bool()]  # (N,) real tokens, row after row
    n = n.to(dev)
    row_of = torch.arange(B, device=dev).repeat_interleave(n)  # (N,) row of every real token
    j = torch.arange(len(flat), device=dev) - (n.cumsum(0) - n)[row_of]  # (N,) index in its row
    packed, positions, dest = _pack(flat, n, row_of, j, bins, pad_id=0)
    prompt = lengths[:, 0].to(dev)[row_of]  # (N,)
    target = (j >= prompt).nonzero().squeeze(-1)  # (Nc,) completion tokens; the token before predicts each
    W = packed.shape[1]
    where = dest[target - 1]  # (Nc,) packed slot of the predicting token
    keep, col = torch.unique(where % W, return_inverse=True)
    kwargs = _logits_to_keep(model, keep)
    logits = model(input_ids=packed, position_ids=positions, use_cache=False, **kwargs).logits  # (bins, K or W, V)
    chosen = logits[where // W, col if kwargs else where % W][None]  # (1, Nc, V)
    labels = flat[target][None]  # (1, Nc)
    rows, cols = row_of[target], (j - prompt)[target]
    lp = torch.zeros(B, T, dtype=torch.float32, device=dev).index_put(
        (rows, cols), token_logprobs(chosen, labels, temperature)[0]
    )
    entropy = None
    if with_entropy:
        values = token_entropy(chosen if entropy_grad else chosen.detach(), temperature)[0]
        entropy = torch.zeros(B, T, dtype=torch.float32, device=dev).index_put((rows, cols), values)
    return lp, entropy


def _shared_prompt_logprobs(model, input_ids, attention_mask, response_len, temperature, with_entropy, entropy_grad):
    """:func:`completion_logprobs` with each distinct prompt forwarded once (shared-prefix forward:
    Liu et al. 2025, "Prefix Grouper: Efficient GRPO Training through Shared-Prefix Forward").

    Rows whose prompt columns (tokens and padding) are equal form a group; one forward over the U
    distinct prompts keeps their keys and values ``(U, H, Lp, D)`` per layer, which are repeated for
    each row (an index, so every row's gradient reaches its prompt's one forward), and a second forward
    runs the B completions ``(B, T)`` on them, positions counting on from each prompt's length. The
    first completion token is predicted from the prompt's last position. Always two forwards, however
    many prompts repeat, so data-parallel ranks stay in step. The G samples of a GRPO group share their
    prompt: on the CPU demo's shapes (16 prompts × 16 samples, ~10 + 8 tokens) forward and backward
    took ~0.5× the padded forward's time (docs/performance.md).
    """
    from transformers.cache_utils import DynamicCache

    T, (B, L), dev = response_len, input_ids.shape, input_ids.device
    prompt_ids, prompt_mask = input_ids[:, : L - T], attention_mask[:, : L - T]
    _, inverse = torch.unique(prompt_ids.masked_fill(prompt_mask == 0, -1), dim=0, return_inverse=True)  # (B,)
    rows = torch.arange(B, device=dev)
    first = torch.full((int(inverse.max()) + 1,), B, device=dev).scatter_reduce(0, inverse, rows, "amin")  # (U,)
    ids, mask = prompt_ids[first], prompt_mask[first]
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **_logits_to_keep(model, 1))
    layers = [(layer.keys[inverse], layer.values[inverse]) for layer in out.past_key_values.layers]
    positions = mask.long().sum(-1)[inverse][:, None] + torch.arange(T, device=dev)  # (B, T)
    logits = model(
        input_ids=input_ids[:, -T:],
        attention_mask=attention_mask,
        position_ids=positions,
        past_key_values=DynamicCache(ddp_cache_data=layers),
        use_cache=True,
    ).logits
    logits = torch.cat([out.logits[:, -1:][inverse], logits[:, :-1]], dim=1)  # (B, T, V): position t predicts t+1
    labels = input_ids[:, -T:]
    logprobs = token_logprobs(logits, labels, temperature)
    entropy = token_entropy(logits if entropy_grad else logits.detach(), temperature) if with_entropy else None
    return logprobs, entropy


def _pack(
    tokens: Tensor, n: Tensor, row_of: Tensor, j: Tensor, bins: list[Tensor], pad_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Lay rows of ``n (B,)`` tokens end to end into ``bins``.

    ``tokens (N,)`` is the row-major concatenation of the rows, ``row_of (N,)`` and ``j (N,)`` each
    token's row and index in it. Returns ``packed (nb, W)``, ``positions (nb, W)`` restarting at 0
    for each row (the tail of a bin is one more sequence, of padding, so nothing attends to it)
    and ``dest (N,)``, the flat slot of every token.
    """
    dev = tokens.device
    bin_of = torch.empty_like(n)
    start = torch.empty_like(n)  # offset of each row inside its bin
    used = torch.zeros(len(bins), dtype=torch.long, device=dev)
    for k, rows in enumerate(bins):
        rows = rows.to(dev)
        bin_of[rows] = k
        start[rows] = n[rows].cumsum(0) - n[rows]
        used[k] = n[rows].sum()
    W = max(int(used.max()), 1)
    dest = bin_of[row_of] * W + start[row_of] + j
    cols = torch.arange(W, device=dev).repeat(len(bins))
    positions = (cols - used.repeat_interleave(W)).clamp(min=0)  # the tail: 0, 1, 2, ...
    positions[dest] = j
    packed = torch.full((len(bins) * W,), pad_id, dtype=tokens.dtype, device=dev)
    packed[dest] = tokens
    return packed.view(len(bins), W), positions.view(len(bins), W), dest


def _logits_to_keep(model: nn.Module, keep: int | Tensor) -> dict:
    """``logits_to_keep`` (the last ``keep`` positions, or those indexed) when the model's forward takes it."""
    return (
        {"logits_to_keep": keep} if "logits_to_keep" in inspect.signature(base_model(model).forward).parameters else {}
    )


def _attention_kind(model: nn.Module) -> str | None:
    """How ``model``'s attention can keep packed sequences apart: ``varlen`` (flash-attention, one
    packed row), ``mask`` (a block-diagonal mask built by transformers: sdpa, eager, flex) or None."""
    impl = str(getattr(getattr(base_model(model), "config", None), "_attn_implementation", None) or "")
    if "flash" in impl:
        return "varlen"
    return "mask" if impl in ("sdpa", "eager", "flex_attention") else None


def _packing_pays(model: nn.Module, kind: str | None) -> bool:
    """``padding_free="auto"``: flash varlen anywhere, sdpa's block-diagonal mask on CPU (measured)."""
    if kind == "varlen":
        return True
    impl = getattr(getattr(base_model(model), "config", None), "_attn_implementation", None)
    return kind == "mask" and impl == "sdpa" and next(model.parameters()).device.type == "cpu"


_PACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> max |Δ log-prob| on the probe


def check_padding_free(value) -> None:
    """Raise ``ValueError`` unless ``value`` is ``"auto"``, ``True`` or ``False`` (not 1, not "true")."""
    if not (value == "auto" or isinstance(value, bool)):
        raise ValueError(f"model.batching.padding_free must be 'auto', true or false, got {value!r}")


def packs_sequences(model: nn.Module, padding_free: bool | str) -> bool:
    """Whether to use the padding-free forward for ``model`` under the ``padding_free`` option.

    ``False``: never. ``True``: wherever the model keeps packed sequences apart. ``"auto"``:
    where that was measured to pay: flash-attention's varlen kernel (no padding, no mask) on any
    device, and sdpa on CPU, where the block-diagonal mask of first-fit-decreasing bins computed
    a ragged batch's forward + backward in 0.92x the CPU time of the best padded token budget
    and 0.35x of one padded micro-batch (one preliminary measurement on a shared machine,
    ``benchmarks/results/PERFORMANCE.md``); sdpa on GPU and
    eager stay padded under ``"auto"`` (not measured). Both ``"auto"`` and ``True`` first check on
    a two-sequence probe (once per model) that packed and separate log-probs agree.

    Raises:
        ValueError: ``padding_free`` is not one of ``"auto"``, ``True``, ``False``; or ``True``
            for a model whose attention does not keep packed sequences apart.
    """
    check_padding_free(padding_free)
    kind = _attention_kind(model)
    if padding_free is False or (padding_free == "auto" and not _packing_pays(model, kind)):
        return False
    if model not in _PACKS:
        _PACKS[model] = _probe_packing(model) if kind is not None else float("inf")
    dtype = next(model.parameters()).dtype
    ok = _PACKS[model] <= (1e-3 if dtype == torch.float32 else 5e-2)
    if padding_free is True and not ok:
        impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
        raise ValueError(
            f"model.batching.padding_free=true: {type(model).__name__} with attn_implementation={impl!r} does not keep packed "
            f"sequences apart (max |log-prob difference| {_PACKS[model]:.3g} on a probe); use padding_free: auto or "
            "false, or an attention that packs (flash_attention_2, sdpa, eager)"
        )
    return ok


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode for the block (no dropout), its training flag restored after it."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _probe_input(model: nn.Module) -> tuple[torch.device, int]:
    """The device of ``model``'s parameters and its vocabulary size (8 if it has no output embeddings): a probe's ids."""
    out = model.get_output_embeddings()
    return next(model.parameters()).device, out.weight.shape[0] if out is not None else 8


@torch.no_grad()
def _probe_packing(model: nn.Module) -> float:
    """Max |packed − separate| log-prob over two short sequences packed into one row."""
    with eval_mode(model):
        device, vocab = _probe_input(model)
        rows = [torch.arange(1, 6) % vocab, (torch.arange(3, 11) * 7) % vocab]  # 5 and 8 tokens, 2 of prompt each
        ids = torch.cat(rows)[None].to(device)
        positions = torch.cat([torch.arange(len(r)) for r in rows])[None].to(device)
        logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits.float()  # (1, 13, V)
        err, offset = 0.0, 0
        for r in rows:
            alone = model(input_ids=r[None].to(device), use_cache=False).logits.float()[0]
            packed = logits[0, offset : offset + len(r)]
            err = max(err, float((packed.log_softmax(-1) - alone.log_softmax(-1)).abs().max()))
            offset += len(r)
        return err


def reusable(cache) -> bool:
    """Whether ``cache`` holds every token's keys and values (transformers ``DynamicCache`` of plain
    attention layers), so that a row's prefix can be cut out of it and fed back."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    layers = getattr(cache, "layers", None)
    return isinstance(cache, DynamicCache) and bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


_SHARES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> max |Δ log-prob| on the probe, or why not


def shares_prompts(model: nn.Module, shared_prompts: bool) -> bool:
    """Whether to use the shared-prompt forward for ``model`` under ``model.batching.shared_prompts``.

    ``True`` is checked once per model, on a probe of two rows that share a prompt, against the padded
    forward: the model must keep every prompt token's keys and values (transformers' plain
    ``DynamicLayer`` caches, :func:`reusable`: no sliding-window or recurrent layers) and take them back
    through ``past_key_values``.

    Raises:
        ValueError: ``True`` with gradient checkpointing (which drops the keys and values), or for a
            model the probe finds unable to share (the log-prob difference or the reason named).
    """
    if not shared_prompts:
        return False
    if getattr(base_model(model), "is_gradient_checkpointing", False):
        raise ValueError(
            "model.batching.shared_prompts=true needs the prompts' keys and values, which gradient checkpointing "
            "drops: turn model.policy.gradient_checkpointing or model.batching.shared_prompts off"
        )
    if model not in _SHARES:
        _SHARES[model] = _probe_sharing(model)
    error = _SHARES[model]
    dtype = next(model.parameters()).dtype
    if isinstance(error, str) or error > (1e-3 if dtype == torch.float32 else 5e-2):
        reason = error if isinstance(error, str) else f"max |log-prob difference| {error:.3g} on a probe"
        raise ValueError(
            f"model.batching.shared_prompts=true: {type(base_model(model)).__name__} cannot share its prompts' keys and "
            f"values ({reason}); use shared_prompts: false"
        )
    return True


@torch.no_grad()
def _probe_sharing(model: nn.Module) -> float | str:
    """Max |shared − padded| log-prob on three rows, two of them with one prompt, or why the model cannot share."""
    try:
        with eval_mode(model):
            device, vocab = _probe_input(model)
            ids = [[0, 1, 2, 3, 4, 5, 6, 0], [0, 1, 2, 3, 7, 8, 0, 0], [4, 3, 2, 1, 9, 7, 5, 3]]
            ids = torch.tensor(ids, device=device)
            mask = (torch.arange(8, device=device) >= 1) & (ids != 0)  # rows 0 and 1 share a left-padded prompt
            ids, mask = ids % vocab, mask.long()
            cache = model(input_ids=ids[:, :4], attention_mask=mask[:, :4], use_cache=True).past_key_values
            if not reusable(cache):
                return f"its cache {type(cache).__name__} does not keep every token's keys and values"
            want, _ = completion_logprobs(model, ids, mask, 4)
            got, _ = completion_logprobs(model, ids, mask, 4, shared_prompts=True)
    except Exception as err:  # a forward that does not take the cache back
        return f"{type(err).__name__}: {str(err)[:300]}"
    return float((want - got)[mask[:, 4:].bool()].abs().max())


@dataclass(frozen=True)
class MicroBatching:
    """How rows are split into forward passes: a row cap, a token budget, padding-free packing.

    Attributes:
        max_rows: rows per forward (None = no row cap).
        max_tokens: tokens per forward, padding included (None = no budget); see
            :func:`~lit_rlvr.functional.batching.token_budget_batches`.
        padding_free: ``"auto"``, ``True`` or ``False`` (:func:`packs_sequences`).
        shared_prompts: forward each distinct prompt of a micro-batch once (:func:`shares_prompts`).
    """

    max_rows: int | None = None
    max_tokens: int | None = None
    padding_free: bool | str = False
    shared_prompts: bool = False

    def split(self, attention_mask: Tensor, response_mask: Tensor, packed: bool) -> list[Tensor]:
        """Row indices of each micro-batch: length-sorted, under the row cap and the token budget.

        The budget counts what the forward computes: rows × (longest prompt + longest completion)
        in the padded layout, rows × the longest row packed (an upper bound of the packed bins).
        """
        lengths = segment_lengths(attention_mask, response_mask)  # (B, 2)
        return token_budget_batches(lengths.sum(-1) if packed else lengths, self.max_tokens, self.max_rows)


def batched_completion_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_len: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    batching: MicroBatching = MicroBatching(),
    lockstep: Callable[[int], int] | None = None,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """:func:`completion_logprobs` over length-sorted micro-batches, each cropped to its longest row.

    Same arguments and result (``(B, T)`` each, rows in the input's order, entropies differentiable
    with ``entropy_grad``); ``batching`` sets the
    row cap, the token budget and padding-free packing. Differentiable: under autograd every
    micro-batch's graph is kept (split the backward yourself, as ``RLVRModule`` does, to bound memory).
    ``batching`` also says whether each distinct prompt of a micro-batch is forwarded once.
    ``lockstep``: under FSDP every forward is a collective, so ranks must run as many; it maps this
    rank's number of forwards to the number every rank runs (the most any rank has), and the
    extra forwards run on the first row and are discarded.
    """
    T = response_len
    response_mask = attention_mask[:, -T:]
    packed, shared = packs_sequences(model, batching.padding_free), shares_prompts(model, batching.shared_prompts)
    lps, ents, order = [], [], []
    groups = batching.split(attention_mask, response_mask, packed)
    for rows in groups:
        rows = rows.to(input_ids.device)
        part = crop_padding(
            {"input_ids": input_ids[rows], "attention_mask": attention_mask[rows], "response_mask": response_mask[rows]}
        )
        t = part["response_mask"].shape[1]
        lp, ent = completion_logprobs(
            model, part["input_ids"], part["attention_mask"], t, temperature, with_entropy, packed, entropy_grad, shared
        )
        lps.append(F.pad(lp, (0, T - t)))
        ents.append(F.pad(ent, (0, T - t)) if ent is not None else None)
        order.append(rows)
    for _ in range((lockstep(len(groups)) if lockstep is not None else len(groups)) - len(groups)):
        with torch.no_grad():
            completion_logprobs(model, input_ids[:1], attention_mask[:1], T, temperature, False, packed, False, shared)
    inverse = torch.empty_like(torch.cat(order))
    inverse[torch.cat(order)] = torch.arange(len(inverse), device=inverse.device)
    entropy = torch.cat(ents)[inverse] if with_entropy else None
    return torch.cat(lps)[inverse], entropy


@torch.no_grad()
def sequence_logprob(model: nn.Module, prompt_ids: list[int], completion_ids: list[int]) -> Tensor:
    """Per-token log-probs ``(T,)`` of one completion given its prompt, at temperature 1."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], dtype=torch.long)
    device = next(model.parameters()).device
    ids = ids.to(device)
    logprobs, _ = completion_logprobs(model, ids, torch.ones_like(ids), len(completion_ids))
    return logprobs[0]
