"""Tests for rlhfkit.data: loading and validation, tokenisation, truncation, padding, collation."""

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from transformers import AutoTokenizer

from helpers import write_jsonl
from rlhfkit.data import (
    IGNORE_INDEX,
    Candidates,
    Comparison,
    DataError,
    Demonstration,
    PairCollator,
    PreferenceExample,
    PromptCollator,
    PromptRecord,
    Ranking,
    SFTCollator,
    encode_comparisons,
    encode_demonstrations,
    encode_prompts,
    group_by_prompt,
    load_records,
    pad,
    ranked_scores,
)

CHAT = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello."}]
DEMO_ROWS = [
    {"prompt": "The cat likes", "response": " a red ball."},
    {"prompt": "A dog sees", "response": " the big tree!"},
    {"messages": CHAT},  # mixed schema: tables fill the missing columns with null
]
DEMOS = [
    Demonstration("The cat likes", " a red ball."),
    Demonstration("A dog sees", " the big tree!"),
    Demonstration(CHAT[:1], "Hello."),
]
# A tiny chat template that ends the assistant's turn with EOS and a newline.
TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% if m.role == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def columns(rows):
    """Every column any row has; absent values become null, as in a real table."""
    keys = dict.fromkeys(k for r in rows for k in r)
    return {k: [r.get(k) for r in rows] for k in keys}


def table(rows):
    return pa.table(columns(rows))


def write(tmp_path, fmt, rows):
    """`rows` saved in format `fmt`; returns the source to load."""
    if fmt == "jsonl":
        return write_jsonl(tmp_path / "d.jsonl", rows)
    if fmt == "json_list":
        (tmp_path / "d.json").write_text(json.dumps(rows))
    elif fmt == "json_data":
        (tmp_path / "d.json").write_text(json.dumps({"version": 1, "data": rows}))
    elif fmt == "json_lines":  # what Dataset.to_json writes
        write_jsonl(tmp_path / "d.json", rows)
    if fmt.startswith("json"):
        return tmp_path / "d.json"
    if fmt == "parquet":
        pq.write_table(table(rows), tmp_path / "d.parquet")
        return tmp_path / "d.parquet"
    if fmt == "save_to_disk":
        import datasets

        datasets.Dataset.from_dict(columns(rows)).save_to_disk(tmp_path / "saved")
        return tmp_path / "saved"
    folder = tmp_path / "folder"  # a dir of files, read in name order
    (folder / "data").mkdir(parents=True)
    write_jsonl(folder / "data" / "a.jsonl", rows[:2])
    pq.write_table(table(rows[2:]), folder / "data" / "b.parquet")
    return folder


@pytest.mark.parametrize(
    "fmt", ["jsonl", "json_list", "json_data", "json_lines", "parquet", "save_to_disk", "dir"]
)
def test_every_format_loads_the_same_records(tmp_path, fmt):
    assert load_records(write(tmp_path, fmt, DEMO_ROWS), "demonstrations") == DEMOS


