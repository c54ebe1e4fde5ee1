"""The options built for TRL's users against TRL itself, on the same token ids and weights:
RPO's loss against TRL 1.16's DPOTrainer with its "sft" term (what ``rpo_alpha`` became),
reward centring against TRL 1.16's RewardTrainer, and DPO's prompt and response cuts against
TRL 0.19's own ``tokenize_row`` (read from its source and run without importing TRL, which
needs an older transformers), and GRPO's ``loss_aggregation`` against TRL 1.16's
GRPOTrainer loss types (loss and gradients).

TRL runs in a subprocess from its source: set RLHFKIT_TRL_SOURCES as for
tests/test_trl_names.py (directories holding a ``trl/`` package, e.g. unpacked wheels of TRL
1.16 and 0.19); without it these tests are skipped.
"""

import ast
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2ForSequenceClassification

from helpers import tiny_lm
from rlhfkit.config import RewardConfig
from rlhfkit.data import Comparison, PreferenceExample, encode_comparisons
from rlhfkit.models.loading import RewardModel
from rlhfkit.models.passes import response_logprobs, sequence_inputs
from rlhfkit.ops.losses import aggregate_token_loss, kl_k3, ppo_policy_loss
from rlhfkit.trainers.dpo import DPOPair, DPOTrainer
from rlhfkit.trainers.dpo_config import DPOConfig
from rlhfkit.trainers.reward import RewardTrainer

SOURCES_ENV = "RLHFKIT_TRL_SOURCES"

TRL_SIDE = """
import json, sys
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

spec = json.loads(sys.argv[1])
tokenizer = AutoTokenizer.from_pretrained(spec["model"])
rows = [{"prompt": "a", "chosen": " b", "rejected": " c"}] * 2  # only to build the trainer
common = dict(output_dir=spec["out"], report_to="none", use_cpu=True, bf16=False,
              gradient_checkpointing=False, disable_dropout=True)
if spec["kind"] == "dpo":
    from trl import DPOConfig, DPOTrainer
    args = DPOConfig(loss_type=["sigmoid", "sft"], loss_weights=[1.0, spec["alpha"]],
                     beta=spec["beta"], max_length=None, **common)
    trainer = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(spec["model"]),
        ref_model=AutoModelForCausalLM.from_pretrained(spec["reference"]),
        args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
    )
    examples = [{"prompt_ids": p, "chosen_ids": c, "rejected_ids": r} for p, c, r in spec["pairs"]]
else:
    from trl import RewardConfig, RewardTrainer
    args = RewardConfig(center_rewards_coefficient=spec["coef"], **common)
    trainer = RewardTrainer(
        model=AutoModelForSequenceClassification.from_pretrained(spec["model"], num_labels=1),
        args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
    )
    examples = [{"chosen_ids": p + c, "rejected_ids": p + r} for p, c, r in spec["pairs"]]
trainer.model.train()
with torch.no_grad():
    loss = trainer.compute_loss(trainer.model, trainer.data_collator(examples))
print("RESULT " + json.dumps({"loss": float(loss)}))
"""


GRPO_SIDE = """
import json, sys
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

spec = json.loads(sys.argv[1])
tokenizer = AutoTokenizer.from_pretrained(spec["model"])
reference = AutoModelForCausalLM.from_pretrained(spec["reference"]).state_dict()
tensors = {k: torch.tensor(spec[k]) for k in ("prompt_ids", "completion_ids", "completion_mask")}
tensors["prompt_mask"] = torch.ones_like(tensors["prompt_ids"])
tensors["advantages"] = torch.tensor(spec["advantages"])
results = {}
for loss_type in spec["loss_types"]:
    args = GRPOConfig(
        output_dir=spec["out"], report_to="none", use_cpu=True, bf16=False, disable_dropout=True,
        gradient_checkpointing=False, loss_type=loss_type, beta=spec["beta"], epsilon=spec["clip"],
        num_iterations=1, temperature=1.0, max_completion_length=spec["max_new_tokens"],
        per_device_train_batch_size=len(spec["advantages"]), num_generations=2,
        gradient_accumulation_steps=1,
    )
    trainer = GRPOTrainer(
        model=spec["model"], reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args, train_dataset=Dataset.from_list([{"prompt": "a"}] * 4), processing_class=tokenizer,
    )
    trainer.ref_model.load_state_dict(reference)  # the reference weights, not the policy's
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop otherwise
    trainer.model.train()
    inputs = dict(tensors, old_per_token_logps=None)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():  # as _generate_and_score_completions does
        inputs["ref_per_token_logps"], _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.ref_model, input_ids, attention_mask, inputs["completion_ids"].size(1)
        )
    # The active tokens of the whole accumulated batch over processes: one micro-batch here.
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum()
    for correction in (False, True):  # read by _compute_loss on each call
        trainer.args.use_bias_correction_kl = correction
        trainer.model.zero_grad(set_to_none=True)
        loss = trainer._compute_loss(trainer.model, inputs)
        loss.backward()
        grads = {name: p.grad for name, p in trainer.model.named_parameters()}
        key = f"{loss_type}-{'corrected' if correction else 'plain'}"
        torch.save(grads, f"{spec['out']}/grads_{key}.pt")
        results[key] = float(loss)
print("RESULT " + json.dumps(results))
"""


