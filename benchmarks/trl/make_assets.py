#!/usr/bin/env python
"""Create the offline, deterministic assets the CPU benchmarks against TRL run on.

Everything is built from text that ships with CPython (``pydoc_data.topics``),
so nothing is fetched from the Hugging Face hub.

Layout written under OUT (default runs/trl-assets in the repository):

    corpus.txt              the exact text used (so other libraries can reuse it)
    tokenizer/              byte-level BPE, saved as a PreTrainedTokenizerFast dir
    policy/                 tiny GPT2LMHeadModel (briefly pretrained on corpus.txt), dropout 0
    reward_model_init/      GPT2ForSequenceClassification(num_labels=1): policy backbone + seeded
                            random score head (starting point for reward-model training benches)
    reward_model/           reward_model_init after a short plain-PyTorch Bradley-Terry fit on
                            preference.jsonl (used as the PPO/RLOO reward model)
    prompts.jsonl           512 rows {"prompt": str}
    preference.jsonl        512 rows {"prompt", "chosen", "rejected"}  (train)
    preference_test.jsonl   128 rows, held out (disjoint prompts/snippets)
    sft.jsonl               512 rows {"prompt", "completion"}  (= prompt + chosen of preference.jsonl)
    manifest.json           sizes, seeds, timings, sha256 of every file

Programmatic preference: the *chosen* completion contains digits (1-3 numbers were
inserted), the *rejected* one contains none.  The matching programmatic reward used
by the RL benches is ``digit_reward`` (see trl_common.py).

Usage:  python benchmarks/trl/make_assets.py [--out DIR] [--pretrain-steps N] [--rm-steps N]

It needs torch, transformers and tokenizers only (rlhfkit's own venv will do), and takes about
3 minutes on a quiet 2-core CPU (300 pretraining steps, then 100 reward-model steps).
"""

import argparse
import hashlib
import json
import math
import random
import re
import time
from pathlib import Path

import torch
import trl_common as pc  # before transformers: it sets the offline variables
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
)

EOS = "<|endoftext|>"
PAD = "<|pad|>"


def get_corpus() -> str:
    import pydoc_data.topics as t

    parts = []
    for key in sorted(t.topics):
        txt = t.topics[key]
        txt = re.sub(r"[^\x20-\x7e\n]", " ", txt)  # ascii only
        txt = re.sub(r"[ \t]+", " ", txt)
        txt = re.sub(r"\n\s*\n+", "\n\n", txt)
        parts.append(txt.strip())
    return "\n\n".join(parts) + "\n"


def sentences(corpus: str) -> list[str]:
    flat = re.sub(r"\s+", " ", corpus)
    out = []
    for s in re.split(r"(?<=[.!?])\s+", flat):
        s = s.strip()
        words = s.split()
        if len(words) < 8 or len(words) > 80:
            continue
        # keep mostly-prose sentences
        alpha = sum(c.isalpha() or c == " " for c in s) / len(s)
        if alpha < 0.85 or not s[0].isupper():
            continue
        out.append(s)
    return out


def train_tokenizer(corpus: str, vocab_size: int, out_dir: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    chunks = corpus.split("\n\n")
    tok.train_from_iterator(chunks, trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        unk_token=EOS,
        pad_token=PAD,
        model_max_length=256,
        padding_side="right",
    )
    hf_tok.save_pretrained(out_dir)
    return hf_tok


def make_config(tok, n_layer, n_head, n_embd, n_positions) -> GPT2Config:
    return GPT2Config(
        vocab_size=len(tok),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
        # No dropout anywhere: trainers disagree on whether they disable it (TRL: PPO/DPO/Reward
        # disable it, GRPO/RLOO/SFT do not by default), which would break cross-library parity.
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        summary_first_dropout=0.0,
    )


def pretrain(model, ids: torch.Tensor, steps: int, seq_len: int, batch: int, lr: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)),
    )
    model.train()
    losses = []
    t0 = time.time()
    for step in range(steps):
        starts = torch.randint(0, ids.numel() - seq_len - 1, (batch,), generator=g)
        x = torch.stack([ids[s : s + seq_len] for s in starts])
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
        if step % 50 == 0 or step == steps - 1:
            print(
                f"  pretrain step {step:4d} loss {out.loss.item():.3f}  ({time.time() - t0:.0f}s)",
                flush=True,
            )
    model.eval()
    return losses


NUM_RE = re.compile(r"\d")


