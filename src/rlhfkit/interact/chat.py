"""Talk to any checkpoint in the terminal, with each reply's reward shown.

``rlhfkit chat --model PATH [--reward_model DIR] [--reward_functions NAME]``. The history is
kept and rendered as ``env.LMAgent`` renders it (chat template, else "User: ...\\nAssistant:");
type ``/reset`` to clear it and ``/quit`` (or end of input, Ctrl-D) to leave. The scorer is named
as in every command that scores (``config.RewardOptions``): a reward model directory and/or
reward functions (``digits``, ``gold``, ``perplexity``, ``perplexity:PATH``,
``module:function``), weighted. The reward of a reply is scored given the conversation before
it, as ``env.TextEnv`` would.

This module is the terminal UI, so it prints; the library underneath logs. Whatever it prints
from a model or a user goes through ``text.terminal_text``: a sampled ESC, CR or OSC sequence
shows as ``\\x1b``, ``\\r``, never reaches the terminal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch

from rlhfkit.config import ConfigError, RewardOptions, checked_sampling
from rlhfkit.data import Message, PromptColumns, pad
from rlhfkit.experience.episodes import EpisodeSettings, ToolEnv, transcript
from rlhfkit.experience.generation import SamplingConfig
from rlhfkit.experience.rollout import ExperienceMaker
from rlhfkit.experience.scorer_loading import check_no_columns_needed
from rlhfkit.experience.scorers import ScoreInput, Scorer, WeightedScorer, distinct_keys
from rlhfkit.interact.env import LMAgent, encode_for_scoring, score_texts, token_budget
from rlhfkit.runtime.machine import Runtime
from rlhfkit.text import terminal_text
from rlhfkit.trainers.rl_config import ToolOptions

BANNER = "Chatting with {model}. /reset clears the history, /quit (or Ctrl-D) exits."
MAX_TOOL_ROUNDS = 4  # tool calls answered per message before the reply stands as it is
USER_PROMPT = "you> "


def chat_loop(
    agent: LMAgent,
    scorer: Scorer | None = None,
    *,
    system: str | None = None,
    tools: ToolEnv | None = None,
    read: Callable[[str], str] = input,
    write: Callable[[str], None] = print,
) -> list[Message]:
    """Read a message, answer it, show the reward; until ``/quit`` or end of input. With
    ``tools``, a reply that calls tools is followed by their results (shown as ``tool>``)
    and the model's next reply, up to ``MAX_TOOL_ROUNDS`` times.

    Returns the conversation as it stood when the loop ended.
    """
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    max_length = token_budget(agent.tokenizer)
    while True:
        try:
            text = read(USER_PROMPT).strip()
        except (EOFError, KeyboardInterrupt):
            write("")
            return messages
        if text == "/quit":
            return messages
        if text == "/reset":
            messages = list(start)
            write("(history cleared)")
            continue
        if not text:
            continue
        messages.append({"role": "user", "content": text})
        reply = agent.generate(messages)
        write(f"bot> {terminal_text(reply)}")
        if tools is not None:
            reply = _tool_rounds(agent, tools, messages, reply, write)
        if scorer is not None:
            batch = encode_for_scoring(
                agent.tokenizer, [messages], [reply], max_length, agent.device
            )
            write(f"[reward {reward_line(scorer, batch)}]")
        messages.append({"role": "assistant", "content": reply})


def _tool_rounds(agent: LMAgent, tools: ToolEnv, messages: list[Message], reply: str, write) -> str:
    """While ``reply`` calls tools (at most ``MAX_TOOL_ROUNDS`` times): the reply and the
    tools' results joined to ``messages``, and the model's next reply. Returns the last."""
    for _ in range(MAX_TOOL_ROUNDS):
        results, _, answered, _, _ = tools.step(reply)
        if answered:
            break
        messages.append({"role": "assistant", "content": reply})
        for result in results:
            write(f"tool> {terminal_text(result['content'])}")
            messages.append(result)
        reply = agent.generate(messages)
        write(f"bot> {terminal_text(reply)}")
    return reply


def reward_line(scorer: Scorer, batch: ScoreInput) -> str:
    """A reply's reward as shown: ``name: total``, and for a weighted sum of several scorers
    each part's own score too (which one liked the reply is what a user wants to know)."""
    total, parts = scorer.scored(batch)
    if not isinstance(scorer, WeightedScorer) or len(scorer.parts) == 1:
        return f"{terminal_text(scorer.name)}: {total.item():.3f}"
    keys = distinct_keys(scorer.scorers)
    terms = " + ".join(
        f"{weight:g} x {terminal_text(part.name)} {parts[key].item():.3f}"
        for (part, weight), key in zip(scorer.parts, keys, strict=True)
    )
    return f"{total.item():.3f} = {terms}"


