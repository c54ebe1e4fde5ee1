"""TRL's option names, and rlhfkit's answer to each: the same option under the same name, ours
under another name ("did you mean"), or no such option (why, and what to do instead).

One table per TRL class whose options a TRL user brings to a stage rlhfkit shares: the configs
``SFTConfig``, ``RewardConfig``, ``DPOConfig``, ``GRPOConfig``, ``RLOOConfig`` (TRL 1.16) and
``PPOConfig`` (TRL 1.12, the last release with PPO), transformers' ``TrainingArguments`` that
they all extend, the ``ModelConfig`` and ``ScriptArguments`` of TRL's scripts, and the names
earlier TRL releases had (TRL 0.19, and older ``TrainingArguments``). rlhfkit accepts no
alias: a run reads one spelling of each option, and the answer teaches it.

The CLI stops on a TRL name with its answer (``cli._refuse_other_spellings``);
``scripts/trl_options_table.py`` writes the tables as docs/trl_options.md; and
tests/test_trl_names.py holds them to the configs' fields and, where TRL's source is at hand,
to TRL's own field names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Answer:
    """rlhfkit's answer to one TRL option name."""

    kind: Literal["same", "ours", "missing"]
    """'same': rlhfkit's option has TRL's name; 'ours': rlhfkit's option is `field`;
    'missing': rlhfkit has no such option."""
    field: str = ""
    """rlhfkit's option, for 'ours'."""
    value: str = ""
    """What to give `field` where TRL's option implies it (--bf16 is --mixed_precision bf16)."""
    note: str = ""
    """How rlhfkit's option differs ('same', 'ours'); for 'missing', why there is none and
    what to do instead."""

    @property
    def spelling(self) -> str:
        """What to write on rlhfkit's command line, for 'ours'."""
        return f"--{self.field} {self.value}".strip()


SAME = Answer("same")


def same(note: str) -> Answer:
    """rlhfkit's option has TRL's name; `note` says how it differs."""
    return Answer("same", note=note)


def ours(field: str, value: str = "", note: str = "") -> Answer:
    """rlhfkit's option is `field` (given `value` where TRL's option implies one)."""
    return Answer("ours", field, value, note)


def missing(why: str) -> Answer:
    """rlhfkit has no such option: `why`, and what to do instead."""
    return Answer("missing", note=why)


_HUB = missing(
    "rlhfkit uploads nothing: the model is written to final/ in --output_dir; upload that "
    "directory with `hf upload REPO OUTPUT_DIR/final`"
)
_COMPILE = missing(
    "models are not compiled (torch.compile); the speed-ups rlhfkit uses are "
    "chosen at start-up from --cpu, --mixed_precision and --attn_implementation"
)
_LIGER = missing("Liger's Triton kernels are not used")
_LOGGING = missing(
    "the main process logs INFO, the others WARNING; `rlhfkit --verbose COMMAND` adds the "
    "libraries' own progress bars"
)
_TRACKIO = missing(
    "trackio is not a tracker here: --report_to takes tensorboard, wandb, mlflow or none"
)
_EVAL_HOOKS = missing(
    "each stage computes its own evaluation metrics over --eval_data; there is no "
    "compute_metrics hook to configure"
)
_DATALOADER = missing(
    "the data are tokenised once before the first step and batches are collated in the "
    "training process; there are no DataLoader workers to configure"
)
_DDP = missing(
    "data parallelism is DDP with accelerate's settings, or --fsdp true; launch with torchrun or "
    "accelerate launch (docs/distributed.md)"
)
_SAMPLING_ORDER = missing("each epoch is a fresh shuffle drawn from --seed")
_NO_DEEPSPEED = missing(
    "DeepSpeed is not supported; --fsdp true shards weights, gradients and AdamW "
    "state over the processes (FSDP2), as ZeRO-3 does"
)
_NO_QUANT = missing(
    "quantised loading (bitsandbytes) is not supported; train LoRA adapters (--lora true) on "
    "the full-precision model, in bf16 autocast (--mixed_precision bf16) if you like"
)
_NO_PROCS = missing("tokenisation runs once, in the training process, before the first step")
_NO_MOE_AUX = missing("the load-balancing loss of Mixture-of-Experts models is not added")
_INIT_KWARGS = missing(
    "models load in float32 (bf16 autocast with --mixed_precision bf16) with "
    "--attn_implementation and --trust_remote_code; other from_pretrained arguments are not "
    "passed on"
)
_CHAT_TEMPLATE = missing(
    "the tokenizer's own chat template is used (--chat_template false keeps plain prompts raw); "
    "for another, set it on the tokenizer and save_pretrained it beside the model"
)
_EOS = missing(
    "responses end with the tokenizer's EOS; for another token, make it the eos_token in the "
    "tokenizer's tokenizer_config.json"
)
_PAD = missing(
    "the tokenizer's pad token is used; where it has none, or its pad is its EOS, rlhfkit adds "
    "a distinct pad token"
)
_PAD_MULTIPLE = missing("batches are padded to their longest row")
_OFFLOAD = missing("activations are not offloaded; --gradient_checkpointing true recomputes them")
_SHUFFLE = missing("the training data are shuffled every epoch, from --seed")
_TRUNCATION = missing(
    "past max_length the prompt keeps its last tokens and the response its "
    "first, each at least half of max_length when both are long (TRL's keep_start keeps the "
    "sequence's first tokens)"
)
_FIXED_REFERENCE = missing(
    "the reference stays fixed during a run (TR-DPO's reference updates are not implemented); "
    "to move it, start a new run whose --reference is a checkpoint of this one"
)
_VLLM = missing(
    "rlhfkit samples with the policy itself in the training process (a static KV cache, CUDA "
    "graphs on a GPU: docs/gpu.md); there is no vLLM engine to configure"
)
_OWN_DECODING = missing(
    "sampling runs on rlhfkit's own KV cache and decoding loop (runtime/decoding.py), not on "
    "transformers' generate"
)
_ENTROPY_BONUS = missing(
    "the entropy bonus has a fixed weight (--entropy_coef), no adaptive schedule; the "
    "entropy is logged"
)
_OTHER_GRPO_LOSSES = missing(
    "only the clipped objective is implemented (--loss_aggregation sets how it is averaged)"
)
_PPO_DERIVED = "TRL derives it from the other batch options; here "
_LORA_ADAPTERS = missing(
    "a LoRA run trains one adapter, and its reference is the policy with it disabled"
)


