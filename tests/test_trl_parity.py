"""The options built for TRL's users against TRL itself, on the same token ids and weights:
RPO's loss against TRL 1.16's DPOTrainer with its "sft" term (what ``rpo_alpha`` became),
reward centring against TRL 1.16's RewardTrainer, and DPO's prompt and response cuts against
TRL 0.19's own ``tokenize_row`` (read from its source and run without importing TRL, which
needs an older transformers), and GRPO's policy loss (``ppo_update.policy_loss`` with the
settings of a ``GRPOConfig``) against TRL 1.16's GRPOTrainer loss types, loss and gradients:
one update per sampled batch (TRL's num_iterations 1, the ratio 1) and the off-policy pass
of num_iterations 2 (the ratio to the sampling policy's log-probs clipped, below and above,
per token and per sequence: GSPO).

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
from rlhfkit.experience.rollout import Rollout
from rlhfkit.models.loading import RewardModel
from rlhfkit.models.passes import response_logprobs, sequence_inputs
from rlhfkit.trainers.dpo import DPOPair, DPOTrainer
from rlhfkit.trainers.dpo_config import DPOConfig
from rlhfkit.trainers.ppo_update import policy_loss
from rlhfkit.trainers.reward import RewardTrainer
from rlhfkit.trainers.rl_config import RLConfig

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
sampler = AutoModelForCausalLM.from_pretrained(spec["old"]).state_dict()
tensors = {k: torch.tensor(spec[k]) for k in ("prompt_ids", "completion_ids", "completion_mask")}
tensors["prompt_mask"] = torch.ones_like(tensors["prompt_ids"])
tensors["advantages"] = torch.tensor(spec["advantages"])
results = {}
for run in spec["runs"]:
    args = GRPOConfig(
        output_dir=spec["out"], report_to="none", use_cpu=True, bf16=False, disable_dropout=True,
        gradient_checkpointing=False, loss_type=run["loss_type"], beta=spec["beta"],
        epsilon=spec["clip"], epsilon_high=run["clip_high"],
        importance_sampling_level=run["level"],
        num_iterations=run["num_iterations"], temperature=1.0,
        max_completion_length=spec["max_new_tokens"],
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
    inputs = dict(tensors)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].size(1)
    with torch.no_grad():  # as _generate_and_score_completions does
        inputs["ref_per_token_logps"], _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.ref_model, input_ids, attention_mask, width
        )
        # Its test: the sampling policy's log-probs are kept where the batch is learnt from
        # more than once (num_iterations > 1), else None (the loss's own pass, detached).
        # Read, as there, through trainer.model, with the weights of the policy that sampled
        # (the trained one as it was some updates ago); then the trained weights back.
        inputs["old_per_token_logps"] = None
        if args.gradient_accumulation_steps % (args.steps_per_generation * args.num_iterations):
            trained = {k: v.clone() for k, v in trainer.model.state_dict().items()}
            trainer.model.load_state_dict(sampler)
            inputs["old_per_token_logps"], _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, input_ids, attention_mask, width
            )
            trainer.model.load_state_dict(trained)
    assert (inputs["old_per_token_logps"] is None) == (run["num_iterations"] == 1)
    # The active tokens of the whole accumulated batch over processes: one micro-batch here.
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum()
    for correction in (False, True):  # read by _compute_loss on each call
        trainer.args.use_bias_correction_kl = correction
        trainer.model.zero_grad(set_to_none=True)
        loss = trainer._compute_loss(trainer.model, inputs)
        loss.backward()
        grads = {name: p.grad for name, p in trainer.model.named_parameters()}
        key = f"{run['name']}-{'corrected' if correction else 'plain'}"
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


# The sampling policy of the off-policy pass: the policy's weights plus seeded noise of this
# std, as if some updates lay between them. On `grpo_batch` the ratios pi / pi_old run from
# about 0.55 to 2.1: of the 15 tokens 6 are clipped at [0.8, 1.2] (one below 0.8 with a
# negative advantage, five above 1.2 with a positive one), the rest inside or on the side the
# clip leaves alone; two of the five lie between 1.2 and 1.28, so [0.8, 1.28] clips 4.
SAMPLER_NOISE = 0.05


def grpo_run(
    loss_type: str, iterations: int = 1, clip_high: float | None = None, level: str = "token"
) -> str:
    """The name of a TRL run (a GRPOTrainer with these options) in `trl_grpo_losses`."""
    return f"{loss_type}-iterations{iterations}-high{clip_high}-{level}"


# The runs: every loss type on-policy, and off-policy with its clip range 0.2 above 1 as below
# (TRL's epsilon_high None), with DAPO's clip-higher 0.28, and with GSPO's ratio per sequence.
GRPO_RUNS = (
    [(loss_type, 1, None, "token") for loss_type in TRL_LOSS_AGGREGATION]
    + [(loss_type, 2, high, "token") for loss_type in TRL_LOSS_AGGREGATION for high in (None, 0.28)]
    + [(loss_type, 2, None, "sequence") for loss_type in TRL_LOSS_AGGREGATION]
)


@pytest.fixture(scope="module")
def trl_grpo_losses(tiny_tokenizer, tmp_path_factory):
    """TRL 1.16's GRPOTrainer._compute_loss for each run of `GRPO_RUNS` on `grpo_batch`, with
    and without its `use_bias_correction_kl`: the directory of the models (policy, reference
    and the older policy that sampled) and of the gradients it saved, the batch, and the
    losses by "<grpo_run>-plain" / "-corrected"."""
    source = trl_source("use_bias_correction_kl", "trainer/grpo_trainer.py")
    tmp_path = tmp_path_factory.mktemp("grpo_parity")
    for name, seed in (("policy", 0), ("reference", 1)):
        tiny_lm(tiny_tokenizer, seed=seed, n_positions=128).save_pretrained(tmp_path / name)
        tiny_tokenizer.save_pretrained(tmp_path / name)
    sampler = tiny_lm(tiny_tokenizer, seed=0, n_positions=128)  # the policy's weights
    noise = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for parameter in sampler.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=noise), alpha=SAMPLER_NOISE)
    sampler.save_pretrained(tmp_path / "old")
    batch = grpo_batch(tiny_tokenizer)
    spec = batch | {"model": str(tmp_path / "policy"), "reference": str(tmp_path / "reference")}
    runs = [
        {
            "name": grpo_run(*run),
            "loss_type": run[0],
            "num_iterations": run[1],
            "clip_high": run[2],
            "level": run[3],
        }
        for run in GRPO_RUNS
    ]
    spec |= {"old": str(tmp_path / "old"), "out": str(tmp_path), "runs": runs}
    return tmp_path, batch, run_trl(source, spec, tmp_path, GRPO_SIDE)


def grpo_loss_and_grads(
    models: Path,
    batch: dict,
    loss_type: str,
    ratio_weighted_kl: bool,
    iterations: int = 1,
    clip_high: float | None = None,
    level: str = "token",
):
    """Ours on `grpo_batch`: the loss of GRPO's update (``ppo_update.policy_loss`` with the
    settings of the GRPO preset's ``RLConfig`` with these options, the KL coefficient its
    kl_coef) on a
    ``Rollout`` of the batch; the loss, the gradients and the loss's statistics.

    `loss_type` is TRL's: its ``loss_aggregation`` is ours. With `ratio_weighted_kl` the k3
    terms are multiplied by the ratio pi / pi_old: TRL's `use_bias_correction_kl` (its
    default), our `kl_importance_weight`. `level` is TRL's and our importance_sampling_level.
    At one iteration the config has the experience made
    without the policy's pass (``Rollout.logprobs`` None: pi_old is the update's own pass,
    detached); at more it keeps the sampling policy's log-probs, read here from models/old as
    ``ExperienceMaker`` reads the policy's (no gradient, the sampling temperature).
    """
    config = RLConfig.preset(
        "grpo", model="unused", output_dir=str(models / "unused"), reward_functions=["m:f"],
        loss_aggregation=TRL_LOSS_AGGREGATION[loss_type], kl_coef=batch["beta"],
        clip_range=batch["clip"], clip_range_high=clip_high, ppo_epochs=iterations,
        kl_importance_weight=ratio_weighted_kl, max_new_tokens=batch["max_new_tokens"],
        importance_sampling_level=level, cpu=True, report_to=[], resume=False,
    )  # fmt: skip
    settings = config.loss_settings
    policy = AutoModelForCausalLM.from_pretrained(models / "policy").eval()  # no dropout
    query = torch.tensor(batch["prompt_ids"])
    response = torch.tensor(batch["completion_ids"])
    mask = torch.tensor(batch["completion_mask"])
    inputs = sequence_inputs(query, torch.ones_like(query), response, mask)

    def logprobs_of(name: str) -> torch.Tensor:  # (B, Tr), no gradient
        model = AutoModelForCausalLM.from_pretrained(models / name).eval()
        with torch.no_grad():
            return response_logprobs(model, inputs, response, settings.temperature).logprobs

    old = logprobs_of("old") if config.rollout_settings(1).policy_pass else None
    advantages = torch.tensor(batch["advantages"])[:, None].expand(response.shape)
    zeros = torch.zeros(len(query))  # the fields the loss does not read: zeros, None, []
    rollout = Rollout(
        query=query, query_mask=torch.ones_like(query), response=response, response_mask=mask,
        logprobs=old, ref_logprobs=logprobs_of("reference"), entropy=None, values=None,
        raw_scores=zeros, scores=zeros, kl=None, rewards=torch.zeros(response.shape),
        advantages=advantages, returns=None, eos_emitted=zeros.bool(), prompts=[], responses=[],
    )  # fmt: skip
    loss, stats, _ = policy_loss(policy, rollout, settings, config.beta, packed=False)
    loss.backward()
    grads = {name: p.grad for name, p in policy.named_parameters()}
    return float(loss.detach()), grads, stats


def assert_equal_to_trl(models: Path, trl_losses: dict, key: str, loss: float, grads: dict):
    """`loss` and every one of `grads` as TRL's run `key`, to 1e-5; a real gradient."""
    trl_grads = torch.load(models / f"grads_{key}.pt")
    assert loss == pytest.approx(trl_losses[key], abs=1e-5)
    assert grads.keys() == trl_grads.keys()
    for name, grad in trl_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=0)
    assert float(grads["transformer.wte.weight"].abs().max()) > 1e-2  # a real gradient


