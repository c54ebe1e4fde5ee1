"""Build the bundled Jane Austen corpus from Debian's ``r-cran-janeaustenr`` package.

The R package (MIT, by Julia Silge) ships the six Project Gutenberg novels as R character
vectors (one element per printed line) in ``data/Rdata.rdb``. That file is R's lazy-load
database: a series of blocks, each a 4-byte big-endian uncompressed length followed by a zlib
stream holding one object in R's XDR serialisation format. We parse just enough of that format
(header, one STRSXP of CHARSXPs) to get the lines back, with no R installation.

Cleaning: drop front matter and chapter/volume headings, join wrapped lines into paragraphs,
strip Gutenberg's ``_italic_`` underscores, normalise quotes and dashes to ASCII, collapse
whitespace. Split: the last ``--test-fraction`` of each novel's paragraphs is held out (a
contiguous tail, so test text is never interleaved with training text).

Output: ``src/rlhfkit/assets/corpus/{train,test}.jsonl.xz`` with one ``{"book", "text"}``
paragraph per line, and ``words.txt.xz``: every lower-cased word of the six novels, which the
gold judge of ``rlhfkit.tasks`` uses to tell words from non-words.

Usage::

    apt-get download r-cran-janeaustenr
    python scripts/build_corpus.py --deb r-cran-janeaustenr_1.0.0-1_all.deb
"""

from __future__ import annotations

import argparse
import json
import logging
import lzma
import re
import struct
import subprocess
import tempfile
import unicodedata
import zlib
from pathlib import Path

log = logging.getLogger("build_corpus")

OUT_DIR = Path(__file__).resolve().parents[1] / "src" / "rlhfkit" / "assets" / "corpus"
RDB_IN_DEB = "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"

STRSXP, CHARSXP = 16, 9
HEADING = re.compile(r"^(chapter|volume)\s+[\divxlc]+\.?$|^(the end|finis)\.?$", re.IGNORECASE)
WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")  # keep in sync with rlhfkit.tasks.WORD
ASCII_MAP = {
    "\u2018": "'",
    "\u2019": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u2014": "--",
    "\u2013": "-",
    "\u00a3": "L",  # pound sign, as in "L10,000 a year" elsewhere in the Gutenberg texts
}


def iter_rdb_blocks(data: bytes):
    """Yield each decompressed block of an R lazy-load database."""
    pos = 0
    while pos < len(data):
        (size,) = struct.unpack(">I", data[pos : pos + 4])
        inflater = zlib.decompressobj()
        block = inflater.decompress(data[pos + 4 :])
        if len(block) != size:
            raise ValueError(f"rdb block at byte {pos}: expected {size} bytes, got {len(block)}")
        pos = len(data) - len(inflater.unused_data)
        yield block


def parse_character_vector(block: bytes) -> list[str]:
    """Parse an R XDR serialisation (version 3) of a plain character vector."""
    if block[:2] != b"X\n":
        raise ValueError("not an XDR R serialisation")
    version, _, _, enc_len = struct.unpack(">iiii", block[2:18])
    if version != 3:
        raise ValueError(f"unsupported serialisation version {version}")
    pos = 18 + enc_len  # skip the native-encoding name ("UTF-8")
    flags, length = struct.unpack(">ii", block[pos : pos + 8])
    if flags & 0xFF != STRSXP:
        raise ValueError(f"expected a character vector (STRSXP), got SEXP type {flags & 0xFF}")
    pos += 8
    lines = []
    for _ in range(length):
        flags, nchar = struct.unpack(">ii", block[pos : pos + 8])
        pos += 8
        if flags & 0xFF != CHARSXP:
            raise ValueError(f"expected CHARSXP, got SEXP type {flags & 0xFF}")
        if nchar < 0:  # NA_character_
            lines.append("")
            continue
        lines.append(block[pos : pos + nchar].decode("utf-8"))
        pos += nchar
    return lines


def to_ascii(text: str) -> str:
    """Normalise typography to ASCII so a small byte-level vocabulary is spent on words."""
    for src, dst in ASCII_MAP.items():
        text = text.replace(src, dst)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"_([^_]+)_", r"\1", text)  # Gutenberg marks italics as _word_
    text = text.replace("_", "")
    return re.sub(r"\s+", " ", text).strip()


def paragraphs(lines: list[str]) -> list[str]:
    """Join wrapped lines into paragraphs, dropping front matter and headings."""
    first_heading = next(i for i, line in enumerate(lines) if HEADING.match(line.strip()))
    paras, current = [], []
    for line in lines[first_heading:] + [""]:
        stripped = line.strip()
        if stripped and not HEADING.match(stripped):
            current.append(stripped)
            continue
        if current:
            text = to_ascii(" ".join(current))
            if len(text) > 1:  # drop stray decorations such as a lone "*"
                paras.append(text)
            current = []
    return paras


def load_novels(rdb: Path) -> dict[str, list[str]]:
    novels = {}
    for block in iter_rdb_blocks(rdb.read_bytes()):
        lines = parse_character_vector(block)
        title = lines[0].strip().title()
        novels[title] = paragraphs(lines)
    return novels


def write_jsonl_xz(path: Path, rows: list[dict]) -> None:
    text = "".join(json.dumps(row, ensure_ascii=True) + "\n" for row in rows)
    # preset 9 | extreme, and no timestamps in the xz format: the file is byte-reproducible
    path.write_bytes(lzma.compress(text.encode("ascii"), preset=9 | lzma.PRESET_EXTREME))


def vocabulary(paras: list[str]) -> list[str]:
    """Sorted distinct words, tokenised exactly as ``rlhfkit.tasks.words`` does."""
    return sorted({w for p in paras for w in WORD.findall(p.lower())})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--deb", type=Path, help="r-cran-janeaustenr .deb (from apt-get download)")
    src.add_argument("--rdb", type=Path, help="an already extracted data/Rdata.rdb")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--test-fraction", type=float, default=0.1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    with tempfile.TemporaryDirectory() as tmp:
        rdb = args.rdb
        if args.deb is not None:
            subprocess.run(["dpkg-deb", "-x", str(args.deb), tmp], check=True)
            rdb = Path(tmp) / RDB_IN_DEB
        novels = load_novels(rdb)

    train, test = [], []
    for book, paras in sorted(novels.items()):
        cut = int(len(paras) * (1 - args.test_fraction))
        train += [{"book": book, "text": p} for p in paras[:cut]]
        test += [{"book": book, "text": p} for p in paras[cut:]]
        words = sum(len(p.split()) for p in paras)
        log.info(
            "%-22s %5d paragraphs %7d words (test: last %d)",
            book,
            len(paras),
            words,
            len(paras) - cut,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl_xz(args.out / "train.jsonl.xz", train)
    write_jsonl_xz(args.out / "test.jsonl.xz", test)
    words = vocabulary([p for paras in novels.values() for p in paras])
    (args.out / "words.txt.xz").write_bytes(lzma.compress("\n".join(words).encode() + b"\n"))
    log.info(
        "train %d, test %d paragraphs, %d distinct words -> %s",
        len(train),
        len(test),
        len(words),
        args.out,
    )


if __name__ == "__main__":
    main()
