"""TextEnv (bandit and chat modes, Gymnasium API), its PPO hooks, LMAgent and scorer_loading.parse_scorer."""

import copy

import pytest
import torch
from gymnasium.utils.env_checker import check_env
from transformers import AutoModelForCausalLM

from rlhfkit.data import encode_prompts
from rlhfkit.experience.generation import GenerationOutput, SamplingConfig
from rlhfkit.experience.perplexity import PerplexityScorer
from rlhfkit.experience.scorer_loading import parse_scorer
from rlhfkit.experience.scorers import FunctionScorer, RewardModelScorer
from rlhfkit.interact.env import LMAgent, TextEnv, encode_for_scoring
from rlhfkit.models.loading import RewardModel
from rlhfkit.tasks import digits_reward

PROMPTS = ["The cat likes", "A dog sees", "My friend reads"]


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory, tiny_model_dir):
    path = tmp_path_factory.mktemp("reward_model")
    RewardModel.from_pretrained(tiny_model_dir).save_pretrained(path)
    return path


def count_calls():
    """A reward function that records what it was given."""
    seen = []

    def reward(prompts, responses):
        seen.append((list(prompts), list(responses)))
        return [float(len(r)) for r in responses]

    return reward, seen


def test_bandit_episode(tiny_tokenizer):
    env = TextEnv(PROMPTS, digits_reward, tiny_tokenizer)
    obs, info = env.reset(seed=3)
    assert obs in PROMPTS and info == {"prompt": obs, "turn": 0, "messages": None}
    assert env.reset(seed=3)[0] == obs  # the seed fixes the prompt
    response = " 411 and 355 and 7."
    obs2, reward, terminated, truncated, info = env.step(response)
    assert (reward, terminated, truncated) == (3.0, True, False)
    assert info["prompt"] == obs and info["response"] == response
    assert info["scores"] == {"digits_reward": 3.0}
    assert obs2 == obs + response + tiny_tokenizer.eos_token  # what the scorer saw, EOS included
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("again")


def test_reset_draws_every_prompt_and_takes_one_as_option(tiny_tokenizer):
    env = TextEnv(PROMPTS, digits_reward, tiny_tokenizer)
    env.reset(seed=0)
    assert {env.reset()[0] for _ in range(40)} == set(PROMPTS)
    assert env.reset(options={"prompt": "Fixed"})[0] == "Fixed"


def test_scorer_sees_the_prompt_and_the_response(tiny_tokenizer):
    reward, seen = count_calls()
    env = TextEnv(PROMPTS, reward, tiny_tokenizer, metrics=[digits_reward])
    env.reset(options={"prompt": "A dog sees"})
    _, value, _, _, info = env.step(" 12 birds")
    assert seen == [(["A dog sees"], [" 12 birds"])]
    assert value == len(" 12 birds") and info["scores"] == {"reward": 9.0, "digits_reward": 1.0}


def test_chat_mode_keeps_history_and_truncates(tiny_tokenizer):
    reward, seen = count_calls()
    env = TextEnv(
        ["hi"], reward, tiny_tokenizer, user=lambda m: "more", max_turns=2, system="Be brief."
    )
    obs, info = env.reset(seed=0)
    assert obs == "System: Be brief.\nUser: hi\nAssistant:"
    assert (
        info["prompt"]
        == info["messages"]
        == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ]
    )
    obs, _, terminated, truncated, info = env.step("hello")
    assert (terminated, truncated, info["turn"]) == (False, False, 1)
    assert obs == "System: Be brief.\nUser: hi\nAssistant: hello\nUser: more\nAssistant:"
    assert [m["role"] for m in info["messages"]] == ["system", "user", "assistant", "user"]
    _, _, terminated, truncated, info = env.step("ok")
    assert (terminated, truncated, info["turn"]) == (False, True, 2)
    # Each reply is scored given the conversation before it.
    assert seen[1] == (
        ["System: Be brief.\nUser: hi\nAssistant: hello\nUser: more\nAssistant:"],
        [" ok"],
    )


def test_chat_mode_ends_when_the_user_does(tiny_tokenizer):
    env = TextEnv(["hi"], digits_reward, tiny_tokenizer, user=lambda m: None, max_turns=5)
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step("bye 2")
    assert (terminated, truncated) == (True, False)
    assert info["messages"][-1] == {"role": "assistant", "content": "bye 2"}


