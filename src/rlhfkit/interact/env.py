"""A Gymnasium text environment (a prompt in, a response out, a reward back) and an LM agent.

``TextEnv`` follows the Gymnasium API (``reset(seed=, options=) -> (obs, info)``,
``step(action) -> (obs, reward, terminated, truncated, info)``). The observation is the
conversation as the model reads it and the action is the response text. ``info["prompt"]`` is
the prompt as a record (text, or chat messages) that ``LMAgent.generate`` takes: from ``reset``
the one to answer, from ``step`` the one answered. In chat mode ``info["messages"]`` is always
the conversation the next response answers. Modes:

- bandit (default, InstructGPT's RL step): ``reset`` draws a prompt, ``step`` takes one
  response, returns its score and ends the episode (``terminated=True``);
- chat: give ``user``, a function from the conversation so far to the next user message
  (``None`` ends the conversation: ``terminated``). After ``max_turns`` responses the episode
  is cut (``truncated``). Each response earns its own reward, given the history before it.

With ``observation="reply"`` the observations are what the other side says instead of the
rendered conversation: ``reset`` gives the prompt (text, or chat messages) and ``step`` the
user's next message. That is what an RL stage's episodes read (``experience/episodes.py``),
so a ``TextEnv`` made by a function of no arguments trains as ``--environment
module:function``: the policy's turns and the user's in one sequence, each response's reward
summed into the episode's.

Texts are tokenised as for training (``data.encode_demonstrations``: the chat template where
the tokenizer has one, else "User: ...\\nAssistant:" and the response after a space, EOS
appended): a prompt becomes the very query ids PPO samples from, and scorers see the same kind
of batch as in a PPO rollout. ``prompt_records()`` and ``as_scorer()`` hand the environment's
prompts and reward to PPO / GRPO::

    prompts, _ = encode_prompts(env.prompt_records(), tokenizer, max_prompt_length)
    RLTrainer(..., prompts=prompts, scorer=env.as_scorer())

``LMAgent`` is the policy side, split as in the user's own environment: ``generate(prompt)``
renders the conversation and decodes the answer; ``_generate(input_ids, attention_mask)`` maps
ids to response ids with ``generation.generate`` (KV cache, stop at EOS).

Command-line reward specs ("digits", "gold", "perplexity", a reward model directory,
"module:function") become scorers with ``scorer_loading.parse_scorer``.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium
import torch
from gymnasium.spaces import Text

from rlhfkit.data import (
    IGNORE_INDEX,
    Demonstration,
    Message,
    Prompt,
    PromptRecord,
    encode_demonstrations,
    encode_prompts,
    load_records,
    pad,
    template_takes_tools,
)
from rlhfkit.experience.generation import GenerationOutput, SamplingConfig, generate
from rlhfkit.experience.scorers import ScoreInput, Scorer, as_scorer
from rlhfkit.experience.tools import Tool, tools_prompt
from rlhfkit.models.loading import load_causal_lm, load_tokenizer, model_device

MAX_TEXT_CHARS = 1 << 16  # bound of the Text spaces; any conversation that fits a model does
DEFAULT_MAX_LENGTH = 1024  # tokens, when the tokenizer's model_max_length is unset (huge)
SPEAKER_LABEL = re.compile(r"\n(?:User|Assistant|System):")  # plain rendering, see LMAgent


class AnyText(Text):
    """A ``Text`` space that contains any string up to ``max_length`` characters.

    Gymnasium's ``Text`` needs a finite charset, but model output may hold any Unicode
    character. The charset (printable ASCII) is used for ``sample()`` only.
    """

    def __init__(self, max_length: int = MAX_TEXT_CHARS):
        super().__init__(max_length, min_length=0, charset=string.printable)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length


def token_budget(tokenizer) -> int:
    """Prompt + response tokens a scorer sees: the tokenizer's limit, if it sets one."""
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and limit < 1_000_000 else DEFAULT_MAX_LENGTH