TRAINING_ARGUMENTS: dict[str, Answer] = {
    "output_dir": SAME,
    "per_device_train_batch_size": ours("batch_size"),
    "num_train_epochs": ours("num_epochs"),
    "max_steps": SAME,
    "learning_rate": SAME,
    "lr_scheduler_type": ours("lr_scheduler", note="linear, cosine or constant"),
    "lr_scheduler_kwargs": missing(
        "the three schedules of --lr_scheduler take no arguments "
        "besides --warmup_steps or --warmup_ratio"
    ),
    "warmup_steps": same("a whole number of steps here; a share of the run is --warmup_ratio"),
    "optim": missing(
        "AdamW only (torch's, fused), set by --learning_rate, --adam_beta1, "
        "--adam_beta2, --adam_epsilon and --weight_decay"
    ),
    "optim_args": missing("AdamW only, set by its own options (--adam_beta1, --adam_epsilon, ...)"),
    "weight_decay": SAME,
    "adam_beta1": SAME,
    "adam_beta2": SAME,
    "adam_epsilon": SAME,
    "optim_target_modules": missing("GaLore and APOLLO are not implemented: AdamW only"),
    "gradient_accumulation_steps": SAME,
    "average_tokens_across_devices": missing(
        "SFT's loss, a mean over tokens, always weighs each process's micro-batch "
        "by its tokens, so N processes take the step of one holding all their tokens"
    ),
    "max_grad_norm": SAME,
    "label_smoothing_factor": missing("label smoothing of the cross-entropy is not implemented"),
    "bf16": ours("mixed_precision", "bf16"),
    "fp16": missing("fp16 needs loss scaling, which rlhfkit lacks; use --mixed_precision bf16"),
    "bf16_full_eval": missing("evaluation runs in the training precision (--mixed_precision)"),
    "fp16_full_eval": missing("evaluation runs in the training precision (--mixed_precision)"),
    "tf32": missing("float32 matrix products run at torch's default precision"),
    "activation_checkpointing": ours("gradient_checkpointing", "true"),
    "activation_checkpointing_kwargs": missing("every transformer block is checkpointed"),
    "gradient_checkpointing": same("off by default here (on in TRL)"),
    "gradient_checkpointing_kwargs": missing("every transformer block is checkpointed"),
    "torch_compile": _COMPILE,
    "torch_compile_backend": _COMPILE,
    "torch_compile_mode": _COMPILE,
    "use_liger_kernel": _LIGER,
    "liger_kernel_config": _LIGER,
    "use_cache": missing("training passes never use the KV cache, sampling always does"),
    "neftune_noise_alpha": missing("NEFTune's embedding noise is not implemented"),
    "torch_empty_cache_steps": missing(
        "the CUDA cache is not emptied on a schedule; for memory, "
        "lower --batch_size or set --gradient_checkpointing true"
    ),
    "auto_find_batch_size": missing(
        "a batch that does not fit stops the run; lower --batch_size "
        "and raise --gradient_accumulation_steps"
    ),
    "logging_strategy": ours("log_every", note="every this many steps: the only strategy"),
    "logging_steps": ours("log_every"),
    "logging_first_step": missing(
        "the first log is at step --log_every (--log_every 1 logs every step)"
    ),
    "log_on_each_node": missing("only the main process logs metrics"),
    "logging_nan_inf_filter": missing("losses are logged as computed, NaN and inf included"),
    "include_num_input_tokens_seen": missing("the tokens seen are not counted"),
    "log_level": _LOGGING,
    "log_level_replica": _LOGGING,
    "disable_tqdm": missing(
        "one progress bar on a terminal, one line per log interval in a file or CI"
    ),
    "report_to": same("tensorboard (the default), wandb, mlflow, or none"),
    "run_name": missing("a run is named after --output_dir in wandb and MLflow"),
    "project": same("the wandb project or MLflow experiment (TRL's is trackio's)"),
    "trackio_space_id": _TRACKIO,
    "trackio_bucket_id": _TRACKIO,
    "trackio_static_space_id": _TRACKIO,
    "eval_strategy": ours("eval_every", note="every this many steps; 0 evaluates only at the end"),
    "eval_steps": ours("eval_every"),
    "eval_delay": missing("evaluation runs every --eval_every steps from the start"),
    "per_device_eval_batch_size": ours("eval_batch_size"),
    "prediction_loss_only": _EVAL_HOOKS,
    "eval_on_start": missing("evaluation runs every --eval_every steps and at the end"),
    "eval_do_concat_batches": _EVAL_HOOKS,
    "eval_use_gather_object": _EVAL_HOOKS,
    "eval_accumulation_steps": _EVAL_HOOKS,
    "include_for_metrics": _EVAL_HOOKS,
    "batch_eval_metrics": _EVAL_HOOKS,
    "save_only_model": missing(
        "a checkpoint holds what an exact resume needs (model, optimiser, "
        "schedule, random state); final/ holds the model alone"
    ),
    "save_strategy": ours("save_every", note="every this many steps; 0 only at the end"),
    "save_steps": ours("save_every"),
    "save_on_each_node": missing(
        "a checkpoint is one directory on a file system every process shares (each writes its "
        "random state there and, with --fsdp, its optimiser shard)"
    ),
    "save_total_limit": ours("keep_last"),
    "enable_jit_checkpoint": missing(
        "SIGTERM always stops a run after the step under way, with a checkpoint "
        "of that step (exit code 143); a second SIGTERM stops at once"
    ),
    "push_to_hub": _HUB,
    "hub_token": _HUB,
    "hub_private_repo": _HUB,
    "hub_model_id": _HUB,
    "hub_strategy": _HUB,
    "hub_always_push": _HUB,
    "hub_revision": _HUB,
    "load_best_model_at_end": same("final/ is then a copy of best/"),
    "metric_for_best_model": same(
        "a metric as logged, e.g. eval/loss; each better evaluation writes best/"
    ),
    "greater_is_better": same(
        "None: False for a metric named ...loss, ...nll or ...perplexity, True otherwise"
    ),
    "ignore_data_skip": missing(
        "a resumed run continues the data order where it stopped, "
        "without reading the batches before"
    ),
    "restore_callback_states_from_checkpoint": missing(
        "there are no callbacks; a checkpoint restores the whole training state"
    ),
    "full_determinism": missing(
        "--seed seeds python, numpy and torch, and the data order depends "
        "on it alone; deterministic CUDA kernels are not switched on"
    ),
    "seed": SAME,
    "data_seed": missing("the data order is drawn from --seed"),
    "use_cpu": ours("cpu", "true"),
    "accelerator_config": missing(
        "accelerate's settings come from its launcher "
        "(accelerate launch --config_file, configs/accelerate/)"
    ),
    "parallelism_config": missing(
        "data parallel (DDP) or sharded (--fsdp true) only; no tensor, "
        "context or sequence parallelism"
    ),
    "dataloader_drop_last": missing(
        "the last, smaller batch of an epoch is kept (PPO's prompts "
        "drop it: every rollout has the same size)"
    ),
    "dataloader_num_workers": _DATALOADER,
    "dataloader_pin_memory": _DATALOADER,
    "dataloader_persistent_workers": _DATALOADER,
    "dataloader_prefetch_factor": _DATALOADER,
    "dataloader_multiprocessing_context": _DATALOADER,
    "dataloader_in_order": _DATALOADER,
    "remove_unused_columns": missing(
        "records are read by field name (--columns maps other "
        "column names); other columns are ignored"
    ),
    "label_names": missing("the labels are built from the records (the response's tokens)"),
    "train_sampling_strategy": _SAMPLING_ORDER,
    "length_column_name": _SAMPLING_ORDER,
    "ddp_find_unused_parameters": _DDP,
    "ddp_bucket_cap_mb": _DDP,
    "ddp_broadcast_buffers": _DDP,
    "ddp_static_graph": _DDP,
    "ddp_backend": missing("torch's default for the device: nccl on GPUs, gloo on CPUs"),
    "ddp_timeout": _DDP,
    "fsdp": same(
        "true or false here (FSDP2, one unit per transformer block); TRL takes a string "
        "of FSDP options"
    ),
    "fsdp_config": missing(
        "FSDP2 with one unit per transformer block; nothing to configure (docs/distributed.md)"
    ),
    "deepspeed": _NO_DEEPSPEED,
    "debug": missing(
        "`rlhfkit --debug COMMAND` prints a failure's traceback; transformers' "
        "debug features do not apply"
    ),
    "skip_memory_metrics": missing("memory is not logged as a metric; benchmarks/ measure peaks"),
    "do_train": missing("a stage trains, then evaluates on --eval_data (eval_data: null skips it)"),
    "do_eval": missing("a stage evaluates on --eval_data (eval_data: null skips it)"),
    "do_predict": missing("sample a model with `rlhfkit sample`, score it with `rlhfkit eval`"),
    "resume_from_checkpoint": ours(
        "resume", "true", "from the newest checkpoint in --output_dir; the default"
    ),
    "local_rank": missing("set by the launcher (torchrun, accelerate launch) in the environment"),
}
"""transformers' ``TrainingArguments``, which every TRL config extends."""

