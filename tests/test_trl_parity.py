"""The options built for TRL's users against TRL itself, on the same token ids and weights:
RPO's loss against TRL 1.16's DPOTrainer with its "sft" term (what ``rpo_alpha`` became),
reward centring against TRL 1.16's RewardTrainer, and DPO's prompt and response cuts against
TRL 0.19's own ``tokenize_row`` (read from its source and run without importing TRL, which
needs an older transformers).

TRL runs in a subprocess from its source: set RLHFKIT_TRL_SOURCES as for
tests/test_trl_names.py (directories holding a ``trl/`` package, e.g. unpacked wheels of TRL
1.16 and 0.19); without it these tests are skipped.
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, GPT2ForSequenceClassification

from helpers import tiny_lm
from rlhfkit.config import RewardConfig
from rlhfkit.data import Comparison, PreferenceExample, encode_comparisons
from rlhfkit.models.loading import RewardModel
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


def trl_source(marker: str, file: str) -> Path:
    """The first source in RLHFKIT_TRL_SOURCES whose `file` contains `marker`, or a skip."""
    for entry in os.environ.get(SOURCES_ENV, "").split(os.pathsep):
        path = Path(entry) / "trl" / file
        if entry and path.is_file() and marker in path.read_text(encoding="utf-8"):
            return Path(entry)
    pytest.skip(f"{SOURCES_ENV} names no TRL source whose {file} has {marker!r}")


def run_trl(source: Path, spec: dict, tmp_path: Path) -> float:
    script = tmp_path / "trl_side.py"
    script.write_text(TRL_SIDE)
    env = dict(os.environ, PYTHONPATH=str(source), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, str(script), json.dumps(spec)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))["loss"]


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
    trl_loss = run_trl(source, spec, tmp_path)
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
    trl_loss = run_trl(source, spec | {"out": str(tmp_path / "t")}, tmp_path)
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