def test_limit_keeps_the_first_records(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", DEMO_ROWS)
    assert load_records(path, "demonstrations", limit=2) == DEMOS[:2]


def test_folder_with_split_files_reads_only_the_split(tmp_path):
    write_jsonl(tmp_path / "train-00000.jsonl", DEMO_ROWS[:2])
    write_jsonl(tmp_path / "test-00000.jsonl", DEMO_ROWS[2:])
    assert load_records(tmp_path, "demonstrations") == DEMOS[:2]
    assert load_records(tmp_path, "demonstrations", split="test") == DEMOS[2:]
    with pytest.raises(DataError, match=r"no files for split 'validation'.*'test', 'train'"):
        load_records(tmp_path, "demonstrations", split="validation")


def test_saved_dataset_dict_picks_the_split(tmp_path):
    import datasets

    splits = {"train": DEMO_ROWS[:2], "test": DEMO_ROWS[2:]}
    datasets.DatasetDict(
        {k: datasets.Dataset.from_dict(columns(v)) for k, v in splits.items()}
    ).save_to_disk(tmp_path / "dd")
    assert load_records(tmp_path / "dd", "demonstrations", split="test") == DEMOS[2:]


BAD_RECORDS = [  # (kind, bad line, field named, what the message must say)
    ("demonstrations", {"prompt": "x"}, "'response'", "is missing"),
    ("demonstrations", {"prompt": None, "response": "y"}, "'prompt'", "is missing"),
    ("comparisons", {"prompt": "x", "chosen": 3, "rejected": "y"}, "'chosen'", "got int"),
    ("comparisons", {"prompt": "x", "chosen": "a", "rejected": ""}, "'rejected'", "got ''"),
    ("demonstrations", {"prompt": "x", "response": "  "}, "'response'", "non-empty string"),
    ("demonstrations", {"prompt": 1.5, "response": "y"}, "'prompt'", "list of messages, got float"),
    ("comparisons", {"prompt": "x", "responses": ["a", "b", "c"], "ranking": [0, 0, 2]},
     "'ranking'", "permutation of 0..2"),
    ("comparisons", {"prompt": "x", "responses": ["a", "b"], "ranking": [1, 0.0]},
     "'ranking'", "permutation of 0..1"),
    ("comparisons", {"prompt": "x", "responses": ["a"], "ranking": [0]},
     "'responses'", "at least 2"),
    ("comparisons", {"prompt": "x", "responses": ["a", 7], "ranking": [1, 0]},
     "'responses'", "item 1 must be a non-empty string, got int"),
    ("demonstrations", {"messages": CHAT[:1]}, "'messages'", "must end with an 'assistant'"),
    ("demonstrations", {"messages": [{"role": "user"}, CHAT[1]]}, "'messages'", "item 0 must be"),
    ("comparisons", {"prompt": CHAT[:1], "chosen": [CHAT[0]], "rejected": "b"},
     "'chosen'", "exactly one 'assistant' message"),
    ("comparisons", {"chosen": "abc", "rejected": "xyz"}, "'prompt'", "share no prefix"),
    ("prompts", {"text": "x"}, "'prompt'", "is missing (the record has ['text'])"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "bad", "field", "says"), BAD_RECORDS)
def test_bad_record_names_file_line_and_field(tmp_path, kind, bad, field, says):
    good = {"prompt": "p", "response": "r", "chosen": "c", "rejected": "d"}
    path = write_jsonl(tmp_path / "prefs.jsonl", [good, good])
    path.write_text(path.read_text() + "\n" + json.dumps(bad) + "\n")  # a blank line 3
    with pytest.raises(DataError) as info:
        load_records(path, kind)
    message = str(info.value)
    assert message.startswith(f"{path} line 4: field {field}"), message
    assert says in message


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"prompt": "x",\n', "line 2: malformed JSON"),
        ('["x"]\n', "line 2: expected a JSON object"),
    ],
)
def test_bad_json_line(tmp_path, text, says):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok"}\n' + text)
    with pytest.raises(DataError, match=f"^{path} {says}"):
        load_records(path, "prompts")


@pytest.mark.parametrize("fmt", ["json_list", "parquet"])
def test_bad_row_in_a_table_names_its_index(tmp_path, fmt):
    source = write(
        tmp_path, fmt, [{"prompt": "p", "response": "r"}, {"prompt": "p", "response": ""}]
    )
    with pytest.raises(DataError, match=rf"^{source} row 1: field 'response' .* got ''"):
        load_records(source, "demonstrations")