@dataclass(kw_only=True)
class ChatConfig(ToolOptions, RewardOptions):
    """Chat in the terminal with a causal LM checkpoint, each reply's reward shown.

    The reward_* fields name the scorer; with none named, no reward is shown."""

    model: str
    """Checkpoint directory (or hub name) of a causal LM and its tokenizer."""
    temperature: float = 0.7
    """Sampling temperature (> 0)."""
    top_p: float = 0.9
    """Nucleus sampling: keep the most likely tokens up to this probability mass, in (0, 1]."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 keeps all."""
    greedy: bool = False
    """Always take the most likely token (temperature, top_p and top_k are then ignored)."""
    max_new_tokens: int = 64
    """The longest reply, in tokens."""
    system: str | None = None
    """A system message put first in the conversation."""
    seed: int | None = None
    """Seed of the sampler, for reproducible replies; None draws a fresh one."""
    mixed_precision: Literal["no", "bf16"] = "no"
    """'bf16': reply and score under bf16 autocast, the model a run trained with
    `mixed_precision: bf16` saw (its float32 weights alone can be a different model:
    docs/instructions.md, "Measuring KL"); 'no': float32."""

    def __post_init__(self) -> None:
        self._check_rewards(required=False)
        self._check_tools()
        self.sampling  # noqa: B018 (checks the sampling fields)

    @property
    def sampling(self) -> SamplingConfig:
        return checked_sampling(self)


def _scorer(config: RewardOptions, agent: LMAgent, command: str) -> Scorer | None:
    """The scorer the config names, on the agent's device (bare perplexity under its model);
    None when it names none. Its prompts come without data, so a reward function that needs
    a dataset's columns is refused, naming ``command``."""
    if not config.has_scorer:
        return None
    scorer = config.scorer(tokenizer=agent.tokenizer, model=agent.model)
    check_no_columns_needed(scorer, command)
    return scorer.to(agent.device)


@contextmanager
def _quiet_data_reports() -> Iterator[None]:
    """Tokenisation reports, one per turn or batch, would interleave with what the terminal
    shows: the data layer's logger at WARNING while the command runs, as it was afterwards."""
    data_logger = logging.getLogger("rlhfkit.data")
    level = data_logger.level
    data_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        data_logger.setLevel(level)


def _precision(agent: LMAgent, mixed_precision: str) -> torch.autocast:
    """The autocast every pass of the command runs under (a no-op for 'no')."""
    return Runtime.inference(agent.device, mixed_precision == "bf16").autocast()


def run_chat(config: ChatConfig) -> None:
    """Load the model (and the reward's scorer, the tools), then chat until /quit or end of
    input."""
    with _quiet_data_reports():
        agent = LMAgent.from_pretrained(config.model, sampling=config.sampling, seed=config.seed)
        scorer = _scorer(config, agent, "chat")
        factory = config.tool_environment()
        tools = factory() if factory is not None else None
        system = config.system
        if tools is not None:
            system = agent.show_tools(tools.tools, system, config.tools_prompt)
        print(BANNER.format(model=terminal_text(config.model)), flush=True)
        with _precision(agent, config.mixed_precision):
            chat_loop(agent, scorer, system=system, tools=tools)