OLDER_PPO: dict[str, Answer] = {
    "exp_name": missing("a run is named after --output_dir in wandb and MLflow"),
}
"""Names of TRL 0.19's ``PPOConfig`` that later releases dropped."""

OLDER_SCRIPT_OPTIONS: dict[str, Answer] = {
    "trust_remote_code": SAME,
    "torch_dtype": missing(
        "models load in float32 (the master weights); --mixed_precision bf16 runs the passes "
        "in bf16"
    ),
    "gradient_checkpointing_use_reentrant": missing(
        "activation checkpointing (--gradient_checkpointing true) is always non-reentrant"
    ),
}
"""Names of TRL 0.19's ``ModelConfig`` and ``ScriptArguments`` that later releases dropped."""

OLDER_TRAINING_ARGUMENTS: dict[str, Answer] = {
    "warmup_ratio": SAME,
    "evaluation_strategy": ours("eval_every", note="every this many steps; 0 only at the end"),
    "overwrite_output_dir": ours("resume", "false", "starts over, deleting the checkpoints"),
    "logging_dir": missing("TensorBoard events go to tb/ in --output_dir"),
}
"""``TrainingArguments`` names that transformers 5 dropped."""

MODEL_CONFIG: dict[str, Answer] = {
    "model_name_or_path": ours("model"),
    "model_revision": missing(
        "a model is a local directory or a hub name at its main revision; "
        "download another revision first (hf download NAME --revision REV "
        "--local-dir DIR) and give DIR"
    ),
    "dtype": missing(
        "models load in float32 (the master weights); --mixed_precision bf16 runs "
        "the passes in bf16"
    ),
    "attn_implementation": same(
        "eager or sdpa; by default eager for bf16 on a CPU, else the model's own"
    ),
    "use_peft": ours("lora", "true"),
    "lora_r": SAME,
    "lora_alpha": SAME,
    "lora_dropout": SAME,
    "lora_target_modules": SAME,
    "lora_target_parameters": missing("LoRA adapts the modules of --lora_target_modules only"),
    "lora_modules_to_save": missing(
        "LoRA adapts --lora_target_modules; the score heads of the "
        "reward model and the critic train in full"
    ),
    "lora_task_type": missing("set by the stage: a causal LM, or a reward model's backbone"),
    "use_rslora": missing("plain LoRA only: --lora_r, --lora_alpha, --lora_dropout"),
    "use_dora": missing("plain LoRA only: --lora_r, --lora_alpha, --lora_dropout"),
    "load_in_8bit": _NO_QUANT,
    "load_in_4bit": _NO_QUANT,
    "bnb_4bit_quant_type": _NO_QUANT,
    "use_bnb_nested_quant": _NO_QUANT,
    "bnb_4bit_quant_storage": _NO_QUANT,
}
"""TRL's ``ModelConfig``: the model options of TRL's scripts."""

