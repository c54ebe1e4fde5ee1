"""Tools a policy may call inside an episode: Python functions, their JSON schemas, the calls
read from the policy's text, and the calls run.

A tool is a Python function with type hints and a Google-style docstring (``Args:``), the
form ``transformers.utils.get_json_schema`` turns into the JSON schema that chat templates
take (``apply_chat_template(..., tools=...)``), as TRL's ``GRPOTrainer(tools=[...])`` does.
The policy calls one by writing, anywhere in its turn::

    <tool_call>
    {"name": "multiply", "arguments": {"a": 123, "b": 45}}
    </tool_call>

(Hermes' format, which Qwen 2.5 / 3, SmolLM3 and most open chat models are trained on); a turn
may hold several calls, run in order. A turn without one is the policy's answer.

A call that cannot be run becomes the message the policy reads in its next turn, with the
failure's kind counted (``ToolCallError.kind``), never an exception out of the rollout: text
between the tags that is not a JSON object with a "name" ("format"), a name no tool has
("unknown_tool"), arguments the function's signature and schema refuse ("arguments"), a tool
that raises ("raised"), or one that runs past ``timeout`` seconds ("timeout"). Python cannot
stop a thread, so a tool past its time limit keeps running in the background (a daemon
thread, gone when the process exits) while the episode goes on without its result.

Tools are the user's code, run in the training process with the user's rights; rlhfkit
imports them by name (``module:function``) as it imports reward functions, and sandboxes
nothing.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from transformers.utils import get_json_schema

from rlhfkit.errors import UsageError

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
ERROR_KINDS = ("format", "unknown_tool", "arguments", "raised", "timeout")
_JSON_TYPES = {
    "integer": int,
    "number": (int, float),
    "string": str,
    "boolean": bool,
    "array": list,
    "object": dict,
    "null": type(None),
}

TOOLS_SYSTEM_PROMPT = """You can call tools to help you answer. To call one, write
<tool_call>
{"name": "<the tool's name>", "arguments": {<its arguments as JSON>}}
</tool_call>
and stop; its result comes back to you in a message from "tool". When you know the answer, \
reply without a tool call. The tools:
{tools}"""


@dataclass(frozen=True)
class Tool:
    """A function the policy may call, with the JSON schema it is shown."""

    function: Callable[..., Any]
    schema: dict  # {"type": "function", "function": {"name", "description", "parameters"}}

    @classmethod
    def of(cls, function: Callable[..., Any]) -> Tool:
        """The tool of ``function``; a `UsageError` naming it where its type hints or
        docstring do not make a schema (every argument needs a hint and a line in ``Args:``)."""
        try:
            schema = get_json_schema(function)
        except Exception as error:  # transformers' parsing errors, or a callable it cannot read
            name = getattr(function, "__name__", repr(function))
            raise UsageError(
                f"tool {name}: no JSON schema for it ({error}); a tool is a function with a "
                "type hint on every argument and a docstring whose Args: section describes "
                "each"
            ) from error
        return cls(function, schema)

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    @property
    def parameters(self) -> dict:
        return self.schema["function"].get("parameters", {})


@dataclass(frozen=True)
class ToolCall:
    """A call read from the policy's text."""

    name: str
    arguments: dict


