"""What a reward function written TRL's way is handed, read back as text.

A reward function with TRL's signature, ``f(prompts, completions, completion_ids, **columns)``,
gets each completion as a string where the prompt was a string, and as a list of one
assistant message (``[{"role": "assistant", "content": ...}]``) where the prompt was a list of
chat messages, as TRL's ``GRPOTrainer`` passes them; for an episode (``experience/episodes.py``)
the episode's messages after the prompt. The bundled reward functions take each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def completion_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The text of one completion: the string itself, or the content of its last assistant
    message (a conversational completion holds one; an episode's, the policy's turns and the
    tools' results, ends with the policy's answer)."""
    if isinstance(completion, str):
        return completion
    answers = [m for m in completion if m.get("role", "assistant") == "assistant"]
    return str(answers[-1].get("content") or "") if answers else ""


def prompt_text(prompt: str | Sequence[Mapping[str, Any]]) -> str:
    """The text of one prompt as written: the string itself, or the content of its user
    messages, one per line (a system message says how to answer, not what is asked)."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m.get("content") or "") for m in prompt if m.get("role") == "user")