def test_bad_sources_and_arguments(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_records(tmp_path / "missing.jsonl", "prompts")
    with pytest.raises(DataError, match="no records"):
        load_records(write_jsonl(tmp_path / "empty.jsonl", []), "prompts")
    with pytest.raises(ValueError, match="kind='pairs'"):
        load_records(tmp_path / "empty.jsonl", "pairs")
    with pytest.raises(ValueError, match="keys must be among"):
        load_records(tmp_path / "empty.jsonl", "prompts", columns={"text": "prompt"})


def test_columns_map_our_fields_to_the_source(tmp_path):
    path = write_jsonl(tmp_path / "imdb.jsonl", [{"text": "A fine film.", "label": 1}])
    assert load_records(path, "prompts", columns={"prompt": "text"}) == [
        PromptRecord("A fine film.", {"label": 1})  # the prompt's column is not repeated
    ]
    with pytest.raises(DataError, match=r"line 1: field 'prompt' \(column 'review'\) is missing"):
        load_records(path, "prompts", columns={"prompt": "review"})


def test_prompts_come_from_any_kind_of_record(tmp_path):
    rows = [
        {"prompt": "a", "response": "b"},
        {"prompt": "c", "chosen": "d", "rejected": "e"},
        {"messages": CHAT},
        {"messages": CHAT[:1]},
        {"chosen": "Q: hi A: yes", "rejected": "Q: hi A: no"},
    ]
    records = load_records(write_jsonl(tmp_path / "p.jsonl", rows), "prompts")
    assert [r.prompt for r in records] == ["a", "c", CHAT[:1], CHAT[:1], "Q: hi A:"]


def test_comparison_formats(tmp_path, caplog):
    hh = "\n\nHuman: Is it far?\n\nAssistant:"
    rows = [
        {"prompt": "p", "chosen": "c", "rejected": "r"},
        {"chosen": hh + " I think so.", "rejected": hh + " I'm not sure."},  # Anthropic/hh-rlhf
        {
            "chosen": [CHAT[0], CHAT[1]],
            "rejected": [CHAT[0], {"role": "assistant", "content": "Go"}],
        },
        {
            "prompt": CHAT[:1],
            "chosen": CHAT[1:],
            "rejected": [{"role": "assistant", "content": "No"}],
        },
        {"prompt": "p", "responses": ["ok", "best", "bad"], "ranking": [1, 0, 2]},
        {"chosen": hh + " Same.", "rejected": hh + " Same."},
    ]
    with caplog.at_level(logging.WARNING):
        records = load_records(write_jsonl(tmp_path / "c.jsonl", rows), "comparisons")
    assert records == [
        Comparison("p", "c", "r"),
        Comparison(hh, " I think so.", " I'm not sure."),
        Comparison(CHAT[:1], "Hello.", "Go"),
        Comparison(CHAT[:1], "Hello.", "No"),
        Ranking("p", ["ok", "best", "bad"], [1, 0, 2]),
    ]  # the last pair compares a response with itself: dropped, and counted
    assert records[4].best_first == ["best", "ok", "bad"]
    assert "dropped 1 of 6 comparisons whose responses are identical" in caplog.text


# ---------------------------------------------------------------------------- tokenisation


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_sft_labels_mask_prompt_and_padding_and_end_with_eos(tiny_tokenizer):
    tok, eos = tiny_tokenizer, tiny_tokenizer.eos_token_id
    records = DEMOS[:2] + [Demonstration("We", " paint.")]
    examples, report = encode_demonstrations(records, tok, max_length=64)
    assert report.as_dict() == {
        "records": 3,
        "truncated_prompts": 0,
        "truncated_responses": 0,
        "tokens_removed": 0,
    }
    for r, e in zip(records, examples, strict=True):
        p, a = ids(tok, r.prompt), ids(tok, r.response)
        assert e.input_ids == p + a + [eos]
        assert e.labels == [IGNORE_INDEX] * len(p) + a + [eos]
    batch = next(iter(DataLoader(examples, batch_size=3, collate_fn=SFTCollator(tok.pad_token_id))))
    lengths = [len(e.input_ids) for e in examples]
    prompt_lengths = [len(ids(tok, r.prompt)) for r in records]
    for row, (n, p) in enumerate(zip(lengths, prompt_lengths, strict=True)):
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (max(lengths) - n)
        assert (batch["labels"][row] != IGNORE_INDEX).nonzero().flatten().tolist() == list(
            range(p, n)
        )
        assert batch["input_ids"][row, n - 1] == eos
        assert (batch["input_ids"][row, n:] == tok.pad_token_id).all()


def test_chat_without_a_template_renders_roles_plainly(tiny_tokenizer):
    (example,), _ = encode_demonstrations([DEMOS[2]], tiny_tokenizer, max_length=64)
    assert (
        tiny_tokenizer.decode(example.input_ids) == "User: Hi there\nAssistant: Hello.<|endoftext|>"
    )
    answer = [t for t in example.labels if t != IGNORE_INDEX]
    assert tiny_tokenizer.decode(answer) == " Hello.<|endoftext|>"


def test_chat_template_is_applied_and_eos_is_not_doubled(tiny_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)  # a copy: the fixture is shared
    tok.chat_template = TEMPLATE
    (example,), _ = encode_demonstrations([DEMOS[2]], tok, max_length=64)
    # The template's "\n" after the end-of-turn EOS is cut: generation stops at EOS.
    assert tok.decode(example.input_ids) == "<user>Hi there\n<assistant>Hello.<|endoftext|>"
    assert tok.decode([t for t in example.labels if t != IGNORE_INDEX]) == "Hello.<|endoftext|>"
    (query,), _ = encode_prompts([PromptRecord(CHAT[:1])], tok, max_prompt_length=64)
    assert tok.decode(query) == "<user>Hi there\n<assistant>"


def test_plain_string_prompts_go_through_the_template_unless_asked_not_to(tiny_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)  # a copy: the fixture is shared
    tok.chat_template = TEMPLATE
    plain = [PromptRecord("Hi there")]
    (query,), _ = encode_prompts(plain, tok, max_prompt_length=64)
    assert tok.decode(query) == "<user>Hi there\n<assistant>"
    (raw,), _ = encode_prompts(plain, tok, max_prompt_length=64, chat_template=False)
    assert raw == ids(tok, "Hi there")
    demo = Demonstration("Hi there", "Hello.")
    (example,), _ = encode_demonstrations([demo], tok, max_length=64)
    assert tok.decode(example.input_ids) == "<user>Hi there\n<assistant>Hello.<|endoftext|>"
    (pair,), _ = encode_comparisons([Comparison("Hi there", "Hello.", "Go.")], tok, 64)
    assert tok.decode(pair.prompt_ids) == "<user>Hi there\n<assistant>"
    # Without a template a plain string stays raw text, as the bundled model was trained.
    (bare,), _ = encode_prompts(plain, AutoTokenizer.from_pretrained(tiny_tokenizer_dir), 64)
    assert bare == raw


def test_prompt_collation_is_left_padded(tiny_tokenizer):
    tok = tiny_tokenizer
    records = [PromptRecord("The cat likes a red ball today."), PromptRecord("We")]
    prompts, report = encode_prompts(records, tok, max_prompt_length=64)
    assert report.truncated_prompts == 0
    batch = PromptCollator(tok.pad_token_id)(prompts)
    width = batch["query"].shape[1]
    assert batch["query"][0].tolist() == ids(tok, records[0].prompt)
    n = len(ids(tok, "We"))
    assert batch["query_mask"][1].tolist() == [0] * (width - n) + [1] * n
    assert batch["query"][1, : width - n].eq(tok.pad_token_id).all()
    assert tok.decode(batch["query"][1, width - n :]) == "We"


def test_prompt_truncation_keeps_the_end_or_the_start(tiny_tokenizer):
    text = "The robot reads a new book every day."
    full = ids(tiny_tokenizer, text)
    (end,), report = encode_prompts([PromptRecord(text)], tiny_tokenizer, max_prompt_length=3)
    assert end == full[-3:]
    assert (report.truncated_prompts, report.tokens_removed) == (1, len(full) - 3)
    (start,), _ = encode_prompts([PromptRecord(text)], tiny_tokenizer, 3, keep="start")
    assert start == full[:3]


def test_truncation_keeps_half_the_budget_each_and_is_counted(tiny_tokenizer):
    tok, eos = tiny_tokenizer, tiny_tokenizer.eos_token_id
    long_text = " the cat likes the big tree in the park every day"
    p, a = ids(tok, "Number 7." + long_text), ids(tok, long_text) + [eos]
    assert len(p) > 8 and len(a) > 8
    short = Demonstration("We", " paint.")
    records = [Demonstration("Number 7." + long_text, long_text), short]
    examples, report = encode_demonstrations(records, tok, max_length=16)
    both_long = examples[0]
    assert both_long.input_ids == p[-8:] + a[:8]  # no EOS: the response was cut
    assert both_long.labels == [IGNORE_INDEX] * 8 + a[:8]
    assert examples[1].input_ids == ids(tok, "We") + ids(tok, " paint.") + [eos]
    assert report.as_dict() == {
        "records": 2,
        "truncated_prompts": 1,
        "truncated_responses": 1,
        "tokens_removed": len(p) - 8 + len(a) - 8,
    }
    # A long prompt before a short response gives the prompt all the rest.
    (example,), report = encode_demonstrations(
        [Demonstration(records[0].prompt, " paint.")], tok, 16
    )
    assert example.input_ids == p[-(16 - len(ids(tok, " paint.")) - 1) :] + ids(tok, " paint.") + [
        eos
    ]
    assert (report.truncated_prompts, report.truncated_responses) == (1, 0)


def test_comparisons_cut_prompt_and_responses_to_their_own_lengths_first(tiny_tokenizer):
    tok, eos = tiny_tokenizer, tiny_tokenizer.eos_token_id
    prompt = "Number 7. the cat likes the big tree"
    chosen, rejected = " in the park every day", " today."
    p, c, r = ids(tok, prompt), ids(tok, chosen) + [eos], ids(tok, rejected) + [eos]
    assert len(p) > 4 and len(c) > 5 and len(r) <= 5
    record = Comparison(prompt, chosen, rejected)
    (example,), report = encode_comparisons(
        [record], tok, max_length=64, max_prompt_length=4, max_response_length=5
    )
    # The prompt keeps its last 4 tokens and each response its first 5, as TRL's DPO cut them.
    assert example.prompt_ids == p[-4:]
    assert example.response_ids == [c[:5], r]
    assert report.as_dict() == {
        "records": 1,
        "truncated_prompts": 1,
        "truncated_responses": 1,
        "tokens_removed": len(p) - 4 + len(c) - 5,
    }
    # max_length still applies to what is left: 4 + 5 > 8 leaves the response 4 (half).
    (example,), _ = encode_comparisons(
        [record], tok, max_length=8, max_prompt_length=4, max_response_length=5
    )
    assert example.prompt_ids == p[-4:] and example.response_ids == [c[:4], r[:4]]
    # Without the limits nothing changes: max_length alone decides.
    (plain,), _ = encode_comparisons([record], tok, max_length=64)
    assert plain.prompt_ids == p and plain.response_ids == [c, r]
    with pytest.raises(ValueError, match="max_response_length=0"):
        encode_comparisons([record], tok, max_length=64, max_response_length=0)


def test_pair_and_ranking_batches_serve_both_losses(tiny_tokenizer):
    tok, eos = tiny_tokenizer, tiny_tokenizer.eos_token_id
    records = [
        Comparison("The cat", " sees it.", " reads."),
        Ranking("We", [" ok", " best", " bad"], [1, 0, 2]),
    ]
    examples, report = encode_comparisons(records, tok, max_length=32)
    assert report.records == 2 and report.tokens_removed == 0
    assert examples[1].response_ids == [ids(tok, t) + [eos] for t in (" best", " ok", " bad")]
    batch = PairCollator(tok.pad_token_id)(examples)
    # Rank-major rows: the best of each example, then the second, then the rest.
    assert batch["group"].tolist() == [0, 1, 0, 1, 1]
    assert batch["rank"].tolist() == [0, 0, 1, 1, 2]
    assert batch["pair_count"] == 2
    texts = tok.batch_decode(batch["input_ids"], skip_special_tokens=True)
    assert texts == ["The cat sees it.", "We best", "The cat reads.", "We ok", "We bad"]
    n = batch["pair_count"]
    chosen, rejected = batch["input_ids"][:n], batch["input_ids"][n : 2 * n]
    assert tok.batch_decode(chosen, skip_special_tokens=True) == ["The cat sees it.", "We best"]
    assert tok.batch_decode(rejected, skip_special_tokens=True) == ["The cat reads.", "We ok"]
    answer = batch["labels"][0][batch["labels"][0] != IGNORE_INDEX]
    assert answer.tolist() == ids(tok, " sees it.") + [eos]
    scores = torch.tensor([10.0, 20.0, 11.0, 21.0, 22.0], requires_grad=True)
    table, valid = ranked_scores(scores, batch["group"], batch["rank"])
    assert table.tolist() == [[10.0, 11.0, 0.0], [20.0, 21.0, 22.0]]
    assert valid.tolist() == [[True, True, False], [True, True, True]]
    table.sum().backward()  # the layout keeps the gradient path to every row
    assert scores.grad.tolist() == [1.0] * 5


def test_a_prompts_comparisons_group_into_one_example_by_hand():
    a, b, c, d = [1], [2], [3], [4]
    examples = [
        PreferenceExample([7], [a, b]),  # prompt 7: a > b
        PreferenceExample([8], [c, a]),  # prompt 8: another prompt, the same response text
        PreferenceExample([7], [c, a]),  # prompt 7: c > a
        PreferenceExample([7], [b, d, a]),  # prompt 7, a ranking: b > d > a
        PreferenceExample([7], [a, b]),  # a > b again: it counts twice
    ]
    grouped = group_by_prompt(examples)
    assert [g.prompt_ids for g in grouped] == [[7], [8]]
    assert grouped[0].response_ids == [a, b, c, d]  # each once, in order of first appearance
    assert grouped[0].pairs == ((0, 1), (2, 0), (1, 3), (1, 0), (3, 0), (0, 1))
    assert grouped[1].response_ids == [c, a] and grouped[1].pairs == ((0, 1),)
    assert examples[3].preferences() == [(0, 1), (0, 2), (1, 2)]  # a ranking: every i < j

    batch = PairCollator(pad_id=0)(grouped)
    # Six rows for eleven responses; every pair points at its two rows by (example, place).
    assert batch["input_ids"].shape[0] == 6
    assert batch["pairs"].tolist() == [
        [0, 0, 1], [0, 2, 0], [0, 1, 3], [0, 1, 0], [0, 3, 0], [0, 0, 1], [1, 0, 1]
    ]  # fmt: skip
    table, _ = ranked_scores(batch["input_ids"][:, 1].float(), batch["group"], batch["rank"])
    group, better, worse = batch["pairs"].unbind(1)
    assert table[group, better].tolist() == [1, 3, 2, 2, 4, 1, 3]  # the better response's id
    assert table[group, worse].tolist() == [2, 1, 4, 1, 1, 2, 1]
    assert "pairs" not in PairCollator(pad_id=0)(examples)  # ungrouped batches stay as they were


def test_encoding_arguments_are_checked(tiny_tokenizer):
    with pytest.raises(ValueError, match="max_length=1"):
        encode_demonstrations(DEMOS, tiny_tokenizer, max_length=1)
    with pytest.raises(ValueError, match="max_prompt_length=0"):
        encode_prompts([PromptRecord("x")], tiny_tokenizer, max_prompt_length=0)
    with pytest.raises(ValueError, match="keep='middle'"):
        encode_prompts([PromptRecord("x")], tiny_tokenizer, 8, keep="middle")


# ---------------------------------------------------------------------------- pad


@settings(max_examples=60, deadline=None)
@given(
    seqs=st.lists(st.lists(st.integers(0, 1000), max_size=7), min_size=1, max_size=5),
    side=st.sampled_from(["left", "right"]),
)
def test_pad_round_trip(seqs, side):
    padded, mask = pad(seqs, pad_id=-1, side=side)
    assert padded.dtype == mask.dtype == torch.long
    assert padded.shape == mask.shape == (len(seqs), max(map(len, seqs)))
    for row, seq in enumerate(seqs):
        assert padded[row][mask[row].bool()].tolist() == seq
        assert mask[row].sum() == len(seq)
        assert padded[row][~mask[row].bool()].eq(-1).all()
        real = mask[row].nonzero().flatten().tolist()  # contiguous, at the chosen side
        width = padded.shape[1]
        assert real == (
            list(range(len(seq))) if side == "right" else list(range(width - len(seq), width))
        )


def test_pad_hand_example_and_errors():
    padded, mask = pad([[5, 6], [7]], pad_id=0, side="left")
    assert padded.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]
    with pytest.raises(ValueError, match="side='middle'"):
        pad([[1]], 0, side="middle")
    with pytest.raises(ValueError, match="sequence 1 must be 1-D integer ids, got torch.float32"):
        pad([[1], [2.0]], 0)
    with pytest.raises(ValueError, match="at least one"):
        pad([], 0)