class ToolCallError(Exception):
    """A call that could not be run: ``kind`` (one of ``ERROR_KINDS``) and the message the
    policy reads."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def tools_prompt(tools: Sequence[Tool], template: str | None = None) -> str:
    """The system prompt that shows ``tools`` and the call format to a model whose chat
    template takes no tools: ``template`` (default ``TOOLS_SYSTEM_PROMPT``) with each tool's
    schema as one line of JSON in place of ``{tools}``."""
    lines = "\n".join(json.dumps(tool.schema, ensure_ascii=False) for tool in tools)
    return (template or TOOLS_SYSTEM_PROMPT).replace("{tools}", lines)


def parse_tool_calls(text: str) -> list[ToolCall | ToolCallError]:
    """The calls in ``text``, in order, each a ``ToolCall`` or the ``ToolCallError`` ("format")
    of one that does not parse; [] where the text calls no tool (the policy's answer). An
    opening tag without its closing one is a call that does not parse."""
    calls: list[ToolCall | ToolCallError] = [_parse_one(body) for body in TOOL_CALL.findall(text)]
    if text.count("<tool_call>") > len(calls):
        calls.append(ToolCallError("format", "a <tool_call> without its </tool_call>"))
    return calls


def _parse_one(body: str) -> ToolCall | ToolCallError:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as error:
        return ToolCallError("format", f"the tool call is not valid JSON ({error})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCallError("format", 'the tool call must be a JSON object with a "name"')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        return ToolCallError("arguments", '"arguments" must be a JSON object')
    return ToolCall(call["name"], arguments)


def check_arguments(tool: Tool, arguments: dict) -> None:
    """A ``ToolCallError`` ("arguments") where ``arguments`` miss a required one, name one the
    tool does not take, or hold a value of another JSON type than its schema says."""
    parameters = tool.parameters
    properties = parameters.get("properties", {})
    missing = [name for name in parameters.get("required", []) if name not in arguments]
    unknown = [name for name in arguments if name not in properties]
    problems = [f"missing {name!r}" for name in missing]
    problems += [f"unexpected {name!r}" for name in unknown]
    for name, value in arguments.items():
        expected = properties.get(name, {}).get("type")
        if expected and not _has_type(value, expected):
            problems.append(f"{name!r} must be {_type_names(expected)}, got {json.dumps(value)}")
    if problems:
        raise ToolCallError("arguments", f"bad arguments for {tool.name}: {'; '.join(problems)}")


def _has_type(value: Any, expected: str | list[str]) -> bool:
    """Whether ``value`` is of the JSON schema type(s) ``expected`` (a bool is no number)."""
    names = [expected] if isinstance(expected, str) else expected
    for name in names:
        python_type = _JSON_TYPES.get(name)
        if python_type is None:  # a type this check does not know: the tool decides
            return True
        if isinstance(value, bool) and name != "boolean":
            continue
        if isinstance(value, python_type):
            return True
    return False


def _type_names(expected: str | list[str]) -> str:
    return expected if isinstance(expected, str) else " or ".join(expected)


def run_tool(tool: Tool, arguments: dict, timeout: float) -> str:
    """``tool`` called with ``arguments`` in a thread of its own, its result as the text the
    policy reads (a string as it is, anything else as JSON); a ``ToolCallError`` where it
    raises ("raised") or has not returned after ``timeout`` seconds ("timeout")."""
    check_arguments(tool, arguments)
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["result"] = tool.function(**arguments)
        except Exception as error:  # the user's tool: its failure is the policy's to read
            outcome["error"] = error

    thread = threading.Thread(target=call, name=f"tool-{tool.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ToolCallError("timeout", f"{tool.name} did not finish within {timeout:g} s")
    if "error" in outcome:
        error = outcome["error"]
        raise ToolCallError("raised", f"{tool.name} raised {type(error).__name__}: {error}")
    result = outcome["result"]
    return result if isinstance(result, str) else json.dumps(result, default=str)


def tool_message(
    tools: dict[str, Tool], call: ToolCall | ToolCallError, timeout: float
) -> tuple[str, str | None]:
    """The content of the tool message that answers ``call`` and the kind of its failure
    (None where it ran): the result, or "Error: ..." that the policy reads."""
    try:
        if isinstance(call, ToolCallError):
            raise call
        tool = tools.get(call.name)
        if tool is None:
            known = ", ".join(tools) or "none"
            raise ToolCallError("unknown_tool", f"no tool named {call.name!r} (tools: {known})")
        return run_tool(tool, call.arguments, timeout), None
    except ToolCallError as error:
        return f"Error: {error}", error.kind


def public_methods(instance: object) -> list[Callable[..., Any]]:
    """The public methods of ``instance`` but ``reset``: the tools of an environment object
    written for TRL's ``environment_factory``."""
    return [
        member
        for name, member in inspect.getmembers(instance, inspect.ismethod)
        if not name.startswith("_") and name != "reset"
    ]
