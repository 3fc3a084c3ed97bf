"""RLVRModule with one colocated vLLM engine per rank on 2 CPU processes (gloo), or its 1-process reference.

    python vllm_fit.py MODEL_DIR PROMPTS_JSONL OUT {ddp,fsdp2} [--engine hf] [--tp 2] [--fail KIND:RANK:STEP]
        [--sync-timeout S] [--steps N] [--engine vllm_server --url URL --api-key KEY [--max-staleness K]]
    python vllm_fit.py MODEL_DIR PROMPTS_JSONL OUT reference --rows RUN_OUT

Every rank writes ``OUT.rank{r}`` (JSON) after each training batch: its prompts and the
engine's rollouts, the sampling seeds, the vLLM executor and groups, each sync's fingerprint
(the callback's and one taken here), the loss, and after step 0 its parameters. Step 0 trains
on fixed rollouts built from the batch's prompts (``fixed_rollouts``), so its loss and update
can be compared exactly with ``reference``: one process, one step on the union of both ranks'
step-0 batches read from ``RUN_OUT.rank*`` (no engine). Later steps train on the engines' rollouts.

``--fail raise:R:S`` makes rank R's engine raise inside ``generate`` at step S; ``--fail
hang:R:S`` makes rank R's weight sync after step S-1 block in a C call (``time.sleep``) that the
engine's own timeout cannot interrupt. ``--engine hf`` (the live-policy engine, no start-up
cost) serves tests of the ranks' status exchange that do not need vLLM.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from lightning import Callback, Trainer
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.utils.data import DataLoader

from lit_rlvr.callbacks import RolloutCallback
from lit_rlvr.contracts import TrainBatch
from lit_rlvr.data import PromptDataModule
from lit_rlvr.data.datamodule import DatasetSpec
from lit_rlvr.module import RLVRModule
from lit_rlvr.options import LossOptions, PolicyOptions, SamplingParams, ScoringOptions
from lit_rlvr.policy import sequence_logprob
from lit_rlvr.rewards import REWARDS
from lit_rlvr.rollout import Rollouts, probe_sequence

N = 4  # samples per prompt
TEXTS = ["3*7+5;", "12", "777", "5+3*7;", "1+2", "7", "x", "27;"]


def contains_seven(completion: str, answer: str, **row) -> float:
    return float("7" in completion)


def fixed_rollouts(tokenizer, prompt_ids: list[list[int]]) -> Rollouts:
    """N made-up completions per prompt, a pure function of the prompt (some contain a 7, some not)."""
    texts = [TEXTS[(sum(p) + j) % len(TEXTS)] for p in prompt_ids for j in range(N)]
    completions = [tokenizer(t).input_ids for t in texts]
    sampler = [[-0.5 - 0.25 * ((tok + t) % 5) for t, tok in enumerate(c)] for c in completions]
    return Rollouts([list(p) for p in prompt_ids], completions, sampler, ["stop"] * len(texts), N, texts)


def full(p: torch.Tensor) -> torch.Tensor:
    return p.full_tensor() if hasattr(p, "full_tensor") else p  # DTensor under FSDP2 (a collective)


class Record(Callback):
    """Runs after the RolloutCallback (if any): fixed rollouts at step 0, and what each rank saw."""

    def __init__(self, out: str, rollout_cb: RolloutCallback | None):
        self.out, self.cb = out, rollout_cb
        self.result: dict = {"steps": [], "syncs": [], "seeds": []}

    def on_fit_start(self, trainer, pl_module):
        self.result["rank"] = trainer.global_rank
        self.probe = probe_sequence(len(pl_module.tokenizer))
        if self.cb is None:
            return
        engine = self.cb.engine
        generate = engine.generate

        def spy(prompt_ids, params):
            self.result["seeds"].append(params.seed)
            return generate(prompt_ids, params)

        engine.generate = spy
        if engine.name != "vllm":
            return
        from vllm.distributed import parallel_state

        executor = engine.llm.llm_engine.model_executor
        self.result["vllm"] = {
            "executor": type(executor).__name__,
            "worker_rank": executor.driver_worker.worker.rank,
            "world": parallel_state.get_world_group().ranks,
            "tp": parallel_state.get_tp_group().ranks,
            "engine_seed": engine.llm.llm_engine.model_config.seed,
        }

    def on_train_start(self, trainer, pl_module):
        if self.cb is not None:
            self.check_engine(pl_module)  # the sync at fit start

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = {"step": trainer.global_step, "rows": batch.rows, "prompt_ids": batch.prompt_ids}
        if self.cb is not None:
            r = batch.rollouts
            step.update(
                rollout_prompt_ids=r.prompt_ids,
                completions=r.completion_ids,
                drift=self.cb.last_metrics["rollout/drift"],
            )
        self.result["steps"].append(step)
        if trainer.global_step == 0:
            batch.rollouts = fixed_rollouts(pl_module.tokenizer, batch.prompt_ids)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.result["steps"][-1]["loss"] = float(loss)
        if trainer.global_step == 1:  # after the first optimizer step (and, with an engine, its sync)
            self.result["params"] = {
                n: full(p).detach().flatten()[:64].tolist() for n, p in pl_module.policy.named_parameters()
            }
            self.result["probe_logprobs"] = sequence_logprob(pl_module.policy, *self.probe).tolist()
        if self.cb is not None:
            self.check_engine(pl_module)
        self.write()

    def check_engine(self, pl_module):
        """The engine against the trainer on the probe, independently of the callback's own check."""
        engine_lp = torch.tensor(self.cb.engine.probe_logprobs(*self.probe))
        trainer_lp = sequence_logprob(pl_module.policy, *self.probe)  # a collective under FSDP2: every rank
        self.result["syncs"].append(
            {
                "callback_err": self.cb.last_fingerprint_err,
                "err": (engine_lp - trainer_lp).abs().max().item(),
                "engine_logprobs": engine_lp.tolist(),
            }
        )
        self.write()

    def write(self):
        Path(f"{self.out}.rank{self.result['rank']}").write_text(json.dumps(self.result))


