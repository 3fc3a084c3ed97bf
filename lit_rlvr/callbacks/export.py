"""HFExport: save the trained policy (or its LoRA adapter) in Hugging Face format at the end of ``fit``.

The export folder loads with ``AutoModelForCausalLM.from_pretrained`` / ``PeftModel`` and vLLM.
Its tokenizer pads on the left, as generation with a decoder-only model needs (transformers warns
about right padding); lit_rlvr pads its own batches, so training never depended on the side. A
model card (``README.md``, as on the Hub) names the base model, the method's settings, the last
validation's pass@k (the last one that ran during ``fit``, at its own step) and the ``lit-rlvr``
config; a ``lit-rlvr validate`` of the exported folder itself (``--model.policy.path`` and
``--export.dirpath`` both the folder) writes its results into the card. The folder is written
under a temporary name and renamed when complete (:func:`~lit_rlvr.atomic.atomic_dir`): a full
disk leaves the previous export (or none) and an error naming the folder and the free space, never
a folder with only some of the files, and a second process exporting to the same folder meanwhile
is refused. Under FSDP2 every rank takes part in gathering
the full state dict (a collective), streamed to CPU, and rank 0 writes it; the export is never
the sharded local view.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lit_rlvr.atomic import atomic_dir, atomic_file
from lit_rlvr.contracts import PolicyHost, require
from lit_rlvr.policy import gathered_parameters, is_peft_model


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The unsharded state dict of an FSDP2-sharded ``model`` on CPU (all ranks must call it);
    None when no parameter is sharded (the module's own state dict is complete)."""
    from torch.distributed.tensor import DTensor

    if not any(isinstance(p, DTensor) for p in model.parameters()):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


class HFExport(Callback):
    """At the end of ``fit``, write ``pl_module.policy``, ``pl_module.tokenizer`` and a model card to ``dirpath``.

    A LoRA policy saves its adapter only (``adapter_config.json`` + weights), as peft does.

    Args:
        dirpath: the export folder (created, or replaced once the new one is complete); None
            disables the export.
    """

    def __init__(self, dirpath: str | None = None):
        self.dirpath = dirpath
        self.validation: tuple[int, dict[str, float]] | None = None  # (step, metrics) of the last validation

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.dirpath is not None:
            require(pl_module, PolicyHost, "HFExport")
        self.validation = None

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or self.dirpath is None:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/") and v.numel() == 1}
        self.validation = (trainer.global_step, metrics)
        if trainer.state.fn == TrainerFn.VALIDATING and trainer.is_global_zero:
            self.record_validate(pl_module, metrics)

    def record_validate(self, pl_module: LightningModule, metrics: dict[str, float]) -> None:
        """Write a ``lit-rlvr validate``'s results into the card, if the validated policy is this export."""
        card = Path(self.dirpath) / "README.md"
        policy = Path(str(getattr(getattr(pl_module, "policy", None), "name_or_path", "")))
        if not (card.is_file() and policy.exists() and policy.resolve() == Path(self.dirpath).resolve()):
            rank_zero_info(
                f"lit_rlvr: the model card in {self.dirpath} is left as it is (the validated policy is not that export)"
            )
            return
        text = with_validation(card.read_text(), metrics, "## Validation (lit-rlvr validate of this folder)")
        with atomic_file(card, "the model card") as f:
            f.write(text.encode())

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.dirpath is None:
            return
        with gathered_parameters(trainer):  # FSDP1: full parameters on every rank
            state = full_state_dict(pl_module.policy)  # a collective under FSDP2: every rank
            if trainer.is_global_zero:
                with atomic_dir(self.dirpath, "the Hugging Face export") as path:  # complete, or absent
                    pl_module.policy.save_pretrained(path, **({"state_dict": state} if state is not None else {}))
                    pl_module.tokenizer.save_pretrained(path)
                    self.finish(path, trainer, pl_module)
        trainer.strategy.barrier("lit_rlvr_export")

    def finish(self, path: Path, trainer: Trainer, pl_module: LightningModule) -> None:
        """Make the saved tokenizer pad on the left and write the model card (rank 0)."""
        from transformers import AutoTokenizer

        # saved through from_pretrained: a padding_side set on the live object is not written
        AutoTokenizer.from_pretrained(path, padding_side="left").save_pretrained(path)
        # the method as the module ran it (its option groups; a user's module may have none of them)
        settings = {name: getattr(pl_module, name, None) for name in ("loss", "anchor", "kl", "sampling")}
        configured = getattr(pl_module, "configured_loss", None)
        if configured is not None and configured.advantage != pl_module.advantage_name:
            settings["loss"] = configured
            settings["advantage_at_end"] = pl_module.advantage_name  # switched by an AdvantageSchedule
        validated_at, metrics = self.validation or (trainer.global_step, {})
        card = model_card(
            base_model=str(pl_module.policy.name_or_path),
            hparams=settings,
            metrics=metrics,
            step=trainer.global_step,
            config=_cli_config(trainer),
            adapter=is_peft_model(pl_module.policy),
            validated_at=validated_at,
        )
        (path / "README.md").write_text(card)


