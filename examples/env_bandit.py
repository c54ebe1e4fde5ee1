"""Bandit episodes in a TextEnv: a prompt in, one response out, one reward back.

    python examples/env_bandit.py [--model PATH] [--episodes 6] [--seed 0]

This is InstructGPT's RL step seen as an environment loop, with the user's own toy reward:
"digits" counts the numbers in a continuation (``rlhfkit.tasks``). Next to the reward, ``info``
reports the response's -log perplexity under the same model, which is what falls when a policy
hacks the digits reward with "411 411 355 ...". The model defaults to the bundled base model.
"""

import argparse

from rlhfkit.experience.generation import SamplingConfig
from rlhfkit.experience.scorer_loading import reward_function_scorer
from rlhfkit.interact.env import LMAgent, TextEnv
from rlhfkit.tasks import BASE_MODEL_DIR

PROMPTS = ["In the year", "She counted the coins:", "The house stood at number", "It was"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(BASE_MODEL_DIR), help="causal LM checkpoint")
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    sampling = SamplingConfig(max_new_tokens=24, temperature=0.9)
    agent = LMAgent.from_pretrained(args.model, sampling=sampling, seed=args.seed)
    fluency = reward_function_scorer("perplexity", model=agent.model)
    digits = reward_function_scorer("digits")
    env = TextEnv(PROMPTS, digits, agent.tokenizer, metrics=[fluency])

    obs, info = env.reset(seed=args.seed)
    for episode in range(args.episodes):
        response = agent.generate(info["prompt"])  # the policy acts on the prompt
        _, reward, terminated, _, info = env.step(response)  # one response, one reward
        assert terminated  # bandit: every episode is one step
        details = ", ".join(f"{name} {value:.2f}" for name, value in info["scores"].items())
        print(f"episode {episode}: reward {reward:g} ({details})\n  {obs!r} -> {response!r}")
        obs, info = env.reset()


if __name__ == "__main__":
    main()