SCRIPT_ARGUMENTS: dict[str, Answer] = {
    "dataset_name": ours(
        "train_data",
        note="a .jsonl/.json/.parquet file, a save_to_disk "
        "directory or a hub name; held-out data is --eval_data",
    ),
    "dataset_config": missing(
        "a hub dataset is read in its default configuration; save another "
        "to disk (load_dataset(NAME, CONFIG).save_to_disk(DIR)) and give DIR"
    ),
    "dataset_train_split": ours("train_split"),
    "dataset_test_split": ours("eval_split"),
    "dataset_streaming": missing("datasets are read whole and tokenised before the first step"),
    "ignore_bias_buffers": missing("a DDP workaround of TRL's scripts, not needed here"),
}
"""TRL's ``ScriptArguments``: the dataset options of TRL's scripts."""

SFT_CONFIG: dict[str, Answer] = {
    "learning_rate": SAME,
    "model_init_kwargs": _INIT_KWARGS,
    "trust_remote_code": SAME,
    "router_aux_loss_coef": _NO_MOE_AUX,
    "chat_template_path": _CHAT_TEMPLATE,
    "dataset_text_field": missing(
        "SFT trains on prompt + response records or chat messages, with the loss on the "
        "response; --columns maps other column names, e.g. '{response: completion}'"
    ),
    "dataset_kwargs": missing("rlhfkit always tokenises the data itself"),
    "dataset_num_proc": _NO_PROCS,
    "eos_token": _EOS,
    "max_length": same("past it the prompt keeps its end and the response its start"),
    "truncation_mode": _TRUNCATION,
    "shuffle_dataset": _SHUFFLE,
    "packing": missing(
        "SFT batches hold one example per row, each attending to itself only; "
        "--padding_free runs them on their real tokens alone"
    ),
    "packing_strategy": missing("SFT batches hold one example per row"),
    "padding_free": same(
        "off by default, as in TRL; needs no flash-attention package: GPT-2, Llama and "
        "Qwen2 with eager or SDPA attention"
    ),
    "pad_to_multiple_of": _PAD_MULTIPLE,
    "eval_packing": missing("SFT batches hold one example per row"),
    "completion_only_loss": missing(
        "the loss is always on the response tokens only (EOS included)"
    ),
    "assistant_only_loss": missing(
        "with chat messages the loss is always on the last (assistant) message only"
    ),
    "loss_type": missing(
        "the loss is the response's NLL per token (TRL's 'nll'); DFT is not implemented"
    ),
    "activation_offloading": _OFFLOAD,
    "pad_token": _PAD,
}
"""TRL's ``SFTConfig`` (1.16), for ``rlhfkit sft``."""

