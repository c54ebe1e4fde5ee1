"""Episodes: the policy's turns and an environment's answers, one token sequence each.

An environment is a Gymnasium environment whose actions and observations are text, one per
episode, made by a factory (a class, or any function of no arguments):

- ``reset(seed=, options={"prompt": ..., **columns})`` -> ``(observation, info)``: the data's
  prompt as written and its row's other columns come in ``options``; the observation is the
  prompt the policy answers first (a string, or chat messages, as a prompt record's);
- ``step(text)`` -> ``(observation, reward, terminated, truncated, info)``: ``text`` is the
  policy's turn (special tokens removed); the observation is the environment's reply, a
  string (one message from the user), a message dict, or a list of them (a tool's results
  have role "tool"). ``info`` may count ``tool_calls`` and ``tool_errors`` (by kind).

An environment that calls the policy's tools is ``ToolEnv``; an object without ``step`` whose
public methods are tools (TRL's ``environment_factory``) is made one. An environment may name
its tools (``tools``, a list of ``tools.Tool``): they are shown to the policy in the prompt, by
the chat template where it takes tools, else by ``tools.TOOLS_SYSTEM_PROMPT``.

``run_episodes`` plays a batch of episodes turn by turn, all the unfinished ones sampled
together (a finished episode leaves the batch). Each turn appends the policy's tokens (its
``response_mask`` is 1 there) and then the environment's (``env_mask``; rendered by
``data.encode_turn`` as the chat template continues a conversation), so that one forward
pass over query + response gives every turn's log-probs with the same context the policy
sampled them in. An episode ends when the environment says so (``terminated``, or its own
``truncated``), when a turn runs out of tokens before EOS, at ``max_turns`` policy turns, or
when the next turn would pass ``max_episode_tokens`` (the last three ``truncated``). The
episode's reward is the sum of the environment's rewards (plus the scorer's, added by
``ExperienceMaker``). Episodes of one turn give exactly the bandit rollout.

Departures: no KV cache is kept between turns (each turn's prompt is prefilled again); the
environment's tokens are tokenised from its text, not sampled, so a token boundary after the
policy's EOS is the template's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import torch

from rlhfkit.data import (
    Message,
    Prompt,
    PromptColumns,
    PromptRecord,
    encode_prompts,
    encode_turn,
    pad,
    template_takes_tools,
)
from rlhfkit.errors import RunError, UsageError
from rlhfkit.experience.generation import GenerationOutput
from rlhfkit.experience.scorer_loading import load_function
from rlhfkit.experience.tools import (
    ERROR_KINDS,
    Tool,
    parse_tool_calls,
    public_methods,
    tool_message,
    tools_prompt,
)

# what each episode did, by name: policy turns, tool calls, failed tool calls (all, and of
# each kind), 1 where it was cut short, the environment's tokens, the tools it was offered
EPISODE_STATS = (
    "turns",
    "tool_calls",
    "tool_errors",
    *(f"tool_errors/{kind}" for kind in ERROR_KINDS),
    "truncated",
    "env_tokens",
    "tools",
)


def shown_stats(stats: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The episode statistics a person reads (the metrics, the results table): the tool
    figures only where the episodes had tools (offered, or calls their environment counted),
    and not the number of tools itself."""
    tools = any(bool(stats[k].any()) for k in ("tools", "tool_calls", "tool_errors") if k in stats)
    return {
        key: values
        for key, values in stats.items()
        if key != "tools" and (tools or not key.startswith("tool_"))
    }


class EpisodeError(RunError):
    """An environment failed during an episode; the message names the episode's prompt."""


@dataclass
class EpisodeSettings:
    """How episodes run (each RL config fills it from its episode options).

    Attributes:
        max_turns: policy turns per episode, the last one the answer.
        max_episode_tokens: the policy's and the environment's tokens of an episode together
            (None: only ``max_turns`` x the turn's ``max_new_tokens`` and the replies bound it).
        max_prompt_length: tokens of the first prompt, its start cut beyond.
        tools_prompt: the system prompt that shows the tools where the chat template takes
            none, with ``{tools}`` where their schemas go (``tools.tools_prompt``); None: the
            default.
    """

    max_turns: int = 4
    max_episode_tokens: int | None = None
    max_prompt_length: int = 512
    tools_prompt: str | None = None