class Fail(Callback):
    """Breaks one rank's engine at one step (see the module docstring)."""

    def __init__(self, spec: str):
        kind, rank, step = spec.split(":")
        self.kind, self.rank, self.step = kind, int(rank), int(step)

    def on_fit_start(self, trainer, pl_module):
        if trainer.global_rank != self.rank:
            return
        engine = trainer.callbacks[0].engine
        if self.kind == "raise":
            generate = engine._generate

            def broken(prompt_ids, params):
                if trainer.global_step == self.step:
                    raise RuntimeError(f"injected engine failure on rank {self.rank} at step {self.step}")
                return generate(prompt_ids, params)

            engine._generate = broken
        else:
            update = engine._update_weights

            def stuck(model):
                if trainer.global_step == self.step:
                    time.sleep(3600)  # one C call: the engine's timeout cannot interrupt it
                return update(model)

            engine._update_weights = stuck


def module(model_dir: str) -> RLVRModule:
    # seq_mean_token_mean: with equal rows per rank the mean of the ranks' losses is the global
    # batch's loss (token_mean would weight each rank by its own token count)
    return RLVRModule(
        PolicyOptions(model_dir),
        sampling=SamplingParams(n=N, max_new_tokens=8, seed=0),
        loss=LossOptions(aggregation="seq_mean_token_mean"),
        scoring=ScoringOptions(workers=0),
        max_grad_norm=None,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.5),
    )


def trainer(devices, strategy, callbacks, max_steps) -> Trainer:
    return Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )


def fit(args) -> None:
    engine_kwargs = {
        "dtype": "float32",
        "max_model_len": 128,
        "kv_cache_memory_bytes": 16 * 2**20,
        "enforce_eager": True,
        "tensor_parallel_size": args.tp,
    }
    engine_kwargs = engine_kwargs if args.engine == "vllm" else {}
    if args.engine == "vllm_server":  # one server for both ranks (given by URL): rank 0 syncs it
        engine_kwargs = {"urls": [args.url], "api_key": args.api_key}
    cb = RolloutCallback(
        engine=args.engine,
        engine_options=engine_kwargs,
        fingerprint_atol=1e-4,
        drift_every_n_steps=1,
        generate_timeout_s=120,
        sync_timeout_s=args.sync_timeout,
        max_staleness=args.max_staleness,
    )
    callbacks = [cb, Record(args.out, cb)] + ([Fail(args.fail)] if args.fail else [])
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1) if args.mode == "fsdp2" else "ddp"
    dm = PromptDataModule(
        tokenizer=args.model_dir, train=DatasetSpec(files=args.prompts, name="toy"), batch_size=2, seed=0
    )
    trainer(2, strategy, callbacks, args.steps).fit(module(args.model_dir), datamodule=dm)


def reference(args) -> None:
    step0 = [json.loads(Path(f"{args.rows}.rank{r}").read_text())["steps"][0] for r in range(2)]
    batch = TrainBatch([row for s in step0 for row in s["rows"]], [p for s in step0 for p in s["prompt_ids"]])
    loader = DataLoader([batch], batch_size=None, collate_fn=lambda b: b)
    trainer(1, "auto", [Record(args.out, None)], 1).fit(module(args.model_dir), train_dataloaders=loader)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("model_dir", "prompts", "out"):
        parser.add_argument(name)
    parser.add_argument("mode", choices=["ddp", "fsdp2", "reference"])
    parser.add_argument("--engine", choices=["vllm", "hf", "vllm_server"], default="vllm")
    parser.add_argument("--url", default=None, help="vllm_server: the server both ranks share")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--max-staleness", type=int, default=None)
    parser.add_argument("--tp", type=int, default=1, help="vLLM tensor_parallel_size (2: both ranks share one engine)")
    parser.add_argument("--fail", default=None)
    parser.add_argument("--sync-timeout", type=float, default=60.0)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    REWARDS.register("test_contains_seven")(contains_seven)
    reference(args) if args.mode == "reference" else fit(args)