REWARD_CONFIG: dict[str, Answer] = {
    "learning_rate": SAME,
    "model_init_kwargs": _INIT_KWARGS,
    "trust_remote_code": SAME,
    "chat_template_path": _CHAT_TEMPLATE,
    "disable_dropout": SAME,
    "dataset_num_proc": _NO_PROCS,
    "eos_token": _EOS,
    "max_length": same("longer pairs are truncated and counted, not dropped as in TRL"),
    "pad_to_multiple_of": _PAD_MULTIPLE,
    "center_rewards_coefficient": ours("center_rewards_coef"),
    "activation_offloading": _OFFLOAD,
    "pad_token": _PAD,
}
"""TRL's ``RewardConfig`` (1.16), for ``rlhfkit rm``."""

DPO_CONFIG: dict[str, Answer] = {
    "learning_rate": SAME,
    "model_init_kwargs": _INIT_KWARGS,
    "trust_remote_code": SAME,
    "router_aux_loss_coef": _NO_MOE_AUX,
    "disable_dropout": SAME,
    "dataset_num_proc": _NO_PROCS,
    "max_length": same(
        "past it the prompt keeps its end and the responses their start; "
        "--max_prompt_length and --max_response_length cut each part first"
    ),
    "truncation_mode": _TRUNCATION,
    "padding_free": same(
        "off by default, as in TRL; needs no flash-attention package: GPT-2, Llama and "
        "Qwen2 with eager or SDPA attention"
    ),
    "pad_to_multiple_of": _PAD_MULTIPLE,
    "precompute_ref_log_probs": ours("precompute_reference", "true", "the default here"),
    "precompute_ref_batch_size": ours(
        "eval_batch_size", note="precomputing runs in batches of the evaluation's size"
    ),
    "loss_type": same(
        "one of sigmoid (DPO), ipo, conservative (cDPO, with --label_smoothing), "
        "not a list; TRL's 'sft' term is --rpo_alpha, its other types are not "
        "implemented"
    ),
    "loss_weights": missing(
        "one loss type per run; the weight of the NLL ('sft') term is --rpo_alpha"
    ),
    "ld_alpha": missing("LD-DPO's down-weighting of the longer response's tail is not implemented"),
    "f_divergence_type": missing("DPO's reverse KL only: f-DPO is not implemented"),
    "f_alpha_divergence_coef": missing("DPO's reverse KL only: f-DPO is not implemented"),
    "label_smoothing": same(
        "cDPO's probability of a flipped label, with --loss_type "
        "conservative (TRL's is robust DPO's and EXO's)"
    ),
    "beta": SAME,
    "use_weighting": missing("WPO's weighting is not implemented"),
    "discopop_tau": missing("DiscoPOP is not implemented"),
    "activation_offloading": _OFFLOAD,
    "sync_ref_model": _FIXED_REFERENCE,
    "ref_model_mixup_alpha": _FIXED_REFERENCE,
    "ref_model_sync_steps": _FIXED_REFERENCE,
    "pad_token": _PAD,
}
"""TRL's ``DPOConfig`` (1.16), for ``rlhfkit dpo``."""