def test_candidates_are_a_prompt_with_responses_not_yet_compared(tmp_path):
    rows = [{"prompt": "The cat", "responses": [" sat.", " ran.", " slept."]}]
    assert load_records(write_jsonl(tmp_path / "c.jsonl", rows), "candidates") == [
        Candidates("The cat", [" sat.", " ran.", " slept."])
    ]
    bad = write_jsonl(tmp_path / "bad.jsonl", [*rows, {"prompt": "p", "responses": ["one"]}])
    with pytest.raises(DataError, match="line 2: field 'responses' must hold at least 2"):
        load_records(bad, "candidates")


def test_a_lone_surrogate_is_refused_with_its_place(tmp_path):
    # json.dumps writes the lone surrogate as the escape \ud800, which json.loads accepts.
    rows = [DEMO_ROWS[0], {"prompt": "Hi", "response": "a\ud800b"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DataError, match="line 2: field 'response' holds a lone surrogate"):
        load_records(path, "demonstrations")
    chat = [{"prompt": [{"role": "user", "content": "x\udc00"}], "response": "ok"}]
    with pytest.raises(DataError, match="line 1: field 'prompt' item 0 holds a lone surrogate"):
        load_records(write_jsonl(tmp_path / "m.jsonl", chat), "demonstrations")