def trl_source(marker: str, file: str) -> Path:
    """The first source in RLHFKIT_TRL_SOURCES whose `file` contains `marker`, or a skip."""
    for entry in os.environ.get(SOURCES_ENV, "").split(os.pathsep):
        path = Path(entry) / "trl" / file
        if entry and path.is_file() and marker in path.read_text(encoding="utf-8"):
            return Path(entry)
    pytest.skip(f"{SOURCES_ENV} names no TRL source whose {file} has {marker!r}")


def run_trl(source: Path, spec: dict, tmp_path: Path, script_text: str = TRL_SIDE) -> dict:
    """Run `script_text` with `spec` on TRL from `source`; its RESULT line as a dict."""
    script = tmp_path / "trl_side.py"
    script.write_text(script_text)
    env = dict(os.environ, PYTHONPATH=str(source), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, str(script), json.dumps(spec)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def pairs_of(tokenizer) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt, chosen, rejected) ids of different lengths, the responses ending with EOS."""
    eos = tokenizer.eos_token_id

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    return [
        (ids("The cat likes"), ids(" a red ball!") + [eos], ids(" a ball?") + [eos]),
        (ids("We"), ids(" paint.") + [eos], ids(" see the big tree today.") + [eos]),
        (ids("A small bird finds"), ids(" it") + [eos], ids(" some good food") + [eos]),
    ]


def test_rpo_loss_equals_trls_dpo_with_its_sft_term(tiny_tokenizer, tmp_path):
    source = trl_source('loss_type == "sft"', "trainer/dpo_trainer.py")
    for name, seed in (("policy", 0), ("reference", 1)):
        tiny_lm(tiny_tokenizer, seed=seed, n_positions=128).save_pretrained(tmp_path / name)
        tiny_tokenizer.save_pretrained(tmp_path / name)
    pairs = pairs_of(tiny_tokenizer)
    spec = {"kind": "dpo", "model": str(tmp_path / "policy"), "pairs": pairs, "alpha": 0.7}
    spec |= {"reference": str(tmp_path / "reference"), "beta": 0.1, "out": str(tmp_path / "t")}
    trl_loss = run_trl(source, spec, tmp_path)["loss"]
    for precompute in (True, False):
        config = DPOConfig(
            model="unused", train_data="unused", eval_data=None, output_dir=str(tmp_path / "o"),
            rpo_alpha=0.7, beta=0.1, precompute_reference=precompute, batch_size=3, cpu=True,
            report_to=[], resume=False,
        )  # fmt: skip
        trainer = DPOTrainer(
            config,
            AutoModelForCausalLM.from_pretrained(tmp_path / "policy"),
            tiny_tokenizer,
            [DPOPair(PreferenceExample(p, [c, r])) for p, c, r in pairs],
            reference=AutoModelForCausalLM.from_pretrained(tmp_path / "reference"),
        )
        loss, metrics = trainer.compute_loss(trainer.collate_fn(trainer.train_data))
        assert float(loss.detach()) == pytest.approx(trl_loss, abs=1e-5)
        assert float(metrics["nll_chosen"]) > 1  # the NLL term is a real part of the loss


def test_reward_centring_equals_trls_reward_trainer(tiny_tokenizer, tmp_path):
    source = trl_source("center_rewards_coefficient", "trainer/reward_trainer.py")
    config = tiny_lm(tiny_tokenizer, n_positions=128).config
    config.num_labels = 1
    classifier = GPT2ForSequenceClassification(config)  # seeded by tiny_lm
    classifier.score.weight.data.normal_(std=0.5)  # scores far from 0: a large centring term
    classifier.save_pretrained(tmp_path / "rm")
    tiny_tokenizer.save_pretrained(tmp_path / "rm")
    pairs = pairs_of(tiny_tokenizer)
    spec = {"kind": "rm", "model": str(tmp_path / "rm"), "pairs": pairs, "coef": 0.3}
    trl_loss = run_trl(source, spec | {"out": str(tmp_path / "t")}, tmp_path)["loss"]
    config = RewardConfig(
        model="unused", train_data="unused", eval_data=None, output_dir=str(tmp_path / "o"),
        center_rewards_coef=0.3, batch_size=3, cpu=True, report_to=[], resume=False,
    )  # fmt: skip
    examples = [PreferenceExample(p, [c, r]) for p, c, r in pairs]
    model = RewardModel.from_pretrained(tmp_path / "rm")
    trainer = RewardTrainer(config, model, tiny_tokenizer, examples)
    loss, metrics = trainer.compute_loss(trainer.collate(examples))
    assert float(loss.detach()) == pytest.approx(trl_loss, abs=1e-5)
    assert metrics["centering"] > 1


def test_prompt_and_response_cuts_equal_trl_0_19s_tokenize_row(tiny_tokenizer):
    source = trl_source("def tokenize_row(features, processing_class, max_prompt_length",
                        "trainer/dpo_trainer.py")  # fmt: skip
    tree = ast.parse((source / "trl" / "trainer" / "dpo_trainer.py").read_text(encoding="utf-8"))
    function = next(
        node for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "tokenize_row"
    )  # fmt: skip
    function.decorator_list = []
    namespace: dict = {}
    exec(compile(ast.Module([function], []), "tokenize_row", "exec"), namespace)
    tokenize_row = namespace["tokenize_row"]
    rows = [
        ("The cat likes the big tree in the park", " a red ball every day!", " no."),
        ("We", " paint the blue sky.", " see some good food in the park today."),
    ]
    for max_prompt, max_response in ((4, 3), (2, 8), (None, 2), (3, None)):
        for prompt, chosen, rejected in rows:
            features = {"prompt": prompt, "chosen": chosen, "rejected": rejected}
            theirs = tokenize_row(features, tiny_tokenizer, max_prompt, max_response, False)
            (ours,), _ = encode_comparisons(
                [Comparison(prompt, chosen, rejected)],
                tiny_tokenizer,
                max_length=128,
                max_prompt_length=max_prompt,
                max_response_length=max_response,
            )
            assert ours.prompt_ids == theirs["prompt_input_ids"]
            assert ours.response_ids == [theirs["chosen_input_ids"], theirs["rejected_input_ids"]]


# TRL's GRPO loss types and the loss_aggregation of ours each is (dapo: its normaliser is the
# active tokens of the whole accumulated batch over processes, here one micro-batch on one).
TRL_LOSS_AGGREGATION = {
    "grpo": "sequence_mean",
    "bnpo": "token_mean",
    "dr_grpo": "constant",
    "dapo": "token_mean",
}


def grpo_batch(tokenizer) -> dict:
    """Four prompts of one length (TRL's loss forward gives no position ids, so left padding
    would shift its positions and not ours) and completions of 6, 3, 1 and 5 tokens, all
    but the first (cut at the width) ending with EOS, right-padded; the advantages per
    sequence."""
    rng = random.Random(0)
    words = [i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    prompts = [rng.sample(words, 5) for _ in range(4)]
    completions = [
        rng.sample(words, 6),  # cut at the width, no EOS
        [*rng.sample(words, 2), eos],
        [eos],
        [*rng.sample(words, 4), eos],
    ]
    width = max(map(len, completions))
    return {
        "prompt_ids": prompts,
        "completion_ids": [c + [pad] * (width - len(c)) for c in completions],
        "completion_mask": [[1] * len(c) + [0] * (width - len(c)) for c in completions],
        "advantages": [0.9, -0.4, 1.5, -2.0],
        "max_new_tokens": 8,  # above the width: Dr. GRPO's constant is B x this, not B x width
        "beta": 0.3,
        "clip": 0.2,
    }


@pytest.fixture(scope="module")
def trl_grpo_losses(tiny_tokenizer, tmp_path_factory):
    """TRL 1.16's GRPOTrainer._compute_loss for each loss type on `grpo_batch`, with and
    without its `use_bias_correction_kl`: the directory of the models and of the gradients
    it saved, the batch, and the losses by "<loss type>-plain" / "-corrected"."""
    source = trl_source("use_bias_correction_kl", "trainer/grpo_trainer.py")
    tmp_path = tmp_path_factory.mktemp("grpo_parity")
    for name, seed in (("policy", 0), ("reference", 1)):
        tiny_lm(tiny_tokenizer, seed=seed, n_positions=128).save_pretrained(tmp_path / name)
        tiny_tokenizer.save_pretrained(tmp_path / name)
    batch = grpo_batch(tiny_tokenizer)
    spec = batch | {"model": str(tmp_path / "policy"), "reference": str(tmp_path / "reference")}
    spec |= {"out": str(tmp_path), "loss_types": list(TRL_LOSS_AGGREGATION)}
    return tmp_path, batch, run_trl(source, spec, tmp_path, GRPO_SIDE)


def grpo_loss_and_grads(models: Path, batch: dict, loss_type: str, ratio_weighted_kl: bool):
    """Ours on `grpo_batch`: the clipped loss + beta x k3, aggregated as TRL's `loss_type`, one
    update per generation (old log-probs = current, detached); the loss and the gradients.

    With `ratio_weighted_kl` the k3 terms are first multiplied by the ratio pi / pi_old, 1 in
    value but not in gradient: TRL's `use_bias_correction_kl` (its default), our
    `kl_importance_weight`.
    """
    policy = AutoModelForCausalLM.from_pretrained(models / "policy").eval()  # no dropout
    reference = AutoModelForCausalLM.from_pretrained(models / "reference").eval()
    query = torch.tensor(batch["prompt_ids"])
    response = torch.tensor(batch["completion_ids"])
    mask = torch.tensor(batch["completion_mask"])
    inputs = sequence_inputs(query, torch.ones_like(query), response, mask)
    logprobs = response_logprobs(policy, inputs, response, 1.0).logprobs  # (B, Tr)
    with torch.no_grad():
        ref_logprobs = response_logprobs(reference, inputs, response, 1.0).logprobs
    advantages = torch.tensor(batch["advantages"])[:, None].expand_as(logprobs)
    aggregation = {
        "aggregation": TRL_LOSS_AGGREGATION[loss_type],
        "max_tokens": batch["max_new_tokens"],
    }
    loss, _ = ppo_policy_loss(
        logprobs, logprobs.detach(), advantages, mask, batch["clip"], **aggregation
    )
    kl = kl_k3(logprobs, ref_logprobs)
    if ratio_weighted_kl:
        kl = kl * torch.exp(logprobs - logprobs.detach())
    loss = loss + batch["beta"] * aggregate_token_loss(kl, mask, **aggregation)
    loss.backward()
    return float(loss.detach()), {name: p.grad for name, p in policy.named_parameters()}


@pytest.mark.parametrize("loss_type", list(TRL_LOSS_AGGREGATION))
def test_grpo_loss_aggregations_equal_trls_grpo_loss_types(trl_grpo_losses, loss_type):
    """Our loss and every gradient as TRL's `loss_type` with `use_bias_correction_kl=False`;
    and, with TRL's default True, as ours with the k3 terms weighted by the ratio (the same
    loss, gradients apart by about 3e-3 here: what this test tells apart at 1e-5)."""
    models, batch, trl_losses = trl_grpo_losses
    for trl_kl, ratio_weighted in (("plain", False), ("corrected", True)):
        trl_grads = torch.load(models / f"grads_{loss_type}-{trl_kl}.pt")
        loss, grads = grpo_loss_and_grads(models, batch, loss_type, ratio_weighted)
        assert loss == pytest.approx(trl_losses[f"{loss_type}-{trl_kl}"], abs=1e-5)
        assert grads.keys() == trl_grads.keys()
        for name, grad in trl_grads.items():
            torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=0)
        assert float(grads["transformer.wte.weight"].abs().max()) > 1e-2  # a real gradient