_ONLINE: dict[str, Answer] = {
    "learning_rate": SAME,
    "model_init_kwargs": _INIT_KWARGS,
    "trust_remote_code": SAME,
    "router_aux_loss_coef": _NO_MOE_AUX,
    "disable_dropout": same("on by default here (off in TRL)"),
    "remove_unused_columns": missing(
        "every column of a prompt's row reaches the reward functions by name, as TRL's "
        "remove_unused_columns=False"
    ),
    "num_generations": SAME,
    "num_generations_eval": missing(
        "evaluation samples one response per held-out prompt (--eval_data, --max_eval_samples)"
    ),
    "max_completion_length": ours("max_new_tokens"),
    "ds3_gather_for_generation": _NO_DEEPSPEED,
    "shuffle_dataset": _SHUFFLE,
    "pad_to_multiple_of": missing(
        "the passes over prompt + response pack the rows without padding (--padding_free)"
    ),
    "generation_batch_size": ours(
        "rollout_batch_size",
        note="prompts per iteration over all processes, each answered --num_generations "
        "times (TRL counts completions); --generation_prompts here is the prompts sampled "
        "together on a process",
    ),
    "steps_per_generation": missing(
        "derived: an iteration's optimiser steps per pass are rollout_batch_size x "
        "num_generations / (batch_size x gradient_accumulation_steps x processes); the later "
        "steps learn off-policy and the clip acts"
    ),
    "temperature": SAME,
    "top_p": same("keep 1 for RL: the log-probs ignore the filter"),
    "top_k": same("keep 0 for RL: the log-probs ignore the filter"),
    "min_p": missing("min-p filtering is not implemented"),
    "generation_kwargs": missing(
        "sampling takes --max_new_tokens, --temperature, --top_k and --top_p only"
    ),
    "chat_template_kwargs": missing("the chat template is applied with its defaults"),
    "repetition_penalty": missing(
        "it would make the sampled tokens' log-probs differ from the policy's, so it is not "
        "implemented"
    ),
    "cache_implementation": _OWN_DECODING,
    "use_vllm": _VLLM,
    "vllm_mode": _VLLM,
    "vllm_model_impl": _VLLM,
    "vllm_enable_sleep_mode": _VLLM,
    "vllm_structured_outputs_regex": _VLLM,
    "vllm_server_base_url": _VLLM,
    "vllm_server_host": _VLLM,
    "vllm_server_port": _VLLM,
    "vllm_server_timeout": _VLLM,
    "vllm_group_port": _VLLM,
    "vllm_gpu_memory_utilization": _VLLM,
    "vllm_max_model_length": _VLLM,
    "vllm_tensor_parallel_size": _VLLM,
    "beta": ours(
        "kl_coef",
        note="the weight of the k3 KL term in the loss (--kl_in_loss true), 0.04 by default; "
        "0 loads no reference",
    ),
    "num_iterations": ours(
        "ppo_epochs", note="passes of the update over each iteration's experience, 1 by default"
    ),
    "epsilon": ours("clip_range"),
    "epsilon_high": ours(
        "clip_range_high", note="acts with more than one optimiser step per iteration"
    ),
    "reward_weights": same("one weight per scorer: [reward_model, *reward_functions]"),
    "mask_truncated_completions": same(
        "their scores still count in their group's baseline; --missing_eos_penalty lowers "
        "their score instead"
    ),
    "sync_ref_model": _FIXED_REFERENCE,
    "ref_model_mixup_alpha": _FIXED_REFERENCE,
    "ref_model_sync_steps": _FIXED_REFERENCE,
    "log_completions": ours(
        "sample_every",
        note="samples (prompt, response, score, advantage) are logged every this many steps",
    ),
    "log_multimodal": missing("responses are text only: there are no images or other media to log"),
    "num_completions_to_print": ours("num_samples"),
    "log_unique_prompts": missing("the logged samples are the first --num_samples of the batch"),
    "use_transformers_continuous_batching": _OWN_DECODING,
    "transformers_continuous_batching_config": _OWN_DECODING,
    "use_transformers_paged": _OWN_DECODING,
    "per_device_train_batch_size": ours(
        "batch_size", note="completions (prompt + response) per micro-batch of the update"
    ),
}
"""The options TRL's ``GRPOConfig`` and ``RLOOConfig`` share, and the shared option whose
name differs here (``per_device_train_batch_size``)."""

GRPO_CONFIG: dict[str, Answer] = {
    **_ONLINE,
    "cast_lm_head_to_fp32": missing("the LM head runs in the policy's precision"),
    "delta": missing("two-sided clipping (INTELLECT-2) is not implemented"),
    "sapo_temperature_neg": _OTHER_GRPO_LOSSES,
    "sapo_temperature_pos": _OTHER_GRPO_LOSSES,
    "vespo_k_pos": _OTHER_GRPO_LOSSES,
    "vespo_lambda_pos": _OTHER_GRPO_LOSSES,
    "vespo_k_neg": _OTHER_GRPO_LOSSES,
    "vespo_lambda_neg": _OTHER_GRPO_LOSSES,
    "importance_sampling_level": same(
        "'token' or 'sequence' (GSPO); acts with more than one optimiser step per iteration"
    ),
    "multi_objective_aggregation": missing(
        "scores are summed with --reward_weights, then normalised (TRL's sum_then_normalize)"
    ),
    "scale_rewards": same(
        "true or false here: divide by the group's std or not (Dr. GRPO); "
        "TRL's 'batch' is not implemented"
    ),
    "loss_type": ours(
        "loss_aggregation",
        note="'bnpo' = token_mean (the default; TRL's 'dapo' too with one micro-batch on one "
        "process), 'grpo' = sequence_mean, 'dr_grpo' = constant (over --max_new_tokens); "
        "the clipped objective only (no 'cispo', 'sapo', 'vespo')",
    ),
    "top_entropy_quantile": missing("every response token counts in the loss"),
    "entropy_coef": same("a fixed weight, 0 by default"),
    "use_adaptive_entropy": _ENTROPY_BONUS,
    "entropy_coef_min": _ENTROPY_BONUS,
    "entropy_coef_max": _ENTROPY_BONUS,
    "entropy_coef_delta": _ENTROPY_BONUS,
    "entropy_target": _ENTROPY_BONUS,
    "max_tool_calling_iterations": ours(
        "max_turns",
        note="the policy's turns per episode, its answer included: TRL's iterations + 1",
    ),
    "vllm_importance_sampling_correction": _VLLM,
    "vllm_importance_sampling_mode": _VLLM,
    "vllm_importance_sampling_clip_max": _VLLM,
    "vllm_importance_sampling_clip_min": _VLLM,
    "vllm_importance_sampling_cap": _VLLM,
    "off_policy_mask_threshold": missing(
        "each sampled batch is learned from once, on-policy: nothing is off-policy to mask"
    ),
    "use_bias_correction_kl": ours(
        "kl_importance_weight",
        note="off by default here (on in TRL): the k3 term's own gradient, (1 - ref/pi) grad "
        "log pi, rather than KL's, (log pi - log ref) grad log pi; the loss is the same",
    ),
    "log_completions_hub_repo": missing(
        "samples go to the trackers and metrics.jsonl under --output_dir; nothing is uploaded"
    ),
}
"""TRL's ``GRPOConfig`` (1.16), for ``rlhfkit grpo``."""