def test_chat_template_is_used_when_the_tokenizer_has_one(tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = (
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    env = TextEnv(["hi"], digits_reward, tokenizer, user=lambda m: "more")
    assert env.reset(seed=0)[0] == "[user] hi\n[assistant]"


def test_gymnasium_env_checker_passes(tiny_tokenizer):
    env = TextEnv(PROMPTS, digits_reward, tiny_tokenizer, max_length=64)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs) and env.action_space.contains("déjà vu ✓")


def test_hooks_give_ppo_the_same_tokens_and_rewards(tiny_tokenizer):
    env = TextEnv(PROMPTS, digits_reward, tiny_tokenizer)
    queries, _ = encode_prompts(env.prompt_records(), tiny_tokenizer, 64)
    batch = encode_for_scoring(tiny_tokenizer, PROMPTS, [" 1 2", " 3", " no"], 64)
    for row, ids in enumerate(queries):
        assert batch.query[row][batch.query_mask[row] != 0].tolist() == ids
    assert env.as_scorer()(batch).tolist() == [2.0, 1.0, 0.0]
    assert env.score(PROMPTS, [" 1 2", " 3", " no"]) == [2.0, 1.0, 0.0]


def test_reward_model_and_perplexity_rewards(tiny_tokenizer, tiny_model_dir, lm):
    reward_model = RewardModel.from_pretrained(tiny_model_dir).eval()
    env = TextEnv(PROMPTS, reward_model, tiny_tokenizer, metrics=[PerplexityScorer(lm)])
    env.reset(options={"prompt": "The cat likes"})
    _, value, _, _, info = env.step(" a red ball.")
    ids = tiny_tokenizer("The cat likes a red ball.")["input_ids"] + [tiny_tokenizer.eos_token_id]
    with torch.no_grad():
        expected = reward_model(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
        logits = lm(torch.tensor([ids])).logits[0, :-1]  # (T - 1, V) predicts ids[1:]
    assert value == pytest.approx(expected.item(), abs=1e-5)
    n_prompt = len(tiny_tokenizer("The cat likes")["input_ids"])
    token_logprobs = logits.log_softmax(-1)[torch.arange(len(ids) - 1), ids[1:]][n_prompt - 1 :]
    assert info["scores"]["neg_log_perplexity"] == pytest.approx(
        token_logprobs.mean().item(), abs=1e-5
    )


def test_agent_generates_text_from_text_or_messages(tiny_tokenizer, lm):
    agent = LMAgent(lm, tiny_tokenizer, SamplingConfig(max_new_tokens=6), seed=0)
    first = agent.generate("The cat likes")
    again = LMAgent(lm, tiny_tokenizer, SamplingConfig(max_new_tokens=6), seed=0)
    assert isinstance(first, str) and again.generate("The cat likes") == first
    query, mask = tiny_tokenizer(["The cat"], return_tensors="pt").values()
    out = agent._generate(query, mask)
    assert out.response.shape[1] <= 6 and out.response.dtype == torch.long


def test_agent_cuts_a_base_model_reply_at_the_next_speaker(tiny_tokenizer, lm):
    agent = LMAgent(lm, tiny_tokenizer)
    reply = tiny_tokenizer(" Fine, thanks.\nUser: and you?")["input_ids"]
    seen = []

    def fake_generate(input_ids, attention_mask):
        seen.append(tiny_tokenizer.decode(input_ids[0][attention_mask[0] != 0]))
        ids = torch.tensor([reply])
        return GenerationOutput(ids, torch.ones_like(ids), torch.tensor([False]))

    agent._generate = fake_generate
    assert agent.generate([{"role": "user", "content": "How are you?"}]) == "Fine, thanks."
    assert seen == ["User: How are you?\nAssistant:"]
    assert agent.generate("Say:") == " Fine, thanks.\nUser: and you?"  # plain text: untouched


def test_parse_scorer_specs(tiny_tokenizer, tiny_model_dir, reward_model_dir, lm):
    digits = parse_scorer("digits")
    assert isinstance(digits, FunctionScorer) and digits.name == "digits"
    assert parse_scorer("gold").name == "gold"
    assert isinstance(parse_scorer("perplexity", model=lm), PerplexityScorer)
    assert isinstance(parse_scorer(f"perplexity:{tiny_model_dir}"), PerplexityScorer)
    assert isinstance(
        parse_scorer(str(reward_model_dir), tokenizer=tiny_tokenizer), RewardModelScorer
    )
    with pytest.raises(ValueError, match="not a reward model .*no score_head.json"):
        parse_scorer(str(tiny_model_dir))  # a plain LM would score with a random head
    assert parse_scorer("rlhfkit.tasks:digits_reward").name == "rlhfkit.tasks:digits_reward"
    with pytest.raises(ValueError, match="needs a model"):
        parse_scorer("perplexity")
    with pytest.raises(
        ValueError, match=r"'nonsense': not a known scorer.*allowed: calculator \| digits"
    ):
        parse_scorer("nonsense")


def test_reward_model_with_another_vocabulary_and_no_tokenizer_is_rejected(
    tiny_tokenizer, reward_model_dir
):
    bigger = copy.deepcopy(tiny_tokenizer)
    bigger.add_tokens([f"<extra{i}>" for i in range(5)])
    with pytest.raises(ValueError, match="have no embedding.* save the tokenizer it was trained"):
        parse_scorer(str(reward_model_dir), tokenizer=bigger)


def test_scorer_names_must_be_distinct(tiny_tokenizer):
    with pytest.raises(ValueError, match="must be distinct"):
        TextEnv(PROMPTS, digits_reward, tiny_tokenizer, metrics=[digits_reward])
