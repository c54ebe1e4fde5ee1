"""The guessing game: a Gymnasium text environment that answers every turn.

The environment thinks of a whole number between 1 and ``highest`` (the ``secret`` column of
the prompt's row, else one drawn from the reset's seed; the range is the row's ``highest``
column where it has one, so that one dataset can hold a small game) and tells the policy, after each
guess, "Higher." or "Lower."; a guess that is right ends the episode with reward
``1 - TURN_COST x (guesses - 1)``, so that finding it in fewer turns is worth more. A reply
without a number is answered with a reminder and counts as a turn. After ``max_guesses``
guesses the episode is cut (``truncated``) with reward 0. Halving the range each turn finds
any secret of 1 to 100 within 7 guesses; the SFT demonstrations (``scripts/make_tool_data.py``)
play that way from random first guesses, so that RL has something left to learn; those of the
small game for the bundled tiny model guess at random and never listen, so that RL must teach
it to read the replies.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import Any

import gymnasium
import numpy as np

HIGHEST = 100
TURN_COST = 0.1
NUMBER = re.compile(r"-?\d+")


def prompt_of(highest: int = HIGHEST) -> str:
    """The game's first message, for a secret between 1 and ``highest``."""
    return (
        f"I am thinking of a whole number between 1 and {highest}. Guess it! After each guess I "
        "will say whether my number is higher or lower. Reply with your guess only."
    )


PROMPT = prompt_of()


class GuessingGame(gymnasium.Env):
    """Guess the number (see the module docstring); observations and actions are text."""

    def __init__(self, max_guesses: int = 10, highest: int = HIGHEST):
        self.max_guesses, self.highest = max_guesses, highest
        self.secret = 0
        self.guesses = 0
        self.solved = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = options or {}
        self.highest = int(options.get("highest", self.highest))
        secret = options.get("secret")
        self.secret = (
            int(secret) if secret is not None else int(self.np_random.integers(1, self.highest + 1))
        )
        self.guesses, self.solved = 0, False
        return options.get("prompt", prompt_of(self.highest)), {"secret": self.secret}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.guesses += 1
        found = NUMBER.search(action)
        info = {"secret": self.secret, "guesses": self.guesses}
        if found is None:
            reply, solved = "Please reply with a whole number.", False
        else:
            guess = int(found.group())
            solved = guess == self.secret
            reply = "Higher." if guess < self.secret else "Lower."
        if solved:
            self.solved = True
            return "Correct!", 1.0 - TURN_COST * (self.guesses - 1), True, False, info
        return reply, 0.0, False, self.guesses >= self.max_guesses, info


def solved(prompts, completions, environments, **kwargs) -> list[float]:
    """1 for a game the policy won, else 0: the game's success rate, as a reward function
    (TRL's way: it reads the episodes' environments)."""
    return [float(env.solved) for env in environments]


def halving_game(secret: int, rng: random.Random, highest: int = HIGHEST) -> list[int]:
    """The guesses of a player who halves the range each turn after a random first guess."""
    low, high = 1, highest
    guess = rng.randint(low, high)
    guesses = [guess]
    while guess != secret:
        low, high = (guess + 1, high) if guess < secret else (low, guess - 1)
        guess = (low + high) // 2
        guesses.append(guess)
    return guesses


def random_game(
    secret: int, rng: random.Random, highest: int = HIGHEST, max_guesses: int = 10
) -> list[int]:
    """The guesses of a player who guesses at random and never listens, until it finds the
    secret or has made ``max_guesses``."""
    guesses = [rng.randint(1, highest)]
    while guesses[-1] != secret and len(guesses) < max_guesses:
        guesses.append(rng.randint(1, highest))
    return guesses


def secrets(count: int, seed: int, highest: int = HIGHEST) -> Iterator[dict]:
    """``count`` games as prompt records with their ``secret`` (and, for another range than
    the default, ``highest``) column."""
    rng = np.random.default_rng(seed)
    for secret in rng.integers(1, highest + 1, size=count):
        game = {"highest": highest} if highest != HIGHEST else {}
        yield {"prompt": prompt_of(highest), "secret": int(secret), **game}