def inject_numbers(words: list[str], rng: random.Random) -> list[str]:
    words = list(words)
    k = rng.randint(1, 3)
    for _ in range(k):
        pos = rng.randint(0, len(words))
        num = str(rng.choice([rng.randint(0, 9), rng.randint(10, 99), rng.randint(100, 2026)]))
        words.insert(pos, num)
    return words


def strip_digits(s: str) -> str:
    s = NUM_RE.sub("", s)
    return re.sub(r"\s+", " ", s).strip()


def build_datasets(sents: list[str], rng: random.Random, n_prompts: int, n_pref: int, n_test: int):
    rng.shuffle(sents)
    # disjoint pools: train-pref, test-pref, prompts
    need_pref = 2 * n_pref
    need_test = 2 * n_test
    pref_pool = sents[:need_pref]
    test_pool = sents[need_pref : need_pref + need_test]
    # RL prompts: unused sentences first, then (if needed) the train-preference ones; never test ones
    prompt_pool = sents[need_pref + need_test :] + pref_pool
    assert len(test_pool) == need_test and len(prompt_pool) >= n_prompts, (
        len(sents),
        len(prompt_pool),
    )

    def prompt_of(sentence: str) -> str:
        words = sentence.split()
        return " ".join(words[: rng.randint(4, 8)])

    def completion_of(sentence: str) -> list[str]:
        words = sentence.split()
        start = rng.randint(0, max(0, len(words) - 8))
        return words[start : start + rng.randint(8, 16)]

    def pairs(pool, n):
        rows = []
        for i in range(n):
            a, b = pool[2 * i], pool[2 * i + 1]
            prompt = prompt_of(a)
            chosen = " " + " ".join(
                inject_numbers([strip_digits(w) or "x" for w in completion_of(a)], rng)
            )
            rejected = " " + strip_digits(" ".join(completion_of(b)))
            rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
        return rows

    pref = pairs(pref_pool, n_pref)
    test = pairs(test_pool, n_test)
    prompts = [{"prompt": prompt_of(s)} for s in prompt_pool[:n_prompts]]
    sft = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in pref]
    return prompts, pref, test, sft