class ToolEnv(gymnasium.Env):
    """The environment of a policy with tools: each turn's tool calls run (``tools.py``) and
    their results come back as "tool" messages; a turn without a call is the answer and ends
    the episode. Its reward is 0: the scorer judges the answer.

    ``state``: an object written for TRL's ``environment_factory`` whose public methods are
    the tools; its ``reset(**columns)``, if it has one, is called at each reset with the
    row's columns, and a string it returns is added to the prompt's last message. Reward
    functions that take ``environments`` get these objects.
    """

    def __init__(
        self,
        tools: Sequence[Callable[..., Any] | Tool],
        timeout: float = 10.0,
        state: object | None = None,
    ):
        self.tools = [t if isinstance(t, Tool) else Tool.of(t) for t in tools]
        self.by_name = {tool.name: tool for tool in self.tools}
        self.timeout = timeout
        self.state = state

    @classmethod
    def of(cls, state: object, timeout: float = 10.0) -> ToolEnv:
        """The environment of an object whose public methods are tools."""
        return cls(public_methods(state), timeout, state)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = dict(options or {})
        prompt = options.pop("prompt")
        added = getattr(self.state, "reset", None)
        added = added(**options) if added is not None else None
        if isinstance(added, str) and added:
            prompt = _appended(prompt, added)
        return prompt, {}

    def step(self, action: str):
        calls = parse_tool_calls(action)
        if not calls:
            return "", 0.0, True, False, {"tool_calls": 0}
        messages, errors = [], Counter()
        for call in calls:
            content, kind = tool_message(self.by_name, call, self.timeout)
            messages.append({"role": "tool", "content": content})
            if kind is not None:
                errors[kind] += 1
        return messages, 0.0, False, False, {"tool_calls": len(calls), "tool_errors": errors}


def _appended(prompt: Prompt, text: str) -> Prompt:
    """``prompt`` with ``text`` after its (last message's) content."""
    if isinstance(prompt, str):
        return f"{prompt}\n\n{text}"
    last = dict(prompt[-1])
    last["content"] = f"{last['content']}\n\n{text}"
    return [*prompt[:-1], last]


def environment_factory(
    environment: str | None = None, tools: Sequence[str] = (), tool_timeout: float = 10.0
) -> Callable[[], gymnasium.Env] | None:
    """What makes an episode's environment from a config's ``environment`` ("module:Class",
    a Gymnasium text environment or an object whose methods are tools) or ``tools``
    ("module:function" each); None for neither (one prompt, one response)."""
    if environment and tools:
        raise UsageError(
            "give tools or an environment, not both: an environment's own tools are its "
            "public methods"
        )
    if tools:
        functions = [Tool.of(load_function(spec, "tool")) for spec in tools]
        return lambda: ToolEnv(functions, tool_timeout)
    if environment:
        factory = load_function(environment, "environment")
        return lambda: as_environment(factory(), tool_timeout)
    return None


def as_environment(made: object, tool_timeout: float = 10.0) -> gymnasium.Env:
    """``made`` itself where it steps (a Gymnasium environment), else the ``ToolEnv`` of its
    public methods."""
    if callable(getattr(made, "step", None)) and callable(getattr(made, "reset", None)):
        return made
    return ToolEnv.of(made, tool_timeout)


@dataclass
class Episode:
    """One episode as it is played: its ids so far and what it did."""

    env: Any
    prompt: Prompt  # as the environment gave it
    query: list[int]
    messages: list[Message] = field(default_factory=list)  # after the prompt
    response: list[int] = field(default_factory=list)
    policy: list[int] = field(default_factory=list)  # 1 for the policy's ids of ``response``
    answer: str = ""  # the policy's last turn
    env_reward: float = 0.0
    eos: bool = False
    done: bool = False
    stats: Counter = field(default_factory=Counter)

    def finish(self, truncated: bool = False) -> None:
        self.done = True
        self.stats["truncated"] = int(truncated)

    def add(self, ids: list[int], policy: bool) -> None:
        self.response += ids
        self.policy += [int(policy)] * len(ids)


