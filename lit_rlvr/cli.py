"""``lit-rlvr``: LightningCLI ``fit`` / ``validate`` plus the ``cache``, ``report``, ``warmstart`` and ``demo-data`` tools.

    lit-rlvr fit --config configs/math/base.yaml --config configs/math/dph_f.yaml
    lit-rlvr validate --config configs/math/base.yaml --config configs/math/grpo.yaml --ckpt_path …/last.ckpt
    lit-rlvr cache --config configs/math/cache.yaml      # DPH-RL's offline π_ref samples
    lit-rlvr warmstart --config configs/demo/warmstart.yaml
    lit-rlvr demo-data --out_dir artifacts/demo/data                   # the demo's task files
    lit-rlvr report runs/demo/metrics.jsonl --out runs/demo/passk.png   # table + plot

Configs are parsed with OmegaConf interpolation (``${model.samples_per_prompt}``). Values that
must agree are linked rather than repeated: the rollout callback's samples per prompt and max new
tokens and temperature feed the module; the module's model path feeds the DataModule's tokenizer.
``model:`` and ``data:`` take a user's subclass (``class_path: myproj.MyModule``); the top-level
``imports:`` list names plug-in modules (a user's rewards, estimators, divergences, adapters) to
import before anything is built (:mod:`lit_rlvr.plugins`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from typing_extensions import override

from lit_rlvr.callbacks import HFExport, PassCountsWriter, RolloutCallback
from lit_rlvr.data import PromptDataModule
from lit_rlvr.module import RLVRModule
from lit_rlvr.plugins import load_plugins

TOOLS = ("cache", "demo-data", "report", "warmstart")


class RLVRCLI(LightningCLI):
    """LightningCLI with first-class callbacks (rollouts, export, pass counts), plug-in imports and links."""

    @staticmethod
    @override
    def subcommands() -> dict[str, set[str]]:
        return {"fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"}, "validate": {"model", "dataloaders", "datamodule"}}

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--imports", type=list[str], default=[],
            help="plug-in modules to import before building anything (a user's rewards, advantages, divergences, adapters)",
        )  # fmt: skip
        # `rollout:` is its own config section; `class_path` swaps in a user's subclass.
        parser.add_lightning_class_args(RolloutCallback, "rollout", subclass_mode=True, required=False)
        parser.set_defaults({"rollout": {"class_path": "lit_rlvr.callbacks.RolloutCallback"}})
        parser.add_lightning_class_args(HFExport, "export")  # --export.dirpath=…: the trained policy, HF format
        parser.add_lightning_class_args(PassCountsWriter, "pass_counts")  # --pass_counts.path=…: per-prompt counts
        parser.link_arguments("rollout.init_args.samples_per_prompt", "model.init_args.samples_per_prompt")
        parser.link_arguments("rollout.init_args.max_new_tokens", "model.init_args.max_new_tokens")
        parser.link_arguments("rollout.init_args.temperature", "model.init_args.temperature")
        parser.link_arguments("model.init_args.model", "data.init_args.tokenizer")

    @override
    def before_instantiate_classes(self) -> None:
        config = self.config.get(str(self.subcommand), self.config)
        load_plugins(config.get("imports") or [])


def _tools() -> dict[str, Callable[[list[str]], object]]:
    from lit_rlvr.demo.data import main as demo_data_main
    from lit_rlvr.demo.warmstart import main as warmstart_main
    from lit_rlvr.tools.cache import main as cache_main
    from lit_rlvr.tools.report import main as report_main

    return {"cache": cache_main, "demo-data": demo_data_main, "report": report_main, "warmstart": warmstart_main}


HELP = (
    "lit-rlvr: RL with verifiable rewards, the Lightning way. Training and evaluation: "
    "`lit-rlvr fit|validate --config …` (see configs/). Tools, each with its own --help: "
    f"{', '.join(f'`lit-rlvr {t}`' for t in TOOLS)}."
)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``lit-rlvr`` console script (``argv`` None: the command line)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in TOOLS:
        _tools()[args[0]](args[1:])
        return
    omegaconf = {"parser_mode": "omegaconf"}
    RLVRCLI(
        RLVRModule,
        PromptDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=argv,  # None: LightningCLI reads sys.argv itself
        parser_kwargs={"fit": omegaconf, "validate": omegaconf, "description": HELP},
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,
    )


if __name__ == "__main__":
    main()
