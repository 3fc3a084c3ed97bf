"""``trainer.validate`` of RLVRModule on 1 or 2 CPU processes with an engine whose samples depend only
on the prompt, so that the two runs see the same samples and their metrics must agree exactly.

    python val_ranks.py MODEL_DIR OUT DEVICES

Two validation sets of odd sizes (so one rank gets padding), math rewards judged by math-verify in
a reward worker; writes ``OUT.metrics.json`` (rank 0: the validate results) and ``OUT.counts.json``
(PassCountsWriter).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from lightning import Trainer

from lit_rlvr.callbacks import PassCountsWriter, RolloutCallback
from lit_rlvr.data import PromptDataModule, ValSet
from lit_rlvr.module import RLVRModule
from lit_rlvr.options import EvalOptions, PolicyOptions, SamplingParams, ScoringOptions
from lit_rlvr.rollout import Rollouts
from lit_rlvr.rollout.engine import EngineBase

ANSWERS = ["\\boxed{3}", "\\boxed{4}", "\\boxed{7}", "the answer is 7", "no idea", "\\boxed{12}"]


class PromptKeyedEngine(EngineBase):
    """n completions per prompt chosen by a hash of the prompt's tokens: the same on every rank layout."""

    name = "prompt-keyed"

    def __init__(self, tokenizer):
        super().__init__()
        self.tokenizer = tokenizer

    def _generate(self, prompt_ids, params) -> Rollouts:
        texts = [ANSWERS[(sum(p) * 7 + 3 * j + len(p)) % len(ANSWERS)] for p in prompt_ids for j in range(params.n)]
        ids = [self.tokenizer(t).input_ids for t in texts]
        return Rollouts(
            [list(p) for p in prompt_ids], ids, [[-1.0] * len(c) for c in ids], ["stop"] * len(ids), params.n, texts
        )

    def probe_logprobs(self, prompt_ids, completion_ids):
        raise NotImplementedError

    def _update_weights(self, model) -> None:
        pass


def write_sets(root: Path) -> list[ValSet]:
    sets = []
    for name, size in (("small", 5), ("large", 9)):
        path = root / f"{name}.jsonl"
        path.write_text(
            "".join(
                json.dumps({"prompt": f"{name} {i}+{i % 4}=", "answer": str(i % 4 + 3), "reward": "math"}) + "\n"
                for i in range(size)
            )
        )
        sets.append(ValSet(files=str(path), name=name, n_samples=4))
    return sets


def main(model_dir: str, out: str, devices: int) -> None:
    torch.set_num_threads(1)
    root = Path(out).parent
    dm = PromptDataModule(tokenizer=model_dir, val=write_sets(root), val_batch_size=2)
    module = RLVRModule(
        PolicyOptions(model_dir),
        sampling=SamplingParams(n=4, max_new_tokens=8),
        scoring=ScoringOptions(workers=1),
        evaluation=EvalOptions(retention_reference=str(root / "base_counts.json")),
    )
    rollout = RolloutCallback(engine=PromptKeyedEngine(module.tokenizer), fingerprint=False)
    trainer = Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rollout, PassCountsWriter(f"{out}.counts.json")],
    )
    results = trainer.validate(module, datamodule=dm)
    if trainer.is_global_zero:
        Path(f"{out}.metrics.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