@dataclass
class EpisodeOutput(GenerationOutput):
    """A batch of finished episodes as a rollout reads them: ``response`` holds every turn,
    ``response_mask`` the policy's tokens, ``env_mask`` the environment's."""

    query: torch.Tensor  # (B, Tq) the first prompt, left-padded
    query_mask: torch.Tensor  # (B, Tq)
    env_mask: torch.Tensor  # (B, Tr) 1 for the environment's tokens
    env_rewards: torch.Tensor  # (B,) the sum of the environment's rewards
    stats: dict[str, torch.Tensor]  # (B,) each, by ``EPISODE_STATS``' names
    answers: list[str]  # the policy's last turn of each episode
    completions: list[list[Message]]  # each episode's messages after the prompt
    environments: list[Any]  # the B environments, finished


def run_episodes(
    sample: Callable[[torch.Tensor, torch.Tensor, int], GenerationOutput],
    tokenizer,
    factory: Callable[[], gymnasium.Env],
    starts: PromptColumns,
    seeds: Sequence[int],
    settings: EpisodeSettings,
    max_new_tokens: int,
    device: torch.device,
) -> EpisodeOutput:
    """Play one episode per row of ``starts`` (the prompts as written and their columns), its
    environment reset with ``seeds[i]``, turn by turn until every one is over.

    ``sample(query, query_mask, max_new_tokens)`` samples one turn of the policy for
    left-padded prompts (B, Tq); a turn has at most ``max_new_tokens`` tokens, fewer where
    the episode's budget has fewer left."""
    episodes = _start(factory, starts, seeds, tokenizer, settings)
    while active := [e for e in episodes if not e.done]:
        budget = min(max_new_tokens, max(_tokens_left(e, settings) for e in active))
        contexts = [e.query + e.response for e in active]
        query, query_mask = pad(contexts, tokenizer.pad_token_id, side="left")  # (b, T)
        out = sample(query.to(device), query_mask.to(device), budget)
        for row, episode in enumerate(active):
            ids = out.response[row][out.response_mask[row] != 0].tolist()
            ids = ids[: _tokens_left(episode, settings)]
            eos = bool(ids) and ids[-1] == tokenizer.eos_token_id
            _policy_turn(episode, ids, eos, tokenizer, settings)
    return _output(episodes, tokenizer, device)


def _start(factory, starts: PromptColumns, seeds, tokenizer, settings) -> list[Episode]:
    """A fresh environment for each row of ``starts``, reset with its seed, and the ids of
    the prompt it gives, with the tools it names shown; one tokenisation per set of tools."""
    shown, tools_of, offered_tools = [], [], []
    templated = template_takes_tools(tokenizer)
    for row, (prompt, seed) in enumerate(zip(starts.prompts, seeds, strict=True)):
        env = factory()
        options = {"prompt": prompt, **{k: v[row] for k, v in starts.columns.items()}}
        observation, _ = _call(env.reset, prompt, seed=seed, options=options)
        tools = list(getattr(env, "tools", None) or [])
        offered_tools.append(len(tools))
        if tools:
            if isinstance(observation, str):
                observation = [{"role": "user", "content": observation}]
            if not templated:
                observation = _with_system(observation, tools_prompt(tools, settings.tools_prompt))
        shown.append((env, observation))
        tools_of.append(tools if templated else [])
    ids: list[list[int]] = [[] for _ in shown]
    names = [tuple(tool.name for tool in tools) for tools in tools_of]
    for group in dict.fromkeys(names):
        rows = [i for i, name in enumerate(names) if name == group]
        records = [PromptRecord(shown[i][1]) for i in rows]
        schemas = [tool.schema for tool in tools_of[rows[0]]] or None
        encoded, _ = encode_prompts(records, tokenizer, settings.max_prompt_length, tools=schemas)
        for i, row_ids in zip(rows, encoded, strict=True):
            ids[i] = row_ids
    episodes = [
        Episode(env, observation, row) for (env, observation), row in zip(shown, ids, strict=True)
    ]
    for episode, offered in zip(episodes, offered_tools, strict=True):
        episode.stats["tools"] = offered
    return episodes