@pytest.mark.parametrize("loss_type", list(TRL_LOSS_AGGREGATION))
def test_grpo_loss_aggregations_equal_trls_grpo_loss_types(trl_grpo_losses, loss_type):
    """Our loss and every gradient as TRL's `loss_type` at num_iterations 1 with
    `use_bias_correction_kl=False`; and, with TRL's default True, as ours with
    `kl_importance_weight` (the same loss, gradients apart by about 3e-3 here: what this test
    tells apart at 1e-5)."""
    models, batch, trl_losses = trl_grpo_losses
    for trl_kl, ratio_weighted in (("plain", False), ("corrected", True)):
        loss, grads, stats = grpo_loss_and_grads(models, batch, loss_type, ratio_weighted)
        key = f"{grpo_run(loss_type)}-{trl_kl}"
        assert_equal_to_trl(models, trl_losses, key, loss, grads)
        assert stats["policy/ratio"] == pytest.approx(1.0)  # on-policy: nothing to clip
        assert stats["policy/clipfrac"] == 0


@pytest.mark.parametrize("loss_type", list(TRL_LOSS_AGGREGATION))
def test_grpo_off_policy_loss_equals_trls_num_iterations_2(trl_grpo_losses, loss_type):
    """Our loss and every gradient as TRL's `loss_type` at num_iterations 2, where the batch
    was sampled by an older policy whose log-probs both keep (TRL's old_per_token_logps, our
    ``Rollout.logprobs``): the ratio pi / pi_old away from 1, clipped to [0.8, 1.2] (TRL's
    epsilon 0.2, our clip_range) and to [0.8, 1.28] (TRL's epsilon_high 0.28, our
    clip_range_high); with and without the ratio-weighted KL, which now differs in value too.
    The clip acts in both, and fewer tokens are clipped with the higher bound."""
    models, batch, trl_losses = trl_grpo_losses
    clipped = {}
    for clip_high in (None, 0.28):
        for trl_kl, ratio_weighted in (("plain", False), ("corrected", True)):
            loss, grads, stats = grpo_loss_and_grads(
                models, batch, loss_type, ratio_weighted, iterations=2, clip_high=clip_high
            )
            key = f"{grpo_run(loss_type, 2, clip_high)}-{trl_kl}"
            assert_equal_to_trl(models, trl_losses, key, loss, grads)
            clipped[clip_high] = stats["policy/clipfrac"]
            assert stats["policy/approx_kl"] > 0.01  # the ratio well away from 1
    assert 0 < clipped[0.28] < clipped[None]


@pytest.mark.parametrize("loss_type", list(TRL_LOSS_AGGREGATION))
def test_gspo_off_policy_loss_equals_trls_sequence_level(trl_grpo_losses, loss_type):
    """Our loss and every gradient with importance_sampling_level 'sequence' as TRL's, at
    num_iterations 2 (at 1 the two levels have the same gradient): one ratio per response, the
    geometric mean of its tokens' ratios, clipped to [0.8, 1.2]; not the token level's loss.
    With the ratio-weighted KL the two differ by design: TRL weighs each k3 term by the
    sequence's ratio, ours by its token's own (`kl_importance_weight`)."""
    models, batch, trl_losses = trl_grpo_losses
    loss, grads, stats = grpo_loss_and_grads(
        models, batch, loss_type, False, iterations=2, level="sequence"
    )
    assert_equal_to_trl(
        models, trl_losses, f"{grpo_run(loss_type, 2, None, 'sequence')}-plain", loss, grads
    )
    token_level = trl_losses[f"{grpo_run(loss_type, 2)}-plain"]
    assert abs(loss - token_level) > 1e-3
    assert stats["policy/approx_kl"] > 0.01  # the ratio well away from 1
