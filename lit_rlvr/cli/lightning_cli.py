"""``lit-rlvr fit`` / ``validate``: LightningCLI with lit_rlvr's parser, callbacks, plug-in imports and links.

Imported by :func:`lit_rlvr.cli.main` only for those commands: the tools (``report``, ``demo-data``, …)
start without Lightning, torch and transformers.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import NoReturn

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from typing_extensions import override

from lit_rlvr.callbacks import HFExport, PassCountsWriter, RolloutCallback, SignalCheckpoint, StepProgressBar
from lit_rlvr.checkpoint import SafeCheckpointIO
from lit_rlvr.cli import _SECTIONS, ConfigError, _exit_with_config_error, _short
from lit_rlvr.data import PromptDataModule
from lit_rlvr.flags import merge_mapping_flags
from lit_rlvr.plugins import load_plugins
from lit_rlvr.strategies import FSDP2Strategy  # noqa: F401  (registers --trainer.strategy=fsdp2)

# values that must agree: (source, target); a target is never set by the user (see _refuse_linked_targets)
LINKS = (("model.init_args.policy.path", "data.init_args.tokenizer"),)


class RLVRParser(LightningArgumentParser):
    """Lightning's parser, whose errors are one short message instead of the usage and a namespace dump."""

    @override
    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        from jsonargparse._common import debug_mode_active

        if not self.exit_on_error or debug_mode_active():  # a nested parser: its parent reports the error
            super().error(message, ex)
        self._logger.error(message)
        parser = getattr(ex, "subcommand_parser", None) or self
        _exit_with_config_error(parser.prog.replace(" [options]", ""), _config_message(message, ex))


class RLVRCLI(LightningCLI):
    """LightningCLI with first-class callbacks (rollouts, export, pass counts), plug-in imports and links."""

    @staticmethod
    @override
    def subcommands() -> dict[str, set[str]]:
        return {
            "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "dataloaders", "datamodule"},
        }

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--imports",
            type=list[str],
            default=[],
            help="plug-in modules to import before building anything (a user's rewards, advantages, divergences, adapters)",
        )
        # `rollout:` is its own config section; `class_path` swaps in a user's subclass.
        parser.add_lightning_class_args(RolloutCallback, "rollout", subclass_mode=True, required=False)
        parser.set_defaults({"rollout": {"class_path": "lit_rlvr.callbacks.RolloutCallback"}})
        parser.add_lightning_class_args(HFExport, "export")  # --export.dirpath=…: the trained policy, HF format
        parser.add_lightning_class_args(PassCountsWriter, "pass_counts")  # --pass_counts.path=…: per-prompt counts
        for source, target in LINKS:
            parser.link_arguments(source, target)

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        if isinstance(args, dict):
            return super().parse_arguments(parser, args)
        args = list(sys.argv[1:] if args is None else args)
        _refuse_linked_targets(args)
        self.config = parser.parse_args(merge_mapping_flags(parser, args, _SECTIONS))

    @override
    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except (ValueError, TypeError) as err:  # a class refused its settings: jsonargparse wraps its message
            raise ConfigError(_config_message(str(err), err)) from err

    def validate(self, **kwargs) -> list[dict[str, float]]:
        """``trainer.validate``, printing one table with a column per validation set (Lightning's
        own lists every set's metrics under every dataloader); ``--verbose=false``: no table."""
        from lit_rlvr.tools.report import results_table

        verbose = kwargs.pop("verbose", True)
        results = self.trainer.validate(**kwargs, verbose=False)
        if verbose and self.trainer.is_global_zero and results:
            print(results_table(results), flush=True)
        return results

    @override
    def instantiate_trainer(self, **kwargs) -> Trainer:
        """The trainer, with lit_rlvr's defaults for failures: checkpoints written atomically with a
        checksum verified on resume (:class:`~lit_rlvr.checkpoint.SafeCheckpointIO`, unless the config
        gives another ``CheckpointIO``), and a checkpoint plus a non-zero exit on SIGTERM / Ctrl-C
        (:class:`~lit_rlvr.callbacks.SignalCheckpoint`, unless the config has one). Where Lightning
        would add its rich progress bar, :class:`~lit_rlvr.callbacks.StepProgressBar` (no ``Epoch 0/-2``);
        a ``fit`` without ``data.val`` runs no validation loop (Lightning would set one up over no
        dataloaders and warn that their total length is zero)."""
        if self.subcommand == "fit" and isinstance(self.datamodule, PromptDataModule) and not self.datamodule.val_specs:
            kwargs["limit_val_batches"] = 0
        configured = self._get(self.config_init, "trainer", default={}).get("callbacks") or []
        own_bar = any(
            isinstance(c, ProgressBar) for c in (configured if isinstance(configured, list) else [configured])
        )
        trainer = super().instantiate_trainer(**kwargs)
        if not own_bar and type(trainer.progress_bar_callback) is RichProgressBar:  # Lightning's default bar
            trainer.callbacks[trainer.callbacks.index(trainer.progress_bar_callback)] = StepProgressBar()
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # Lightning's default, not a user's
            trainer.strategy.checkpoint_io = SafeCheckpointIO()
        if not any(isinstance(c, SignalCheckpoint) for c in trainer.callbacks):
            trainer.callbacks.append(SignalCheckpoint())
        return trainer

    @override
    def before_instantiate_classes(self) -> None:
        config = self.config.get(str(self.subcommand), self.config)
        load_plugins(config.get("imports") or [])