@dataclass(kw_only=True)
class SampleConfig(ToolOptions, RewardOptions):
    """Print sampled continuations of prompts, to see what any checkpoint writes.

    Each is shown with its score when the reward_* fields name a scorer. With tools, each
    prompt is a user message the model answers, calling the tools, turn by turn."""

    model: str
    """Checkpoint directory (or hub name) of a causal LM and its tokenizer."""
    prompt: str | list[str]
    """The prompt to continue as is (no chat rendering), or a list of them: '["A", "B"]'."""
    num_samples: int = 3
    """Continuations per prompt."""
    max_new_tokens: int = 40
    """The longest continuation, in tokens."""
    temperature: float = 1.0
    """Sampling temperature (> 0)."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 keeps all."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    greedy: bool = False
    """Always take the most likely token (one sample per prompt is then enough)."""
    seed: int = 0
    """Seed of the sampler."""
    mixed_precision: Literal["no", "bf16"] = "no"
    """'bf16': sample and score under bf16 autocast, as a run trained with it; 'no': float32."""

    def __post_init__(self) -> None:
        if self.num_samples < 1:
            raise ConfigError(f"SampleConfig.num_samples={self.num_samples}: must be >= 1")
        if not self.prompt:
            raise ConfigError("SampleConfig.prompt is empty: give at least one --prompt")
        self._check_rewards(required=False)
        self._check_tools()
        self.sampling  # noqa: B018 (checks the sampling fields)

    @property
    def sampling(self) -> SamplingConfig:
        return checked_sampling(self)


def run_sample(config: SampleConfig) -> None:
    """Sample ``num_samples`` continuations of every prompt in one batch and print them."""
    with _quiet_data_reports():
        _sample_and_print(config)


def _sample_and_print(config: SampleConfig) -> None:
    agent = LMAgent.from_pretrained(config.model, sampling=config.sampling, seed=config.seed)
    tok = agent.tokenizer
    given = [config.prompt] if isinstance(config.prompt, str) else config.prompt
    prompts = [p for p in given for _ in range(config.num_samples)]
    if config.tools:
        _play_and_print(config, agent, prompts)
        return
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    query, query_mask = pad(ids, tok.pad_token_id, side="left")
    with _precision(agent, config.mixed_precision):
        out = agent._generate(query.to(agent.device), query_mask.to(agent.device))
    texts = [
        tok.decode(row[mask.bool()], skip_special_tokens=True)
        for row, mask in zip(out.response, out.response_mask, strict=True)
    ]
    scorer, scores = _scorer(config, agent, "sample"), None
    if scorer is not None:
        with _precision(agent, config.mixed_precision):
            scores = score_texts(scorer, tok, prompts, texts, token_budget(tok), agent.device)
    for i, (prompt, text) in enumerate(zip(prompts, texts, strict=True)):
        shown = f"[{scores[i].item():+.3f}] " if scores is not None else ""
        print(
            f"{shown}{terminal_text(prompt, one_line=True)} |{terminal_text(text, one_line=True)}"
        )


def _play_and_print(config: SampleConfig, agent: LMAgent, prompts: list[str]) -> None:
    """An episode with the tools from each prompt (a user message), printed turn by turn."""
    episodes = EpisodeSettings(
        MAX_TOOL_ROUNDS + 1,
        max_prompt_length=agent.max_prompt_length,
        tools_prompt=config.tools_prompt,
    )
    maker = ExperienceMaker.sampler(
        agent.model, agent.tokenizer, config.sampling, None, config.tool_environment(), episodes
    )
    generator = torch.Generator(agent.device).manual_seed(config.seed)
    with _precision(agent, config.mixed_precision):
        out = maker.play(PromptColumns(prompts, {}), [config.seed] * len(prompts), generator)
    for prompt, completion in zip(prompts, out.completions, strict=True):
        print(f"{terminal_text(prompt, one_line=True)} |")
        print(terminal_text(transcript(completion)))
