"""What a reward function written TRL's way is handed, read back as text.

A reward function with TRL's signature, ``f(prompts, completions, completion_ids, **columns)``,
gets each completion as a string where the prompt was a string, and as a list of one
assistant message (``[{"role": "assistant", "content": ...}]``) where the prompt was a list of
chat messages, as TRL's ``GRPOTrainer`` passes them. The bundled reward functions take both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def completion_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The text of one completion: the string itself, or the content of its messages joined
    (one assistant message, as a conversational completion holds)."""
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content") or "") for message in completion)


def prompt_text(prompt: str | Sequence[Mapping[str, Any]]) -> str:
    """The text of one prompt as written: the string itself, or the content of its user
    messages, one per line (a system message says how to answer, not what is asked)."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m.get("content") or "") for m in prompt if m.get("role") == "user")
