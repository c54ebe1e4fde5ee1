"""Train the bundled tokenizer and pretrain the bundled tiny GPT-2 on the Austen corpus.

Follows the GPT-2 recipe (Radford et al. 2019) at toy scale, nanoGPT-style: byte-level BPE,
documents (paragraphs) joined by ``<|endoftext|>``, next-token cross-entropy on random
windows of the token stream, AdamW (betas 0.9/0.95, weight decay 0.1 on matrices only),
a warmup-stable-decay learning rate. Departures: a 4096-token vocabulary trained on this
corpus, a distinct ``<|pad|>`` token, and no dropout (the model is trained for
few epochs, and RLHF wants train mode and eval mode to compute the same log-probs).

The architecture is fixed (n_layer=4, n_head=4, n_embd=256, n_positions=256, vocab 4096,
tied embeddings): it is also the benchmark workload of the PPO trainer.

The defaults are the bundled model's run (2000 steps of 8 x 128 tokens, one CPU thread: on a
busy 2-core machine a second thread mostly spins, using ~6x the CPU for the same step). It was
run as 1650 steps of a longer plan, then resumed with these ``--steps``/``--decay-steps``; the
warmup-stable-decay schedule makes that identical to one run. Log: ``base/training_log.json``.
Usage::

    python scripts/pretrain_base.py --bench 5   # time a few steps, fp32 vs bf16 autocast
    python scripts/pretrain_base.py             # train, checkpointing to --work-dir
    python scripts/pretrain_base.py --resume    # continue after a kill
"""

from __future__ import annotations

import argparse
import json
import logging
import lzma
import math
import shutil
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

log = logging.getLogger("pretrain_base")

ASSETS = Path(__file__).resolve().parents[1] / "src" / "rlhfkit" / "assets"
EOS, PAD = "<|endoftext|>", "<|pad|>"
VOCAB_SIZE = 4096
# Openings of held-out paragraphs (corpus test split), continued in training_log.json
SAMPLE_PROMPTS = [
    "The smile was returned as",
    "A very few lines from Edmund",
    "Catherine took up her work directly,",
    "He had remained in Shropshire,",
    "They walked towards the Lucases,",
]
ARCH = dict(n_layer=4, n_head=4, n_embd=256, n_positions=256, vocab_size=VOCAB_SIZE)


def read_corpus(split: str) -> list[str]:
    with lzma.open(ASSETS / "corpus" / f"{split}.jsonl.xz", "rt", encoding="ascii") as f:
        return [json.loads(line)["text"] for line in f]


def train_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """Byte-level BPE as in GPT-2, with EOS (also BOS) and PAD as the only special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {VOCAB_SIZE}")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        unk_token=EOS,
        pad_token=PAD,
        model_max_length=ARCH["n_positions"],
    )


def token_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """All paragraphs as one stream, each followed by EOS, so the model learns to stop."""
    ids = []
    for enc in tokenizer(texts)["input_ids"]:
        ids += enc + [tokenizer.eos_token_id]
    return torch.tensor(ids, dtype=torch.long)  # (N,)


def lr_at(step: int, args) -> float:
    """Warmup-stable-decay (Hu et al. 2024, MiniCPM): linear warmup, constant, then a linear
    decay to 10% over the last ``decay_steps``. Unlike cosine, the rate before the decay does
    not depend on ``--steps``, so a run can be extended by resuming with a larger ``--steps``
    and still equal a from-scratch run with that ``--steps``."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    into_decay = step - (args.steps - args.decay_steps)
    if into_decay <= 0:
        return args.lr
    return args.lr * (1.0 - 0.9 * min(1.0, into_decay / args.decay_steps))


def make_optimizer(model, args) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))


def random_windows(stream: torch.Tensor, batch: int, ctx: int, gen: torch.Generator):
    starts = torch.randint(0, len(stream) - ctx - 1, (batch,), generator=gen)
    return torch.stack([stream[s : s + ctx + 1] for s in starts.tolist()])  # (B, ctx+1)


def autocast(args):
    if args.bf16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return nullcontext()


def train_step(model, optimizer, window: torch.Tensor, args) -> float:
    with autocast(args):
        logits = model(window[:, :-1]).logits  # (B, ctx, V)
    loss = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)), window[:, 1:].reshape(-1)
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


@torch.no_grad()
def heldout_perplexity(model, stream: torch.Tensor, ctx: int, max_windows: int | None, args):
    """Per-token perplexity on consecutive non-overlapping windows of the test stream."""
    model.eval()
    n = (len(stream) - 1) // ctx
    if max_windows is not None:
        n = min(n, max_windows)
    total, count = 0.0, 0
    for i in range(0, n, 64):
        rows = range(i, min(n, i + 64))
        window = torch.stack([stream[r * ctx : r * ctx + ctx + 1] for r in rows])  # (b, ctx+1)
        with autocast(args):
            logits = model(window[:, :-1]).logits  # (b, ctx, V)
        nll = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.size(-1)), window[:, 1:].reshape(-1), reduction="sum"
        )
        total, count = total + nll.item(), count + window[:, 1:].numel()
    model.train()
    return math.exp(total / count)


