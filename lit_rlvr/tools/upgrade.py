"""``lit-rlvr upgrade``: rewrite a 0.1 config or checkpoint in today's option groups.

    lit-rlvr upgrade config configs/old/dph_f.yaml                 # prints the upgraded YAML
    lit-rlvr upgrade config configs/old/dph_f.yaml --out new.yaml  # writes it
    lit-rlvr upgrade checkpoint old.ckpt new.ckpt                  # a checkpoint, rewritten

0.1 checkpoints also load as they are (``--ckpt_path``, ``RLVRModule.load_from_checkpoint``);
the rewrite is for tools that read checkpoints without lit_rlvr. Where every key went:
docs/configuration.md, "Upgrading a 0.1 config or checkpoint" (:data:`lit_rlvr.upgrade.MOVES`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lit-rlvr upgrade", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    config = sub.add_parser("config", help="print (or --out) a 0.1 YAML config in today's layout")
    config.add_argument("path")
    config.add_argument("--out", help="write here instead of printing")
    ckpt = sub.add_parser("checkpoint", help="rewrite a 0.1 checkpoint")
    ckpt.add_argument("path")
    ckpt.add_argument("out")
    args = parser.parse_args(argv)
    if args.what == "config":
        _config(Path(args.path), args.out)
    else:
        _checkpoint(Path(args.path), Path(args.out))


def _config(path: Path, out: str | None) -> None:
    import yaml

    from lit_rlvr.upgrade import upgrade_config

    new, notes = upgrade_config(yaml.safe_load(path.read_text()) or {})
    text = yaml.safe_dump(new, sort_keys=False, allow_unicode=True)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if out is None:
        print(text, end="")
    else:
        Path(out).write_text(text)


def _checkpoint(path: Path, out: Path) -> None:
    import torch

    from lit_rlvr.upgrade import read_checkpoint, upgrade_checkpoint

    checkpoint = read_checkpoint(path)  # verified; a file that would run code is refused
    if not upgrade_checkpoint(checkpoint):
        print(f"{path} is not a lit_rlvr 0.1 checkpoint: nothing to upgrade", file=sys.stderr)
    torch.save(checkpoint, out)


if __name__ == "__main__":
    main()