# --------------------------------------------------------------------------- scoring texts
def encode_for_scoring(
    tokenizer,
    prompts: Sequence[Prompt],
    responses: Sequence[str],
    max_length: int,
    device: torch.device | str = "cpu",
) -> ScoreInput:
    """A ``ScoreInput`` for text prompts and responses, tokenised as for training.

    Each response gets EOS (a finished answer); prompt + response are truncated to
    ``max_length`` tokens as ``data.encode_demonstrations`` does. ``prompts`` / ``responses``
    are the decoded ids, special tokens removed, as ``rollout`` gives them to scorers. The
    tensors go to ``device``, where the scorers' models are.
    """
    records = [Demonstration(p, r) for p, r in zip(prompts, responses, strict=True)]
    examples, _ = encode_demonstrations(records, tokenizer, max_length)
    # Labels are -100 exactly on the prompt tokens: that is where the response starts.
    splits = [sum(label == IGNORE_INDEX for label in e.labels) for e in examples]
    query_ids = [e.input_ids[:n] for e, n in zip(examples, splits, strict=True)]
    response_ids = [e.input_ids[n:] for e, n in zip(examples, splits, strict=True)]
    query, query_mask = pad(query_ids, tokenizer.pad_token_id, side="left")  # (B, Tq)
    response, response_mask = pad(response_ids, tokenizer.pad_token_id, side="right")  # (B, Tr)
    return ScoreInput(
        prompts=tokenizer.batch_decode(query_ids, skip_special_tokens=True),
        responses=tokenizer.batch_decode(response_ids, skip_special_tokens=True),
        query=query.to(device),
        query_mask=query_mask.to(device),
        response=response.to(device),
        response_mask=response_mask.to(device),
        eos_token_id=tokenizer.eos_token_id,
    )