def write_jsonl(path: Path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


@torch.no_grad()
def rm_scores(rm, tok, texts: list[str], bs: int = 64) -> torch.Tensor:
    out = []
    for i in range(0, len(texts), bs):
        enc = tok(
            texts[i : i + bs], return_tensors="pt", padding=True, truncation=True, max_length=128
        )
        out.append(rm(**enc).logits[:, 0])
    return torch.cat(out)


def pair_accuracy(rm, tok, rows) -> float:
    """Fraction of rows where prompt+chosen+EOS scores above prompt+rejected+EOS."""
    ch = rm_scores(rm, tok, [r["prompt"] + r["chosen"] + EOS for r in rows])
    rj = rm_scores(rm, tok, [r["prompt"] + r["rejected"] + EOS for r in rows])
    return (ch > rj).float().mean().item()


def fit_reward_model(rm, tok, pref, test, steps: int, batch: int, lr: float, seed: int):
    """Plain PyTorch Bradley-Terry fit (deliberately not using any RLHF library)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(rm.parameters(), lr=lr)
    rm.train()
    t0 = time.time()
    for step in range(steps):
        idx = torch.randint(0, len(pref), (batch,), generator=g).tolist()
        ch = [pref[i]["prompt"] + pref[i]["chosen"] + EOS for i in idx]
        rj = [pref[i]["prompt"] + pref[i]["rejected"] + EOS for i in idx]
        enc = tok(ch + rj, return_tensors="pt", padding=True, truncation=True, max_length=128)
        r = rm(**enc).logits[:, 0]
        loss = -torch.nn.functional.logsigmoid(r[:batch] - r[batch:]).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0 or step == steps - 1:
            print(
                f"  rm step {step:4d} loss {loss.item():.4f}  ({time.time() - t0:.0f}s)", flush=True
            )
    rm.eval()
    return pair_accuracy(rm, tok, test)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=str(pc.REPO / "runs" / "trl-assets"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--n-positions", type=int, default=256)
    ap.add_argument("--pretrain-steps", type=int, default=300)
    ap.add_argument("--pretrain-seq-len", type=int, default=128)
    ap.add_argument("--pretrain-batch", type=int, default=16)
    ap.add_argument("--rm-steps", type=int, default=100)
    ap.add_argument("--n-prompts", type=int, default=512)
    ap.add_argument("--n-pref", type=int, default=512)
    ap.add_argument("--n-test", type=int, default=128)
    args = ap.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    t_all = time.time()
    timings = {}

    corpus = get_corpus()
    (out / "corpus.txt").write_text(corpus)
    print(f"corpus: {len(corpus)} chars", flush=True)

    t = time.time()
    tok = train_tokenizer(corpus, args.vocab_size, out / "tokenizer")
    tok = PreTrainedTokenizerFast.from_pretrained(out / "tokenizer")  # round-trip what was saved
    timings["tokenizer_s"] = time.time() - t
    print(
        f"tokenizer: vocab={len(tok)} eos={tok.eos_token}({tok.eos_token_id}) pad={tok.pad_token}({tok.pad_token_id})"
    )

    # --- datasets ---
    rng = random.Random(args.seed)
    prompts, pref, test, sft = build_datasets(
        sentences(corpus), rng, args.n_prompts, args.n_pref, args.n_test
    )
    write_jsonl(out / "prompts.jsonl", prompts)
    write_jsonl(out / "preference.jsonl", pref)
    write_jsonl(out / "preference_test.jsonl", test)
    write_jsonl(out / "sft.jsonl", sft)
    print(f"datasets: prompts={len(prompts)} pref={len(pref)} test={len(test)} sft={len(sft)}")
    print("  example pref row:", json.dumps(pref[0]))

    # --- policy ---
    cfg = make_config(tok, args.n_layer, args.n_head, args.n_embd, args.n_positions)
    torch.manual_seed(args.seed)
    policy = GPT2LMHeadModel(cfg)
    n_params = sum(p.numel() for p in policy.parameters())
    print(
        f"policy: {n_params / 1e6:.2f}M params, torch threads={torch.get_num_threads()}", flush=True
    )
    ids = torch.tensor(tok(corpus.replace("\n\n", EOS))["input_ids"], dtype=torch.long)
    print(f"corpus tokens: {ids.numel()}")
    t = time.time()
    losses = pretrain(
        policy,
        ids,
        args.pretrain_steps,
        args.pretrain_seq_len,
        args.pretrain_batch,
        lr=1e-3,
        seed=args.seed,
    )
    timings["pretrain_s"] = time.time() - t
    policy.generation_config.pad_token_id = tok.pad_token_id
    policy.generation_config.eos_token_id = tok.eos_token_id
    policy.generation_config.bos_token_id = tok.bos_token_id
    policy.save_pretrained(out / "policy")
    tok.save_pretrained(out / "policy")  # so the dir is loadable as a model id by itself

    torch.manual_seed(args.seed)
    sample_in = tok(
        ["The import statement", "A function definition"], return_tensors="pt", padding=True
    )
    gen = policy.generate(
        **sample_in, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id
    )
    for g_ in gen:
        print("  sample:", repr(tok.decode(g_, skip_special_tokens=True)))

    # --- reward models ---
    torch.manual_seed(args.seed + 1)
    rm = GPT2ForSequenceClassification.from_pretrained(out / "policy", num_labels=1)
    rm.config.pad_token_id = tok.pad_token_id
    rm.save_pretrained(out / "reward_model_init")
    tok.save_pretrained(out / "reward_model_init")
    rm.eval()
    acc0 = pair_accuracy(rm, tok, test)
    t = time.time()
    acc = fit_reward_model(rm, tok, pref, test, args.rm_steps, batch=16, lr=1e-4, seed=args.seed)
    timings["rm_fit_s"] = time.time() - t
    rm.save_pretrained(out / "reward_model")
    tok.save_pretrained(out / "reward_model")
    print(f"reward model held-out accuracy: init={acc0:.3f} after fit={acc:.3f}")

    timings["total_s"] = time.time() - t_all
    manifest = {
        "seed": args.seed,
        "torch": torch.__version__,
        "config": {k: getattr(args, k) for k in vars(args)},
        "vocab_size": len(tok),
        "policy_params": n_params,
        "pretrain_loss_first": losses[0],
        "pretrain_loss_last": losses[-1],
        "rm_test_acc_init": acc0,
        "rm_test_acc": acc,
        "timings": timings,
        "files": {
            str(p.relative_to(out)): sha256(p)
            for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "manifest.json"
        },
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(json.dumps({k: v for k, v in manifest.items() if k != "files"}, indent=1))


if __name__ == "__main__":
    main()
