#!/usr/bin/env bash
# The GPU check, for a lent GPU machine (one GPU, < 8 minutes): run from the repository root.
#
#   bash benchmarks/gpu_check.sh            # prints step time, tokens/s, MFU, peak memory; runs the GPU tests
#
# That machine has torch, lightning, transformers, peft and torchmetrics but not the small pure-Python
# dependencies nor vLLM (too large to carry), so the check uses `engine: hf`. Prepare the wheels here
# first (they travel in .whl/, which .git/info/exclude must ignore):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 -d .whl math-verify==0.9.0 latex2sympy2_extended antlr4-python3-runtime==4.13.2 \
#     sqlglot omegaconf jsonargparse docstring-parser typeshed-client typing-inspection
# Results go to $OUT when it is set (the device tool), else to benchmarks/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu_check.txt"
python3 -c "import torch, lightning, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', lightning.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu_check.txt"
for strategy in fsdp fsdp2; do  # Qwen2.5-0.5B's shape, bf16, 8 prompts x 8 samples x 256 tokens per step
  (cd benchmarks && timeout 240 python3 gpu_step.py --strategy "$strategy") 2>&1 | grep '^{' | tee -a "$out/gpu_check.txt" || echo "gpu_step --strategy $strategy FAILED" | tee -a "$out/gpu_check.txt"
done
timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/integration/test_gpu.py 2>&1 | tail -5 | tee -a "$out/gpu_check.txt"
# Generation layouts (sync colocated vs vllm serve sync/async): needs vLLM and 2 GPUs, so it runs only
# where both are there (the lent machine has neither vLLM nor a second GPU: this prints why it skipped).
if python3 -c "import vllm, torch, sys; sys.exit(torch.cuda.device_count() < 2)" 2>/dev/null; then
  (out_abs="$(cd "$out" && pwd)"; cd benchmarks && timeout 600 python3 async.py --gpu --out "$out_abs/async_gpu.md") 2>&1 | tail -8 | tee -a "$out/gpu_check.txt"
else
  echo "async.py --gpu skipped: needs vLLM and 2 GPUs" | tee -a "$out/gpu_check.txt"
fi
# Weight sync of a LoRA policy (merged vs adapter-only, buckets): needs vLLM and a GPU.
if python3 -c "import vllm, torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  (out_abs="$(cd "$out" && pwd)"; cd benchmarks && timeout 300 python3 weight_sync.py --gpu --out "$out_abs/weight_sync_gpu.md") 2>&1 | tail -8 | tee -a "$out/gpu_check.txt"
else
  echo "weight_sync.py --gpu skipped: needs vLLM and a GPU" | tee -a "$out/gpu_check.txt"
fi