RLOO_CONFIG: dict[str, Answer] = {
    **_ONLINE,
    "normalize_advantages": ours(
        "whiten_advantages", note="over each generation batch (--generation_prompts)"
    ),
    "reward_clip_range": ours(
        "score_clip", note="one bound: scores are clipped to [-score_clip, score_clip]"
    ),
}
"""TRL's ``RLOOConfig`` (1.16), for ``rlhfkit rloo``."""

PPO_CONFIG: dict[str, Answer] = {
    "learning_rate": SAME,
    "dataset_num_proc": _NO_PROCS,
    "num_mini_batches": ours(
        "batch_size",
        note="and --gradient_accumulation_steps: a minibatch "
        "is their product in sequences per process, so num_mini_batches = "
        "rollout_batch_size / (minibatch x processes)",
    ),
    "total_episodes": ours("max_steps", note="PPO iterations: total_episodes / rollout_batch_size"),
    "local_rollout_forward_batch_size": ours("forward_batch_size"),
    "num_sample_generations": ours(
        "sample_every", note="samples are logged every this many iterations, not this many times"
    ),
    "response_length": ours("max_new_tokens"),
    "stop_token": missing(
        "responses always stop at the tokenizer's EOS, as stop_token='eos' does; "
        "for another token, make it the tokenizer's eos_token"
    ),
    "stop_token_id": missing(
        "responses always stop at the tokenizer's EOS; for another token, "
        "make it the tokenizer's eos_token"
    ),
    "temperature": SAME,
    "missing_eos_penalty": SAME,
    "sft_model_path": ours("model"),
    "world_size": missing(_PPO_DERIVED + "the processes are the launcher's"),
    "num_total_batches": missing(_PPO_DERIVED + "--max_steps gives the iterations"),
    "micro_batch_size": missing(_PPO_DERIVED + "--batch_size is the micro-batch per process"),
    "local_batch_size": missing(
        _PPO_DERIVED + "--rollout_batch_size is the rollout over all processes"
    ),
    "batch_size": same(
        "here the micro-batch of the update per process; TRL derives its "
        "batch_size, the rollout over all processes: --rollout_batch_size"
    ),
    "local_mini_batch_size": missing(
        _PPO_DERIVED + "a minibatch is --batch_size x "
        "--gradient_accumulation_steps sequences per process"
    ),
    "mini_batch_size": missing(
        _PPO_DERIVED + "a minibatch is --batch_size x "
        "--gradient_accumulation_steps sequences per process"
    ),
    "push_to_hub": _HUB,
    "reward_model_path": ours("reward_model"),
    "model_adapter_name": _LORA_ADAPTERS,
    "ref_adapter_name": _LORA_ADAPTERS,
    "num_ppo_epochs": ours("ppo_epochs"),
    "whiten_rewards": missing(
        "per-token rewards are not whitened; --score_normalize scale or "
        "standardize normalises the scores by running statistics"
    ),
    "kl_coef": SAME,
    "kl_estimator": same("k1, k2 or k3"),
    "cliprange": ours("clip_range"),
    "vf_coef": SAME,
    "cliprange_value": ours("clip_range_value"),
    "gamma": SAME,
    "lam": SAME,
    "ds3_gather_for_generation": _NO_DEEPSPEED,
}
"""TRL's ``PPOConfig`` (1.12, ``trl.experimental.ppo``), for ``rlhfkit ppo``."""

RL_SCRIPT_ARGUMENTS: dict[str, Answer] = {
    "reward_model_name_or_path": ours("reward_model"),
    "reward_funcs": ours(
        "reward_functions",
        note="digits, gold, ifeval, instructions, math, math_format, calculator, guessing, "
        "sentiment, unasked_case, perplexity, perplexity:PATH or module:function",
    ),
}
"""The reward options of TRL's GRPO and RLOO scripts."""

OLDER_DPO: dict[str, Answer] = {
    "ref_model": ours(
        "reference",
        note="a model name or directory; refused with --lora true, "
        "whose reference is the policy with its adapter disabled",
    ),
    "max_prompt_length": SAME,
    "max_completion_length": ours("max_response_length"),
    "rpo_alpha": SAME,
    "reference_free": missing(
        "DPO here always has a reference (--reference, or the starting model)"
    ),
    "generate_during_eval": missing(
        "evaluation scores the held-out pairs; sample the model with "
        "`rlhfkit sample` or `rlhfkit eval`"
    ),
    "ref_model_init_kwargs": _INIT_KWARGS,
    "force_use_ref_model": missing(
        "with --lora true the reference is the policy with its adapter "
        "disabled; a separate --reference is refused"
    ),
    "model_adapter_name": _LORA_ADAPTERS,
    "ref_adapter_name": _LORA_ADAPTERS,
    "use_logits_to_keep": missing("only the positions that are scored go through the LM head"),
    "padding_value": _PAD,
    "label_pad_token_id": missing("unscored positions are always labelled -100"),
    "tools": missing(
        "DPO learns from pairs of texts; tools are for the RL stages (--tools, docs/tools.md)"
    ),
    "use_liger_loss": _LIGER,
    "base_model_attribute_name": _LIGER,
}
"""Names of TRL 0.19's ``DPOConfig`` that later releases dropped, and ``DPOTrainer``'s
``ref_model`` argument."""