def _with_system(messages: list[Message], text: str) -> list[Message]:
    """``messages`` with ``text`` as (the start of) their system message."""
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{text}\n\n{messages[0]['content']}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _tokens_left(episode: Episode, settings: EpisodeSettings) -> int:
    if settings.max_episode_tokens is None:
        return 1 << 30
    return settings.max_episode_tokens - len(episode.response)


def _policy_turn(episode: Episode, ids: list[int], eos: bool, tokenizer, settings) -> None:
    """The policy's turn ``ids`` added to ``episode``, then the environment's answer to it,
    or the episode's end."""
    episode.add(ids, policy=True)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    episode.messages.append({"role": "assistant", "content": text})
    episode.answer, episode.eos = text, eos
    episode.stats["turns"] += 1
    if not eos:  # out of tokens mid-turn
        episode.finish(truncated=True)
        return
    observation, reward, terminated, truncated, info = _call(episode.env.step, episode.prompt, text)
    episode.env_reward += float(reward)
    episode.stats["tool_calls"] += int(info.get("tool_calls", 0))
    for kind, count in dict(info.get("tool_errors", {})).items():
        episode.stats["tool_errors"] += count
        episode.stats[f"tool_errors/{kind}"] += count
    if terminated or truncated:
        episode.finish(truncated=truncated and not terminated)
        return
    if episode.stats["turns"] >= settings.max_turns:
        episode.finish(truncated=True)
        return
    messages = _as_messages(observation)
    reply = encode_turn(messages, tokenizer)
    if len(reply) + 1 > _tokens_left(episode, settings):  # no room for a turn after it
        episode.finish(truncated=True)
        return
    episode.add(reply, policy=False)
    episode.messages += messages
    episode.stats["env_tokens"] += len(reply)


def _as_messages(observation: object) -> list[Message]:
    """An environment's reply as messages: a string is the user's."""
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    if isinstance(observation, dict):
        return [observation]
    if isinstance(observation, list) and all(isinstance(m, dict) for m in observation):
        return observation
    raise EpisodeError(
        f"an environment's observation must be a string, a message dict or a list of them; "
        f"got {type(observation).__name__}"
    )


def _call(method, about: object, *args, **kwargs):
    """``method`` of an environment, its failure an ``EpisodeError`` naming the episode."""
    try:
        return method(*args, **kwargs)
    except Exception as error:
        owner = type(getattr(method, "__self__", method)).__name__
        raise EpisodeError(
            f"environment {owner}.{method.__name__} raised {type(error).__name__}: {error} "
            f"in the episode of prompt {str(about)[:80]!r}"
        ) from error


def _output(episodes: list[Episode], tokenizer, device) -> EpisodeOutput:
    """The finished ``episodes`` as padded tensors."""
    pad_id = tokenizer.pad_token_id
    query, query_mask = pad([e.query for e in episodes], pad_id, side="left")  # (B, Tq)
    response, attention = pad([e.response for e in episodes], pad_id, side="right")  # (B, Tr)
    policy, _ = pad([e.policy for e in episodes], 0, side="right")  # (B, Tr)
    response_mask = (policy * attention).long()
    env_mask = ((1 - policy) * attention).long()
    stats = {
        name: torch.tensor([float(e.stats[name]) for e in episodes], device=device)
        for name in EPISODE_STATS
    }
    return EpisodeOutput(
        response=response.to(device),
        response_mask=response_mask.to(device),
        eos_emitted=torch.tensor([e.eos for e in episodes], device=device),
        query=query.to(device),
        query_mask=query_mask.to(device),
        env_mask=env_mask.to(device),
        env_rewards=torch.tensor([e.env_reward for e in episodes], device=device),
        stats=stats,
        answers=[e.answer for e in episodes],
        completions=[e.messages for e in episodes],
        environments=[e.env for e in episodes],
    )


def transcript(completion: Sequence[Message]) -> str:
    """An episode's messages after the prompt as one text, each turn under its role."""
    return "\n\n".join(f"[{m['role']}] {m['content']}" for m in completion)