def _config_message(message: str, err: BaseException | None) -> str:
    """What a user needs from a parse or start-up error: the message of the exception jsonargparse
    caught (a class's own, lit_rlvr's: it names the key), else jsonargparse's innermost message after
    the keys that lead to it (``model.sampling.n: Expected a <class 'int'>. Got value: abc``), without
    its lists of union members and its namespace dumps.
    """
    chain: list[BaseException] = []
    while err is not None and all(err is not e for e in chain):
        chain.append(err)
        err = err.__cause__
    for e in chain:
        if not _raised_by(e, "jsonargparse"):
            return str(e)
    keys: list[str] = []
    for e in chain:
        if (head := str(e).split("\n", 1)[0]).startswith('Parser key "') and head.endswith('":'):
            if not keys or keys[-1] != head[12:-2]:
                keys.append(head[12:-2])
    innermost = str(chain[-1]).strip() if chain else message.strip()
    return f"{_short('.'.join(keys))}: {innermost}" if keys else innermost


def _raised_by(err: BaseException, package: str) -> bool:
    """Whether ``err`` was raised inside ``package`` (its innermost frame); a traceback-less one counts as not."""
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and f"{package}/" in Path(frames[-1].filename).as_posix()


def _refuse_linked_targets(args: list[str]) -> None:
    """Raise ``ValueError`` if a config file or a flag sets a linked target.

    jsonargparse overwrites a link's target with its source's value without a word, so
    ``data.tokenizer: other`` in a YAML file would silently become the policy's path.
    """
    import yaml

    targets = {variant: (source, target) for source, target in LINKS for variant in (target, _short(target))}
    found: list[tuple[str, str]] = []  # (where, key)
    for i, arg in enumerate(args):
        if arg.startswith("--") and (key := arg[2:].split("=", 1)[0]) in targets:
            found.append((f"the flag {arg.split('=', 1)[0]}", key))
        if arg in ("--config", "-c") and i + 1 < len(args) or arg.startswith("--config="):
            path = args[i + 1] if "=" not in arg else arg.split("=", 1)[1]
            try:
                config = yaml.safe_load(Path(path).read_text())
            except (OSError, yaml.YAMLError):
                continue
            for key in targets:
                node = config
                for part in key.split("."):
                    node = node.get(part) if isinstance(node, dict) else None
                if node is not None:
                    found.append((f"the config file {path}", key))
    if found:
        where, key = found[0]
        source, target = targets[key]
        raise ConfigError(
            f"{where} sets {_short(target)}, which is linked to {_short(source)} and always takes its value; "
            f"set {_short(source)} instead (values that must agree are given once)"
        )