def score_texts(
    scorer: Scorer,
    tokenizer,
    prompts: Sequence[Prompt],
    responses: Sequence[str],
    max_length: int,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``scorer`` on text prompts and responses -> scores (B,)."""
    return scorer(encode_for_scoring(tokenizer, prompts, responses, max_length, device))


# --------------------------------------------------------------------------- environment
class TextEnv(gymnasium.Env):
    """Prompts in, responses out, a scorer's reward back (see the module docstring).

    Args:
        prompts: prompts to draw from at ``reset``: strings (plain text to continue) or chat
            messages ``[{"role": "user", "content": ...}]``, as ``data.PromptRecord.prompt``.
        reward: the reward: a ``scorers.Scorer``, a reward model (``nn.Module``) or a Python
            function ``f(prompts, responses) -> list[float]`` (see ``rewards.as_scorer``).
        tokenizer: the policy's tokenizer (with a distinct pad token, ``models.load_tokenizer``).
        metrics: more scorers, reported in ``info["scores"]`` next to the reward.
        user: chat mode: the next user message given the conversation, or None to end it.
        max_turns: chat mode: responses per episode before it is truncated.
        system: a system message put first in every conversation (chat mode, or chat prompts).
        max_length: token budget of prompt + response (default: the tokenizer's limit).
        device: where the scorers' models are (the token batches are put there).
        observation: "conversation" (the conversation as the model reads it) or "reply" (the
            prompt, then each next user message: what an RL stage's episodes read).
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        prompts: Sequence[Prompt],
        reward: Scorer | torch.nn.Module | Callable,
        tokenizer,
        *,
        metrics: Sequence[Scorer | Callable] = (),
        user: Callable[[list[Message]], str | None] | None = None,
        max_turns: int = 4,
        system: str | None = None,
        max_length: int | None = None,
        device: torch.device | str = "cpu",
        render_mode: str | None = None,
        observation: str = "conversation",
    ):
        if not prompts:
            raise ValueError("TextEnv: prompts is empty; give at least one prompt")
        if max_turns < 1:
            raise ValueError(f"TextEnv: max_turns={max_turns}, allowed: >= 1")
        if observation not in ("conversation", "reply"):
            raise ValueError(
                f"TextEnv: observation={observation!r}, allowed: 'conversation', 'reply'"
            )
        if render_mode not in (None, "ansi"):
            raise ValueError(f"TextEnv: render_mode={render_mode!r}, allowed: None, 'ansi'")
        self.prompts = list(prompts)
        self.reward = as_scorer(reward)
        self.metrics = [as_scorer(m) for m in metrics]
        names = [s.name for s in [self.reward, *self.metrics]]
        if len(set(names)) != len(names):
            raise ValueError(f"TextEnv: scorer names {names} must be distinct (info['scores'])")
        self.tokenizer = tokenizer
        self.user, self.max_turns, self.system = user, max_turns, system
        self.max_length = max_length or token_budget(tokenizer)
        self.device = device
        self.render_mode = render_mode
        self.observation = observation
        self.observation_space = AnyText()
        self.action_space = AnyText()
        self._prompt: Prompt | None = None  # the conversation the next response answers
        self._turn = 0
        self._done = True
        self._text = ""

    @classmethod
    def from_dataset(cls, source: str | Path, *args, split: str = "train", **kwargs) -> TextEnv:
        """Prompts from any source ``data.load_records(source, "prompts")`` reads."""
        prompts = [r.prompt for r in load_records(source, "prompts", split=split)]
        return cls(prompts, *args, **kwargs)

    @property
    def chat(self) -> bool:
        return self.user is not None

    def _start(self, prompt: Prompt) -> Prompt:
        """The conversation an episode starts from: chat mode always speaks in messages."""
        if isinstance(prompt, str) and not self.chat:
            return prompt
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if self.system is not None and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": self.system}, *messages]
        return [dict(m) for m in messages]

    def _observe(self, prompt: Prompt) -> str:
        """The prompt as the model reads it (rendered, truncated), special tokens kept."""
        (ids,), _ = encode_prompts([PromptRecord(prompt)], self.tokenizer, self.max_length)
        return self.tokenizer.decode(ids)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode with a random prompt, or ``options={"prompt": ...}``."""
        super().reset(seed=seed)
        options = options or {}
        prompt = options.get("prompt")
        if prompt is None:
            prompt = self.prompts[int(self.np_random.integers(len(self.prompts)))]
        self._prompt, self._turn, self._done = self._start(prompt), 0, False
        self._text = self._observe(self._prompt)
        messages = [dict(m) for m in self._prompt] if self.chat else None
        observed = self._prompt if self.observation == "reply" else self._text
        return observed, {"prompt": self._prompt, "turn": 0, "messages": messages}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Score ``action`` as the answer to the current conversation; see the class doc."""
        if self._done:
            raise RuntimeError("TextEnv.step: the episode is over (or never started); reset()")
        if not isinstance(action, str):
            raise TypeError(f"TextEnv.step: action must be the response text, got {type(action)}")
        prompt, self._turn = self._prompt, self._turn + 1
        batch = encode_for_scoring(self.tokenizer, [prompt], [action], self.max_length, self.device)
        scores = {s.name: float(s(batch)[0]) for s in [self.reward, *self.metrics]}
        info = {"prompt": prompt, "response": action, "scores": scores, "turn": self._turn}
        terminated, truncated = self._advance(prompt, action)
        self._done = terminated or truncated
        if self._done:
            # The final observation is the whole exchange, exactly as the scorers saw it.
            ids = torch.cat(
                [batch.query[batch.query_mask != 0], batch.response[batch.response_mask != 0]]
            )
            self._text = self.tokenizer.decode(ids)
        else:
            self._text = self._observe(self._prompt)
        info["messages"] = [dict(m) for m in self._prompt] if self.chat else None
        observed = self._text
        if self.observation == "reply":
            observed = "" if self._done else self._prompt[-1]["content"]
        return observed, scores[self.reward.name], terminated, truncated, info

    def _advance(self, prompt: Prompt, action: str) -> tuple[bool, bool]:
        """Append the response (and the user's next message) -> (terminated, truncated)."""
        if not self.chat:
            return True, False
        self._prompt = [*prompt, {"role": "assistant", "content": action}]
        if self._turn >= self.max_turns:
            return False, True
        follow_up = self.user(list(self._prompt))
        if follow_up is None:
            return True, False
        self._prompt.append({"role": "user", "content": follow_up})
        return False, False

    def render(self) -> str | None:
        """The current observation text (``render_mode="ansi"``)."""
        return self._text if self.render_mode == "ansi" else None

    # ---- hooks for PPO / GRPO
    def prompt_records(self) -> list[PromptRecord]:
        """Every prompt as an episode would start from it, for ``data.encode_prompts``."""
        return [PromptRecord(self._start(p)) for p in self.prompts]

    def as_scorer(self) -> Scorer:
        """The reward as a ``scorers.Scorer`` on token batches (what ``step`` returns)."""
        return self.reward

    def score(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> list[float]:
        """Rewards of text responses to text (or chat) prompts, as a batch."""
        scores = score_texts(
            self.reward, self.tokenizer, prompts, responses, self.max_length, self.device
        )
        return scores.tolist()


# --------------------------------------------------------------------------- agent
class LMAgent:
    """A causal LM that answers a conversation: ``generate`` (text) over ``_generate`` (ids).

    Rendering is ``data.encode_prompts``'s: the chat template when the tokenizer has one, else
    "System: ...\\nUser: ...\\nAssistant:". A plain base model then tends to write the next
    turn itself, so in that rendering the reply is cut at the next speaker label
    ("\\nUser:", "\\nAssistant:", "\\nSystem:"). String prompts are continued as they are.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        sampling: SamplingConfig | None = None,
        *,
        seed: int | None = None,
        max_prompt_length: int | None = None,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.tools: list[dict] | None = None  # schemas for a chat template that takes them
        self.sampling = sampling or SamplingConfig()
        self.device = model_device(model)
        self.generator = None
        if seed is not None:
            self.generator = torch.Generator(self.device).manual_seed(seed)
        positions = getattr(model.config, "max_position_embeddings", None) or DEFAULT_MAX_LENGTH
        # The prompt keeps its end (the latest turns) and leaves room for the reply.
        self.max_prompt_length = max_prompt_length or positions - self.sampling.max_new_tokens
        if self.max_prompt_length < 1:
            raise ValueError(
                f"max_new_tokens={self.sampling.max_new_tokens} leaves no room for a prompt in "
                f"the model's {positions} positions"
            )

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs) -> LMAgent:
        """Load the tokenizer and causal LM of a checkpoint (directory or hub name)."""
        tokenizer = load_tokenizer(path)
        model = load_causal_lm(path, tokenizer=tokenizer).eval()
        return cls(model, tokenizer, **kwargs)

    def show_tools(self, tools: list[Tool], system: str | None, template: str | None) -> str | None:
        """Show ``tools`` to the model in every prompt: through its chat template where that
        takes them, else in the system message returned (``tools.tools_prompt``, with
        ``template`` its text, before ``system``)."""
        if template_takes_tools(self.tokenizer):
            self.tools = [tool.schema for tool in tools]
            return system
        shown = tools_prompt(tools, template)
        return shown if system is None else f"{shown}\n\n{system}"

    def generate(self, prompt: Prompt) -> str:
        """The reply to ``prompt`` (a string to continue, or chat messages) as text."""
        (ids,), _ = encode_prompts(
            [PromptRecord(prompt)], self.tokenizer, self.max_prompt_length, tools=self.tools
        )
        query, query_mask = pad([ids], self.tokenizer.pad_token_id, side="left")  # (1, Tq)
        out = self._generate(query.to(self.device), query_mask.to(self.device))
        text = self.tokenizer.decode(
            out.response[0][out.response_mask[0] != 0], skip_special_tokens=True
        )
        if isinstance(prompt, str):
            return text
        if not getattr(self.tokenizer, "chat_template", None):
            text = SPEAKER_LABEL.split(text, maxsplit=1)[0]
        return text.strip()

    def _generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> GenerationOutput:
        """Left-padded prompt ids (B, Tq) -> sampled ``response`` (B, Tr) and its mask."""
        return generate(
            self.model,
            input_ids,
            attention_mask,
            self.sampling,
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
            generator=self.generator,
        )