def model_card(
    base_model: str,
    hparams: Mapping[str, Any],
    metrics: Mapping[str, float],
    step: int,
    config: str | None = None,
    adapter: bool = False,
    validated_at: int | None = None,
) -> str:
    """A Hub-style model card (YAML front matter + markdown) for an exported policy.

    Args:
        base_model: the policy trained from (hub name or local path; only a hub name goes into
            the front matter, where the Hub expects a repository id).
        hparams: the method's option groups (those of :class:`~lit_rlvr.module.RLVRModule`:
            ``loss``, ``anchor``, ``kl``, ``sampling``; None or absent = not used).
        metrics: logged values by name; ``val/<set>/pass@<k>`` and ``val/<set>/distinct_correct_answers``
            fill the results table.
        step: optimizer steps trained.
        config: the ``lit-rlvr`` config text (None: not run through the CLI).
        adapter: a LoRA adapter rather than full weights.
        validated_at: the step of the validation ``metrics`` come from (None: ``step``).

    Example:
        >>> from lit_rlvr.options import AnchorOptions, LossOptions
        >>> card = model_card("Qwen/Qwen2.5-Math-1.5B", {"loss": LossOptions(), "anchor": AnchorOptions(coef=1.0)},
        ...                   {"val/math500/pass@1": 0.5, "val/math500/pass@4": 0.75}, step=300)
        >>> print(card.split("## Config")[0])  # doctest: +NORMALIZE_WHITESPACE
        ---
        base_model: Qwen/Qwen2.5-Math-1.5B
        library_name: transformers
        pipeline_tag: text-generation
        tags: [lit_rlvr, rlvr, grpo, dph-rl]
        ---
        # Qwen2.5-Math-1.5B, RL with verifiable rewards (lit_rlvr)
        <BLANKLINE>
        Trained from `Qwen/Qwen2.5-Math-1.5B` for 300 optimizer steps with lit_rlvr (RL with verifiable rewards on PyTorch Lightning); full weights.
        <BLANKLINE>
        ## Method
        <BLANKLINE>
        | setting | value |
        |---|---|
        | advantage | `grpo` |
        | loss aggregation | `token_mean` |
        | clip ε_low / ε_high | 0.2 / 0.28 |
        | f-divergence anchor to π_ref (DPH-RL) | `forward_kl`, η = 1.0, token level |
        <BLANKLINE>
        ## Final validation (step 300)
        <BLANKLINE>
        | set | pass@1 | pass@4 | distinct correct answers |
        |---|---|---|---|
        | math500 | 0.500 | 0.750 | – |
        <BLANKLINE>
    """
    loss = hparams.get("loss")
    tags = ["lit_rlvr", "rlvr", loss.advantage if loss is not None else ""]
    tags += ["dph-rl"] if hparams.get("anchor") is not None else []
    hub_name = not Path(base_model).exists() and base_model.count("/") == 1
    front = [
        "---",
        *([f"base_model: {base_model}"] if hub_name else []),
        f"library_name: {'peft' if adapter else 'transformers'}",
        "pipeline_tag: text-generation",
        f"tags: [{', '.join(t for t in tags if t)}]",
        "---",
    ]
    what = "a LoRA adapter (load it with peft on the base model)" if adapter else "full weights"
    lines = [
        *front,
        f"# {Path(base_model).name}, RL with verifiable rewards (lit_rlvr)",
        "",
        f"Trained from `{base_model}` for {step} optimizer step{'s' * (step != 1)} with lit_rlvr (RL with verifiable rewards on "
        f"PyTorch Lightning); {what}.",
        "",
        "## Method",
        "",
        "| setting | value |",
        "|---|---|",
        *[f"| {name} | {value} |" for name, value in _method_rows(hparams)],
        "",
        *_results(metrics, f"## Final validation (step {step if validated_at is None else validated_at})"),
    ]
    if config is not None:
        lines += [
            "## Config",
            "",
            "<details><summary>the <code>lit-rlvr fit</code> config</summary>",
            "",
            "```yaml",
            config.rstrip(),
            "```",
            "",
            "</details>",
            "",
        ]
    return "\n".join(lines)


