"""Data: a file or dataset -> validated records -> token ids -> padded (B, T) batches.

::

    load_records(source, kind)      .jsonl | .json | .parquet | save_to_disk dir | dir of files
                                    | hub dataset name
      -> PromptRecord | Demonstration | Comparison | Ranking        (validated text)
    encode_prompts / encode_demonstrations / encode_comparisons(records, tokenizer, length)
      -> token id lists + a TruncationReport for the trainer to log
    PromptCollator | SFTCollator | PairCollator                     (DataLoader collate_fn)
      -> padded LongTensors; `pad` is the one place that pads

Record formats follow TRL's dataset conventions (prompt/response, prompt/chosen/rejected,
"messages" conversations, an implicit prompt shared by chosen and rejected as in
Anthropic/hh-rlhf) plus InstructGPT's K-way rankings (Ouyang et al. 2022, sec. 3.5).
Where this package departs from TRL:

- Every record is validated when loaded. A bad one raises `DataError` naming the file, the
  1-based line (JSONL) or 0-based row (as `dataset[i]` indexes it), the field and what was
  expected; nothing is dropped.
- Rankings stay rankings (not pre-expanded into pairs); `PairCollator` lays every batch out
  rank-major so the pairwise loss and the K-way ranking loss come from one forward pass.
- An implicit string prompt ends before the last whitespace of the shared prefix, so
  responses keep whole words (" I think", GPT-2 style) instead of splitting one.
- Prompt and response are tokenised separately and concatenated, as generation sees them.
  A response always ends with EOS: it is cut after its first EOS (a chat template may write
  an end-of-turn newline after it, which generation never produces) or one is appended.

Modules, in the order data flows through them:

- `records`: the record dataclasses, `DataError` and the validation of raw rows by kind.
- `sources`: files, folders and datasets -> raw rows -> records (`load_records`).
- `encode`: chat rendering, tokenisation and truncation (`TruncationReport`); a prompt's
  comparisons grouped into one example (`group_by_prompt`).
- `collate`: `pad` and the DataLoader collators built on it; `ranked_scores`.
"""

from rlhfkit.data.collate import (
    PairCollator,
    PromptCollator,
    PromptColumns,
    SFTCollator,
    pad,
    ranked_scores,
)
from rlhfkit.data.encode import (
    IGNORE_INDEX,
    PreferenceExample,
    PromptExample,
    SFTExample,
    TruncationReport,
    encode_comparisons,
    encode_demonstrations,
    encode_pairs,
    encode_prompts,
    encode_turn,
    group_by_prompt,
    load_prompts,
    template_takes_tools,
)
from rlhfkit.data.records import (
    FIELDS,
    KINDS,
    Candidates,
    Comparison,
    DataError,
    Demonstration,
    Message,
    Prompt,
    PromptRecord,
    Ranking,
    Record,
)
from rlhfkit.data.sources import load_records

__all__ = [
    "FIELDS",
    "IGNORE_INDEX",
    "KINDS",
    "Candidates",
    "Comparison",
    "DataError",
    "Demonstration",
    "Message",
    "PairCollator",
    "PreferenceExample",
    "Prompt",
    "PromptCollator",
    "PromptColumns",
    "PromptExample",
    "PromptRecord",
    "Ranking",
    "Record",
    "SFTCollator",
    "SFTExample",
    "TruncationReport",
    "encode_comparisons",
    "encode_demonstrations",
    "encode_pairs",
    "encode_prompts",
    "encode_turn",
    "group_by_prompt",
    "load_prompts",
    "load_records",
    "pad",
    "ranked_scores",
    "template_takes_tools",
]
