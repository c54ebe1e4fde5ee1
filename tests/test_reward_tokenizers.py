"""A reward model with its own tokenizer (another model family): it scores the decoded texts in
its own tokens, equal to the token-id path when the tokenizers are the same, chosen by every
command that loads a scorer, and it drives PPO; a critic cannot start from it."""

import copy
import json
from dataclasses import replace

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from helpers import TARGETS, tiny_corpus, tiny_lm, tiny_prompts
from rlhfkit.data import pad
from rlhfkit.errors import UsageError
from rlhfkit.evaluation.evaluate import EvalConfig, evaluate
from rlhfkit.experience.scorer_loading import build_scorer, load_reward_scorer, parse_scorer
from rlhfkit.experience.scorers import RewardModelScorer, ScoreInput
from rlhfkit.models.loading import RewardModel, ValueModel, same_tokenizer
from rlhfkit.runtime.packing import enable_packing
from rlhfkit.trainers.rl import RLTrainer
from rlhfkit.trainers.rl_config import RLConfig


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per byte and other special tokens: no id means what it means to the tiny
    BPE (whose merges and <|endoftext|> / <|pad|> it lacks)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=259,  # the 256 bytes and 3 special tokens: no merges
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tiny_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=256,
    )


@pytest.fixture(scope="module")
def char_reward_dir(tmp_path_factory):
    """A tiny GPT-2 reward model over the character tokenizer, saved with it."""
    path = tmp_path_factory.mktemp("char_rm")
    tokenizer = char_tokenizer()
    rm = RewardModel(tiny_lm(tokenizer, seed=2, n_positions=256).transformer)
    rm.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _score_input(
    tokenizer, prompts: list[str], responses: list[str], ended: bool = True
) -> ScoreInput:
    """A batch as a rollout makes it: left-padded prompt ids, response ids ending with EOS
    (``ended``) or cut short without it."""
    query, query_mask = pad([tokenizer(p)["input_ids"] for p in prompts], 1, side="left")
    end = [tokenizer.eos_token_id] if ended else []
    response, response_mask = pad([tokenizer(r)["input_ids"] + end for r in responses], 1)
    return ScoreInput.from_ids(tokenizer, query, query_mask, response, response_mask)


PROMPTS = tiny_corpus(4, seed=9)
RESPONSES = [" It is a good ball.", " We see it!", " The robot reads a new book today.", " 42"]


def test_text_path_equals_token_path_with_the_same_tokenizer(tiny_model_dir, tiny_tokenizer):
    rm = RewardModel.from_pretrained(tiny_model_dir).eval()
    torch.nn.init.normal_(rm.score.weight, generator=torch.Generator().manual_seed(0))
    for ended in (True, False):  # a response cut short is read at an EOS on both paths
        batch = _score_input(tiny_tokenizer, PROMPTS, RESPONSES, ended)
        ids = RewardModelScorer(rm)(batch)
        texts = RewardModelScorer(rm, tokenizer=tiny_tokenizer)(batch)  # decode, re-encode
        torch.testing.assert_close(texts, ids, atol=1e-5, rtol=0)
    assert same_tokenizer(tiny_tokenizer, tiny_tokenizer)
    assert not same_tokenizer(tiny_tokenizer, char_tokenizer())


def test_a_reward_model_with_its_own_tokenizer_scores_the_texts(
    char_reward_dir, tiny_tokenizer, caplog
):
    own = char_tokenizer()
    rm = RewardModel.from_pretrained(char_reward_dir).eval()
    pairs = zip(PROMPTS, RESPONSES, strict=True)
    encoded = [own(p + r)["input_ids"] + [own.eos_token_id] for p, r in pairs]
    with torch.no_grad():
        expected = rm(*pad(encoded, own.pad_token_id))
    batch = _score_input(tiny_tokenizer, PROMPTS, RESPONSES)
    scorers = [
        load_reward_scorer(str(char_reward_dir), tiny_tokenizer),  # eval
        parse_scorer(str(char_reward_dir), tokenizer=tiny_tokenizer),
        build_scorer(str(char_reward_dir), tokenizer=tiny_tokenizer),  # ppo, grpo, bon, chat
    ]
    for scorer in scorers:
        assert isinstance(scorer, RewardModelScorer) and scorer.tokenizer is not None
        torch.testing.assert_close(scorer(batch), expected, atol=1e-5, rtol=0)
    same = load_reward_scorer(str(char_reward_dir), own)  # the policy shares its tokenizer
    assert same.tokenizer is None


