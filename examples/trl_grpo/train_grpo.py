"""GRPO with TRL on DeepMath-103K, with an accuracy and a format reward: the script a TRL user starts from.

    python examples/trl_grpo/train_grpo.py

The same run with lit_rlvr, the reward functions unchanged (docs/migration.md):

    lit-rlvr fit --config configs/migrate/trl_grpo.yaml
"""

from datasets import load_dataset
from rewards import accuracy_reward, format_reward
from trl import GRPOConfig, GRPOTrainer

dataset = load_dataset("trl-lib/DeepMath-103K", split="train")  # conversational: prompt messages + a solution column

training_args = GRPOConfig(
    output_dir="runs/trl_grpo",
    learning_rate=1e-6,
    per_device_train_batch_size=16,  # completions per forward/backward
    gradient_accumulation_steps=8,  # 16 x 8 = 128 completions per optimizer step = 16 prompts x 8
    num_generations=8,
    max_completion_length=1024,
    temperature=1.0,
    beta=0.0,
    epsilon=0.2,
    epsilon_high=0.28,
    loss_type="dapo",
    scale_rewards="group",
    reward_weights=[1.0, 0.2],
    max_steps=300,
    max_grad_norm=1.0,
    bf16=True,
    gradient_checkpointing=True,
    use_vllm=True,
    vllm_mode="colocate",
    vllm_gpu_memory_utilization=0.3,
    logging_steps=10,
    save_steps=100,
    seed=0,
)

trainer = GRPOTrainer(
    model="Qwen/Qwen2.5-1.5B-Instruct",
    reward_funcs=[accuracy_reward, format_reward],
    args=training_args,
    train_dataset=dataset,
)
trainer.train()
