"""``python -m lit_rlvr.cli …``: the ``lit-rlvr`` command (torchrun launches it so)."""

from lit_rlvr.cli import main

main()
