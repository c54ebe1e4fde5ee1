"""One vocabulary for what scores a response: `reward_model` (a directory) and
`reward_functions` (names: the bundled tasks, perplexity, module:function) with
`reward_weights`, read the same way by ppo/grpo and by chat, sample and bon
(`RewardOptions.scorer`)."""

import pytest
import torch

from rlhfkit import trl_names
from rlhfkit.config import ConfigError, config_parser
from rlhfkit.errors import UsageError
from rlhfkit.experience.perplexity import PerplexityScorer
from rlhfkit.experience.scorer_loading import build_scorer, reward_function_scorer
from rlhfkit.experience.scorers import RewardModelScorer, ScoreInput, WeightedScorer
from rlhfkit.interact.chat import ChatConfig, SampleConfig
from rlhfkit.interact.sampling import BestOfNConfig
from rlhfkit.models.loading import RewardModel
from rlhfkit.tasks import BUNDLED_REWARDS, digits_score, gold_score
from rlhfkit.trainers.rl_config import RLConfig


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory, tiny_model_dir):
    path = tmp_path_factory.mktemp("reward_model")
    RewardModel.from_pretrained(tiny_model_dir).save_pretrained(path)
    return path


def _batch(responses: list[str]) -> ScoreInput:
    empty = torch.zeros(len(responses), 1, dtype=torch.long)
    return ScoreInput(["p"] * len(responses), responses, empty, empty, empty, empty)


@pytest.mark.parametrize(
    "make_config",
    [
        RLConfig,
        lambda **fields: RLConfig.preset("grpo", **fields),
        BestOfNConfig,
        lambda **fields: ChatConfig(model="m", **fields),
        lambda **fields: SampleConfig(model="m", prompt="hi", **fields),
    ],
    ids=["ppo", "grpo", "bon", "chat", "sample"],
)
def test_every_command_takes_the_bundled_names_and_weights(make_config):
    config = make_config(
        reward_model=None, reward_functions=["digits", "gold"], reward_weights=[1.0, 0.5]
    )
    scorer = config.scorer()  # as every command that scores builds it
    assert isinstance(scorer, WeightedScorer) and scorer.name == "1*digits + 0.5*gold"
    texts = ["12 and 7 and 3", "a fine happy day"]
    expected = [digits_score(t) + 0.5 * gold_score(t) for t in texts]
    torch.testing.assert_close(scorer(_batch(texts)), torch.tensor(expected))


def test_every_kind_of_name_resolves(tiny_model_dir, reward_model_dir, tiny_tokenizer):
    assert reward_function_scorer("sentiment").name == "sentiment"
    assert reward_function_scorer("rlhfkit.tasks:digits_reward").name.endswith("digits_reward")
    assert isinstance(reward_function_scorer(f"perplexity:{tiny_model_dir}"), PerplexityScorer)
    with pytest.raises(UsageError, match="'perplexity' needs a model here"):
        build_scorer(None, ["perplexity"])  # ppo/grpo: no policy to measure it under
    scorer = build_scorer(str(reward_model_dir), tokenizer=tiny_tokenizer)
    assert isinstance(scorer, RewardModelScorer)


def test_every_help_that_lists_the_bundled_names_lists_them_all():
    helps = {action.dest: action.help for action in config_parser(RLConfig)._actions}
    trl_note = trl_names.RL_SCRIPT_ARGUMENTS["reward_funcs"].note
    for text in (helps["reward_functions"], helps["gold_functions"], trl_note):
        assert [name for name in BUNDLED_REWARDS if name not in text] == [], text


def test_a_misplaced_or_unknown_name_says_what_is_allowed(reward_model_dir):
    with pytest.raises(UsageError, match="is a directory: give a reward model as reward_model"):
        build_scorer(None, [str(reward_model_dir)])
    with pytest.raises(
        UsageError, match=r"'golden': not a known scorer; allowed: calculator \| digits"
    ):
        build_scorer(None, ["golden"])


def test_commands_that_score_share_the_fields_and_their_checks():
    assert not ChatConfig(model="m").has_scorer  # chat and sample: a scorer is optional
    assert SampleConfig(model="m", prompt="hi", reward_functions=["gold"]).has_scorer
    with pytest.raises(ConfigError, match=r"ChatConfig.reward_weights = \[1.0, 2.0\]"):
        ChatConfig(model="m", reward_functions=["gold"], reward_weights=[1.0, 2.0])
    with pytest.raises(ConfigError, match="BestOfNConfig.reward_model = None is not allowed"):
        BestOfNConfig(reward_model=None)  # best-of-n needs something to pick by
    config = BestOfNConfig(reward_functions=["digits"], reward_weights=[1.0, 2.0])
    assert config.reward_model == "runs/rm/final"  # as PPO's default: the reward model