def test_the_text_path_runs_packed_as_padded(char_reward_dir, tiny_tokenizer):
    own = char_tokenizer()
    padded = RewardModel.from_pretrained(char_reward_dir).eval()
    packed = copy.deepcopy(padded)
    assert enable_packing(packed)  # as PPO and GRPO prepare a reward model (padding_free)
    batch = _score_input(tiny_tokenizer, PROMPTS, RESPONSES)
    expected = RewardModelScorer(padded, tokenizer=own)(batch)
    got = RewardModelScorer(packed, tokenizer=own)(batch)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_the_text_path_uses_the_reward_models_chat_template(char_reward_dir, tiny_tokenizer):
    own = char_tokenizer()
    own.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant: {% endif %}"
    )
    scorer = RewardModelScorer(RewardModel.from_pretrained(char_reward_dir), tokenizer=own)
    batch = _score_input(tiny_tokenizer, PROMPTS[:1], RESPONSES[:1])
    ids, mask = scorer._encode_texts(batch)
    text = own.decode(ids[0][mask[0] != 0])
    assert text == f"<s>user: {PROMPTS[0]}</s><s>assistant: {RESPONSES[0]}</s>"


class CharCount(torch.nn.Module):
    """A reward model over the character tokenizer: how many characters of the text are ones
    the policy's ``TARGETS`` tokens write and no prompt holds (a learnable score for PPO, read
    in another vocabulary)."""

    def __init__(self, own, policy_tokenizer):
        super().__init__()
        in_prompts = set("".join(tiny_corpus()))
        chars = {policy_tokenizer.decode([i]) for i in TARGETS} - in_prompts
        self.register_buffer("targets", torch.tensor(own.convert_tokens_to_ids(sorted(chars))))

    def forward(self, input_ids, attention_mask):
        return (torch.isin(input_ids, self.targets) & (attention_mask != 0)).sum(1).float()


def _ppo_config(tmp_path, **overrides):
    fields = dict(
        model="unused",
        train_data="unused",
        eval_data=None,
        output_dir=str(tmp_path / "run"),
        reward_model=None,
        reward_functions=["unused:unused"],
        max_steps=25,
        rollout_batch_size=32,
        batch_size=16,
        max_new_tokens=4,
        learning_rate=1e-3,
        lr_scheduler="constant",
        vf_coef=0.5,
        report_to=[],
        resume=False,
        seed=0,
        cpu=True,
    )
    return RLConfig(**{**fields, **overrides})


@pytest.mark.slow
def test_ppo_learns_from_a_reward_model_with_another_vocabulary(tiny_tokenizer, tmp_path):
    own = char_tokenizer()
    scorer = RewardModelScorer(CharCount(own, tiny_tokenizer), tokenizer=own)
    trainer = RLTrainer(
        _ppo_config(tmp_path),
        tiny_lm(tiny_tokenizer),
        tiny_tokenizer,
        tiny_prompts(tiny_tokenizer),
        scorer,
        reference=tiny_lm(tiny_tokenizer),
        critic=ValueModel(tiny_lm(tiny_tokenizer, seed=1).transformer),
    )
    reference_before = {k: v.clone() for k, v in trainer.models.reference.state_dict().items()}
    scores = [trainer.step()[0]["score/mean"] for _ in range(trainer.config.max_steps)]
    # target characters per response (of about 4); measured 0.06 -> 3.9 in 25 iterations
    assert sum(scores[:3]) / 3 < 0.5 and sum(scores[-3:]) / 3 > 2.5, scores
    after = trainer.models.reference.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in reference_before.items())


def test_ppo_refuses_a_critic_from_a_reward_model_with_another_tokenizer(
    char_reward_dir, tiny_model_dir, tiny_tokenizer, tmp_path
):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in tiny_corpus(40)))
    config = _ppo_config(
        tmp_path,
        model=str(tiny_model_dir),
        train_data=str(prompts),
        reward_model=str(char_reward_dir),
        reward_functions=[],
    )
    message = r"RLConfig.reward_model = .*tokenizer is not the policy's.*critic_model .*value_head"
    with pytest.raises(UsageError, match=message):
        RLTrainer.from_config(config)  # at start-up, before any model is loaded
    assert replace(config, critic="value_head").critic_start(tiny_tokenizer) is None
    fixed = replace(config, critic_model=str(tiny_model_dir))  # the critic starts from the policy
    assert fixed.critic_start(tiny_tokenizer) == str(tiny_model_dir)
    trainer = RLTrainer.from_config(fixed)
    assert trainer.scorer.tokenizer is not None  # the reward model still scores, from the texts


def test_eval_scores_and_measures_a_reward_model_with_its_own_tokenizer(
    char_reward_dir, tiny_model_dir, tmp_path
):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    comparisons = tmp_path / "comparisons.jsonl"
    rows = [{"prompt": p, "chosen": " It is good.", "rejected": " It is big."} for p in PROMPTS]
    comparisons.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = EvalConfig(
        models={"sft": str(tiny_model_dir)},
        reference=str(tiny_model_dir),
        reward_model=str(char_reward_dir),
        prompts=str(prompts),
        comparisons=str(comparisons),
        task=None,
        max_new_tokens=4,
        batch_size=4,
        best_of_n=[1, 2],
        output=str(tmp_path / "eval.json"),
    )
    table = evaluate(config)
    assert [r["model"] for r in table] == ["sft", "best-of-2"]
    assert all(isinstance(r["reward"], float) for r in table)
    assert json.loads((tmp_path / "eval.json").read_text())["reward_model"]["pairs"] == 4
