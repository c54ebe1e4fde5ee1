"""Make the demo data of the "continue the text, positively" task from the bundled assets.

Follows the data recipe of OpenAI's lm-human-preferences (Ziegler et al. 2019) and
InstructGPT (Ouyang et al. 2022), with the human replaced by ``rlhfkit.tasks.gold_score``:

- prompts: the first 4-8 words of held-out sentences (the corpus test split, never seen in
  pretraining); a sentence hash puts 20% of them in the test split.
- demonstrations (SFT): real Austen continuations (the rest of the sentence, 4-25 words) that
  the gold judge finds positive (score >= ``--demo-min-gold``): human-written, fluent and
  positive, as a demonstrator told "continue it positively" would write. Held-out sentences
  first, topped up with training-corpus sentences; the test split uses test prompts only.
- comparisons (reward model): K=4 continuations per prompt sampled from the base model
  (temperature 1, as a policy samples), labelled by the simulated labeller of
  ``rlhfkit.labelling.simulated``: a Bradley-Terry choice P(a over b) = sigmoid((gold(a) -
  gold(b)) / tau), and for K-way rankings the Plackett-Luce model with the same tau (pick the
  best with softmax(gold / tau), repeat). tau is calibrated so that ``--agreement`` (75%) of pair labels agree with the gold order in
  expectation, roughly the inter-labeller agreement InstructGPT reports (72-77%).
  Pairs (0, 1) and (2, 3) of each set go to ``comparisons/``; the full ranking to ``rankings/``.

The digits task uses the same prompts. Output: ``src/rlhfkit/assets/data/demo/{prompts,sft,
comparisons,rankings}/{train,test}.jsonl`` and ``stats.json``. Usage::

    python scripts/make_demo_data.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import lzma
import random
import re
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhfkit.experience.generation import SamplingConfig, generate
from rlhfkit.labelling.simulated import calibrate_tau, plackett_luce, prefers
from rlhfkit.tasks import BASE_MODEL_DIR, CORPUS_DIR, DEMO_DATA_DIR, gold_score

log = logging.getLogger("make_demo_data")

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"']?[A-Z])")
MAX_DEMO_WORDS = 25  # about the length of a sampled response (24 tokens)
ABBREVIATION = re.compile(r"\b(Mr|Mrs|Dr|St|Col|Capt)\.$")


def sentences(paragraph: str) -> list[str]:
    """Split a paragraph into sentences, re-joining splits after "Mr." and the like."""
    out: list[str] = []
    for piece in SENTENCE_END.split(paragraph):
        if out and ABBREVIATION.search(out[-1]):
            out[-1] += " " + piece
        else:
            out.append(piece)
    return out


def corpus_sentences(split: str) -> list[str]:
    with lzma.open(CORPUS_DIR / f"{split}.jsonl.xz", "rt", encoding="ascii") as f:
        return [s for line in f for s in sentences(json.loads(line)["text"])]


def in_test_split(text: str, fraction: float = 0.2) -> bool:
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:4], "big") < fraction * 2**32


def cut(sentence: str, rng: random.Random, max_rest: int = 1000) -> tuple[str, str] | None:
    """(prompt, continuation): a 4-8 word prompt, then 4 to ``max_rest`` words."""
    ws = sentence.split()
    k = rng.randint(4, 8)
    if not 4 <= len(ws) - k <= max_rest:
        return None
    return " ".join(ws[:k]), " " + " ".join(ws[k:])  # responses start with a space (GPT-2)


def make_prompts(rng: random.Random) -> dict[str, list[tuple[str, str]]]:
    pairs: dict[str, list[tuple[str, str]]] = {"train": [], "test": []}
    for sentence in corpus_sentences("test"):
        if (pc := cut(sentence, rng)) is not None:
            pairs["test" if in_test_split(sentence) else "train"].append(pc)
    return pairs


def make_demos(held_out, rng: random.Random, args) -> dict[str, list[dict]]:
    def positive(pairs):
        return [
            {"prompt": p, "response": c}
            for p, c in pairs
            if len(c.split()) <= MAX_DEMO_WORDS and gold_score(c) >= args.demo_min_gold
        ]

    train = positive(held_out["train"])
    extra = [pc for s in corpus_sentences("train") if (pc := cut(s, rng, MAX_DEMO_WORDS))]
    rng.shuffle(extra)
    train += positive(extra[: 4 * args.n_demos])[: max(0, args.n_demos - len(train))]
    rng.shuffle(train)
    return {"train": train[: args.n_demos], "test": positive(held_out["test"])[: args.n_test]}


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], k: int, args, gen) -> list[list[str]]:
    """k base-model continuations per prompt (temperature 1, no filtering: as a policy samples),
    with the library's own sampler and one seeded generator for the whole run (a generator
    per split would give the train and test sets the same random draws)."""
    config = SamplingConfig(max_new_tokens=args.max_new_tokens)
    out = []
    for start in range(0, len(prompts), args.batch):
        rows = [p for p in prompts[start : start + args.batch] for _ in range(k)]
        enc = tokenizer(rows, return_tensors="pt", padding=True)  # left-padded (b * k, Tq)
        result = generate(
            model,
            enc["input_ids"],
            enc["attention_mask"],
            config,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            generator=gen,
        )
        texts = tokenizer.batch_decode(
            result.response, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        out += [texts[i : i + k] for i in range(0, len(texts), k)]
    return out


def sample_sets(model, tokenizer, prompts: list[str], n: int, args, gen):
    """n prompts with k distinct, non-empty continuations each. A response that is EOS at once
    decodes to "", which no record format accepts, and two equal responses make a comparison
    without signal; 10% spare prompts replace such sets."""
    spare = prompts[: n + n // 10 + 1]
    sets = [
        (p, rs)
        for p, rs in zip(spare, sample(model, tokenizer, spare, args.k, args, gen), strict=True)
        if all(r.strip() for r in rs) and len(set(rs)) == len(rs)
    ]
    if len(sets) < n:
        raise RuntimeError(f"only {len(sets)} of {n} prompts got {args.k} usable responses")
    return [p for p, _ in sets[:n]], [rs for _, rs in sets[:n]]


def label(prompts, samples, tau: float, rng: random.Random):
    pairs, rankings, agree = [], [], {"pairs": [0, 0], "rankings": [0, 0]}
    for prompt, responses in zip(prompts, samples, strict=True):
        golds = [gold_score(r) for r in responses]
        for a, b in ((0, 1), (2, 3)):
            a_wins = prefers(golds[a], golds[b], tau, rng)
            win, lose = (a, b) if a_wins else (b, a)
            pairs.append({"prompt": prompt, "chosen": responses[win], "rejected": responses[lose]})
            if golds[a] != golds[b]:
                agree["pairs"][0] += golds[win] > golds[lose]
                agree["pairs"][1] += 1
        order = plackett_luce(golds, tau, rng)
        rankings.append({"prompt": prompt, "responses": responses, "ranking": order})
        for i, hi in enumerate(order):
            for lo in order[i + 1 :]:
                if golds[hi] != golds[lo]:
                    agree["rankings"][0] += golds[hi] > golds[lo]
                    agree["rankings"][1] += 1
    return pairs, rankings, {k: round(n / max(1, d), 4) for k, (n, d) in agree.items()}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-demos", type=int, default=2000)
    p.add_argument("--n-comparison-prompts", type=int, default=1800, help="2 pairs each")
    p.add_argument("--n-test", type=int, default=250, help="test prompts for sft/comparisons")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--batch", type=int, default=64, help="prompts per generation batch")
    p.add_argument("--agreement", type=float, default=0.75)
    p.add_argument("--demo-min-gold", type=float, default=0.3)
    p.add_argument("--model", type=Path, default=BASE_MODEL_DIR)
    p.add_argument("--out", type=Path, default=DEMO_DATA_DIR)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)  # more threads mostly spin on a busy shared machine
    rng = random.Random(args.seed)

    held_out = make_prompts(rng)
    demos = make_demos(held_out, rng, args)
    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    t0 = time.process_time()
    stats = {
        "seed": args.seed,
        "k": args.k,
        "max_new_tokens": args.max_new_tokens,
        "target_agreement": args.agreement,
        "demo_min_gold": args.demo_min_gold,
    }
    labelled = {}
    gen = torch.Generator().manual_seed(args.seed)
    tau = None
    for split, n in (("train", args.n_comparison_prompts), ("test", args.n_test)):
        shuffled = [pr for pr, _ in rng.sample(held_out[split], len(held_out[split]))]
        prompts, samples = sample_sets(model, tokenizer, shuffled, n, args, gen)
        if tau is None:  # calibrated on the train samples, reused for test
            golds = [[gold_score(r) for r in rs] for rs in samples]
            tau = calibrate_tau(
                [g[0] - g[1] for g in golds] + [g[2] - g[3] for g in golds], args.agreement
            )
        labelled[split] = label(prompts, samples, tau, rng)
        stats[f"agreement_with_gold_{split}"] = labelled[split][2]
        stats[f"mean_gold_of_base_samples_{split}"] = round(
            sum(gold_score(r) for rs in samples for r in rs) / (n * args.k), 4
        )
    stats["labeller_tau"] = round(tau, 4)
    stats["sampling_cpu_s"] = round(time.process_time() - t0, 1)

    for split in ("train", "test"):
        write_jsonl(
            args.out / "prompts" / f"{split}.jsonl", [{"prompt": pr} for pr, _ in held_out[split]]
        )
        write_jsonl(args.out / "sft" / f"{split}.jsonl", demos[split])
        write_jsonl(args.out / "comparisons" / f"{split}.jsonl", labelled[split][0])
        write_jsonl(args.out / "rankings" / f"{split}.jsonl", labelled[split][1])
        stats[f"counts_{split}"] = {
            "prompts": len(held_out[split]),
            "sft": len(demos[split]),
            "comparisons": len(labelled[split][0]),
            "rankings": len(labelled[split][1]),
        }
    stats["mean_gold_of_demos_train"] = round(
        sum(gold_score(d["response"]) for d in demos["train"]) / len(demos["train"]), 4
    )
    (args.out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    log.info("%s", json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