@torch.no_grad()
def sample_continuations(model, tokenizer, seed: int) -> list[str]:
    """One seeded continuation (temperature 1, no filtering, 32 tokens) per SAMPLE_PROMPTS."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    texts = []
    for prompt in SAMPLE_PROMPTS:
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])  # (1, Tq)
        for _ in range(32):
            logits = model(ids).logits[:, -1].float()  # (1, V)
            token = torch.multinomial(logits.softmax(-1), 1, generator=gen)  # (1, 1)
            if token.item() == tokenizer.eos_token_id:
                break
            ids = torch.cat([ids, token], dim=1)
        texts.append(tokenizer.decode(ids[0]))
    model.train()
    return texts


def save_checkpoint(path: Path, model, optimizer, gen, step: int, stats: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "model": model.state_dict(),
            "optim": optimizer.state_dict(),
            "gen": gen.get_state(),
            "step": step,
            "stats": stats,
        },
        tmp,
    )
    tmp.replace(path)  # atomic: a kill mid-save leaves the previous checkpoint intact


def export(model, tokenizer, out: Path, log_record: dict) -> None:
    """Write fp16 safetensors + tokenizer + generation config; loads back as float32."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    half = GPT2LMHeadModel(model.config)
    half.load_state_dict(model.state_dict())
    half.half().save_pretrained(tmp, safe_serialization=True)
    # The stored tensors are fp16 for size; the declared dtype stays float32 so that a plain
    # from_pretrained (dtype "auto") hands back a float32 model for CPU training.
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(tmp)
    for path in tmp.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; installed copies must be world-readable
    GenerationConfig(
        do_sample=True,
        top_k=0,
        top_p=1.0,
        temperature=1.0,
        max_new_tokens=48,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(tmp)
    (tmp / "training_log.json").write_text(json.dumps(log_record, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def build(args):
    tok_dir = args.work_dir / "tokenizer"
    if tok_dir.exists():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    else:
        tokenizer = train_tokenizer(read_corpus("train"))
        tokenizer.save_pretrained(tok_dir)
    train = token_stream(tokenizer, read_corpus("train"))
    test = token_stream(tokenizer, read_corpus("test"))
    log.info("tokens: train %d, test %d", len(train), len(test))
    torch.manual_seed(args.seed)
    config = GPT2Config(
        **ARCH,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = GPT2LMHeadModel(config)
    return tokenizer, train, test, model


def bench(args, model, train) -> None:
    gen = torch.Generator().manual_seed(args.seed)
    for bf16 in (False, True):
        args.bf16 = bf16
        optimizer = make_optimizer(model, args)
        train_step(model, optimizer, random_windows(train, args.batch, args.ctx, gen), args)
        t0 = time.perf_counter()
        for _ in range(args.bench):
            train_step(model, optimizer, random_windows(train, args.batch, args.ctx, gen), args)
        dt = (time.perf_counter() - t0) / args.bench
        log.info("bf16=%s: %.3f s/step, %.0f tokens/s", bf16, dt, args.batch * args.ctx / dt)


def run(args, tokenizer, train, test, model) -> None:
    ckpt = args.work_dir / "checkpoint.pt"
    optimizer = make_optimizer(model, args)
    gen = torch.Generator().manual_seed(args.seed)
    step, stats = 0, {"wall_s": 0.0, "history": []}
    if args.resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        gen.set_state(state["gen"])
        step, stats = state["step"], state["stats"]
        log.info("resumed at step %d", step)
    model.train()
    t0, wall0, ema = time.perf_counter(), stats["wall_s"], None
    while step < args.steps:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        loss = train_step(model, optimizer, random_windows(train, args.batch, args.ctx, gen), args)
        ema = loss if ema is None else 0.98 * ema + 0.02 * loss
        step += 1
        stats["wall_s"] = wall0 + time.perf_counter() - t0
        if step % args.log_every == 0:
            log.info(
                "step %d loss %.4f (ema %.4f) lr %.2e %.0fs",
                step,
                loss,
                ema,
                lr_at(step, args),
                stats["wall_s"],
            )
        if step % args.eval_every == 0 or step == args.steps:
            ppl = heldout_perplexity(model, test, args.ctx, 100, args)
            stats["history"].append(
                {
                    "step": step,
                    "train_loss_ema": ema,
                    "heldout_ppl": ppl,
                    "wall_s": round(stats["wall_s"], 1),
                }
            )
            log.info("step %d held-out ppl (100 windows) %.2f", step, ppl)
        if step % args.ckpt_every == 0:
            save_checkpoint(ckpt, model, optimizer, gen, step, stats)
    final_ppl = heldout_perplexity(model, test, args.ctx, None, args)
    record = {
        "command": "python " + " ".join(sys.argv),
        "steps": step,
        "batch": args.batch,
        "context": args.ctx,
        "tokens_seen": step * args.batch * args.ctx,
        "train_tokens": len(train),
        "test_tokens": len(test),
        "epochs": round(step * args.batch * args.ctx / len(train), 2),
        "params": sum(p.numel() for p in model.parameters()),
        "wall_time_s": round(stats["wall_s"], 1),
        "final_train_loss_ema": round(ema, 4),
        "heldout_perplexity": round(final_ppl, 3),
        "bf16_autocast": args.bf16,
        "threads": torch.get_num_threads(),
        "seed": args.seed,
        "history": stats["history"],
        "samples": sample_continuations(model, tokenizer, args.seed),
    }
    log.info("final held-out perplexity %.3f", final_ppl)
    export(model, tokenizer, args.out, record)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--ctx", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--decay-steps", type=int, default=350)
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast on CPU")
    p.add_argument("--threads", type=int, default=1, help="1 wastes least CPU on a shared machine")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--bench", type=int, default=0, help="only time this many steps each way")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/rlhfkit_pretrain"))
    p.add_argument("--out", type=Path, default=ASSETS / "base")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(args.threads)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    tokenizer, train, test, model = build(args)
    if args.bench:
        bench(args, model, train)
    else:
        run(args, tokenizer, train, test, model)


if __name__ == "__main__":
    main()