def _method_rows(hp: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The method's settings among the option groups in ``hp``, as (name, markdown value)."""
    rows = []
    if (loss := hp.get("loss")) is not None:
        options = f" {dict(loss.advantage_options)}" if loss.advantage_options else ""
        rows.append(("advantage", f"`{loss.advantage}`{options}"))
        if "advantage_at_end" in hp:
            rows.append(("advantage at the end (AdvantageSchedule)", f"`{hp['advantage_at_end']}`"))
        rows.append(("loss aggregation", f"`{loss.aggregation}`"))
        dual = f", dual clip {loss.dual_clip}" if loss.dual_clip else ""
        rows.append(("clip ε_low / ε_high", f"{loss.clip_low} / {loss.clip_high}{dual}"))
    if (anchor := hp.get("anchor")) is not None:
        options = f" {dict(anchor.options)}" if anchor.options else ""
        rows.append(
            (
                "f-divergence anchor to π_ref (DPH-RL)",
                f"`{anchor.divergence}`{options}, η = {anchor.coef}, {anchor.level} level",
            )
        )
    if (kl := hp.get("kl")) is not None:
        rows.append(("KL(π_θ‖π_ref) penalty", f"β = {kl.coef} ({kl.estimator})"))
    if (sampling := hp.get("sampling")) is not None:
        rows.append(
            (
                "samples per prompt · temperature · max new tokens",
                f"{sampling.n} · {sampling.temperature} · {sampling.max_new_tokens}",
            )
        )
    return rows


_PASS = re.compile(r"^val/(?P<set>[^/]+)/pass@(?P<k>\d+)$")


def with_validation(card: str, metrics: Mapping[str, float], title: str) -> str:
    """``card`` with its validation section (the first ``## …validation…`` one) replaced by ``metrics``' table.

    Example:
        >>> card = "# m\\n\\n## Final validation\\n\\nNo validation ran during training.\\n\\n## Config\\n\\nx\\n"
        >>> print(with_validation(card, {"val/a/pass@1": 0.5}, "## Validation (lit-rlvr validate of this folder)"))
        # m
        <BLANKLINE>
        ## Validation (lit-rlvr validate of this folder)
        <BLANKLINE>
        | set | pass@1 | distinct correct answers |
        |---|---|---|
        | a | 0.500 | – |
        <BLANKLINE>
        ## Config
        <BLANKLINE>
        x
        <BLANKLINE>
    """
    section = re.compile(r"^## [^\n]*[Vv]alidation[^\n]*\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
    table = "\n".join(_results(metrics, title)) + "\n"
    return section.sub(lambda _: table, card, count=1) if section.search(card) else card.rstrip("\n") + "\n\n" + table


def _results(metrics: Mapping[str, float], title: str) -> list[str]:
    """A validation's pass@k ladder per set (and distinct correct answers), as markdown lines under ``title``."""
    ladders: dict[str, dict[int, float]] = {}
    for key, value in metrics.items():
        if m := _PASS.match(key):
            ladders.setdefault(m["set"], {})[int(m["k"])] = value
    if not ladders:
        return ["## Final validation", "", "No validation ran during training.", ""]
    ks = sorted({k for ladder in ladders.values() for k in ladder})
    lines = [
        title,
        "",
        "| set | " + " | ".join(f"pass@{k}" for k in ks) + " | distinct correct answers |",
        "|---" * (len(ks) + 2) + "|",
    ]
    for name, ladder in sorted(ladders.items()):
        distinct = metrics.get(f"val/{name}/distinct_correct_answers")
        cells = [f"{ladder[k]:.3f}" if k in ladder else "–" for k in ks] + [
            f"{distinct:.2f}" if distinct is not None else "–"
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _cli_config(trainer: Trainer) -> str | None:
    """The config ``lit-rlvr`` saved for this run (its SaveConfigCallback), None outside the CLI."""
    from lightning.pytorch.cli import SaveConfigCallback

    for callback in trainer.callbacks:
        if isinstance(callback, SaveConfigCallback):
            return callback.parser.dump(callback.config, skip_none=False)
    return None