OLDER_SFT: dict[str, Answer] = {
    "max_seq_length": ours("max_length"),
}
"""Names of TRL 0.19's ``SFTConfig`` that later releases dropped."""

OLDER_GRPO: dict[str, Answer] = {
    "max_prompt_length": SAME,
    "vllm_guided_decoding_regex": _VLLM,
    "use_liger_loss": _LIGER,
    "wandb_log_unique_prompts": missing(
        "the logged samples are the first --num_samples of the batch"
    ),
}
"""Names of TRL 0.19's ``GRPOConfig`` that later releases dropped."""

OLDER_RLOO: dict[str, Answer] = {
    "rloo_k": ours("num_generations"),
    "exp_name": missing("a run is named after --output_dir"),
    "reward_model_path": ours("reward_model"),
    "num_ppo_epochs": ours("ppo_epochs"),
    "whiten_rewards": missing(
        "--score_normalize standardize normalises the scores by running statistics"
    ),
    "kl_coef": same("the weight of the k3 KL term in the loss (--kl_in_loss true)"),
    "cliprange": ours("clip_range"),
    "normalize_reward": ours("score_normalize", "standardize", "running statistics"),
    "normalize_advantage": ours("whiten_advantages"),
    "token_level_kl": missing(
        "the KL is a k3 term per token in the loss (--kl_in_loss true), or with --kl_in_loss "
        "false each response's summed KL less its score before the baseline"
    ),
}
"""Names of TRL 0.19's ``RLOOConfig`` that later releases dropped."""


@dataclass(frozen=True)
class Table:
    """One TRL class's options and the rlhfkit commands they are answered for."""

    title: str
    """The TRL class, as docs/trl_options.md heads its table."""
    commands: tuple[str, ...]
    """The rlhfkit commands that answer these names."""
    options: dict[str, Answer]
    """TRL's option names -> rlhfkit's answers."""


STAGES = ("sft", "rm", "dpo", "grpo", "rloo", "ppo")
"""The rlhfkit commands that TRL's trainers have a counterpart of."""

TABLES: tuple[Table, ...] = (
    Table("SFTConfig (TRL 1.16)", ("sft",), SFT_CONFIG),
    Table("RewardConfig (TRL 1.16)", ("rm",), REWARD_CONFIG),
    Table("DPOConfig (TRL 1.16)", ("dpo",), DPO_CONFIG),
    Table("GRPOConfig (TRL 1.16)", ("grpo",), GRPO_CONFIG),
    Table("RLOOConfig (TRL 1.16)", ("rloo",), RLOO_CONFIG),
    Table("PPOConfig (TRL 1.12)", ("ppo",), PPO_CONFIG),
    Table(
        "The reward options of TRL's GRPO and RLOO scripts", ("grpo", "rloo"), RL_SCRIPT_ARGUMENTS
    ),
    Table(
        "TRL 0.19's DPOConfig names since dropped, and DPOTrainer's ref_model", ("dpo",), OLDER_DPO
    ),
    Table("TRL 0.19's SFTConfig names since dropped", ("sft",), OLDER_SFT),
    Table("TRL 0.19's GRPOConfig names since dropped", ("grpo",), OLDER_GRPO),
    Table("TRL 0.19's RLOOConfig names since dropped", ("rloo",), OLDER_RLOO),
    Table("TRL 0.19's PPOConfig names since dropped", ("ppo",), OLDER_PPO),
    Table("ModelConfig (TRL's scripts)", STAGES, MODEL_CONFIG),
    Table("ScriptArguments (TRL's scripts)", STAGES, SCRIPT_ARGUMENTS),
    Table(
        "TrainingArguments (transformers 5), the base of every TRL config",
        STAGES,
        TRAINING_ARGUMENTS,
    ),
    Table(
        "TRL 0.19's ModelConfig and ScriptArguments names since dropped",
        STAGES,
        OLDER_SCRIPT_OPTIONS,
    ),
    Table("TrainingArguments names before transformers 5", STAGES, OLDER_TRAINING_ARGUMENTS),
)
"""Every table, a stage's own before the shared ones: the first that names an option answers
it for a command."""


def answer(command: str, name: str) -> Answer | None:
    """rlhfkit's answer to TRL's option `name` in `command` (one of `STAGES`), or None where
    TRL's counterpart of the command has no such option."""
    for table in TABLES:
        if command in table.commands and name in table.options:
            return table.options[name]
    return None


def renamed(name: str) -> list[Answer]:
    """Every 'ours' answer to TRL's option `name`, the shared tables' first: what the commands
    that are no TRL stage (chat, bon, eval, ...) answer where they have rlhfkit's option."""
    tables = sorted(TABLES, key=lambda table: table.commands != STAGES)  # stable: shared first
    found = (table.options.get(name) for table in tables)
    return [a for a in found if a is not None and a.kind == "ours"]
