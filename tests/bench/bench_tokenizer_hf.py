#!/usr/bin/env python3
"""Hugging Face `tokenizers` on the text bench_tokenizer.c encodes, for the
same table: English prose (the prose and corpus cases of the neox-like
fixture, one per line, repeated to --mb MB), one core (RAYON_NUM_THREADS=1,
TOKENIZERS_PARALLELISM=false), encoded as one text and line by line, then
decoded. Run it where `tokenizers` is installed (the GPU machine):

    python3 tests/bench/bench_tokenizer_hf.py --fixtures ../shared/fixtures --mb 8
"""
import argparse
import json
import os
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tokenizers  # noqa: E402  (after the thread settings)


def build_text(fixtures, want):
    one = []
    with open(os.path.join(fixtures, "tokenizers", "neox-like", "cases.jsonl"), encoding="utf-8") as f:
        for line in f:
            c = json.loads(line)
            kind = c.get("kind", "")
            if (kind == "prose" or kind.startswith("corpus_")) and c["text"]:
                one.append(c["text"] + "\n")
    one = "".join(one).encode("utf-8")
    out = bytearray()
    while len(out) < want:
        out += one
    return out.decode("utf-8")


def best(fn, reps):
    t = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=os.environ.get("MBD_FIXTURES_DIR", "../shared/fixtures"))
    ap.add_argument("--mb", type=float, default=8)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    text = build_text(a.fixtures, int(a.mb * 1e6))
    nbytes = len(text.encode("utf-8"))
    lines = text.splitlines(keepends=True)
    print(f"### Hugging Face tokenizers {tokenizers.__version__}, one core: English prose "
          f"({nbytes / 1e6:.1f} MB, best of {a.reps})\n")
    print("| tokenizer | encode, one text MB/s | encode, per line MB/s | tokens/s (per line) | decode MB/s | bytes/token |")
    print("|---|---|---|---|---|---|")
    for name in ("neox-like", "qwen3", "gpt4o"):
        tok = tokenizers.Tokenizer.from_file(os.path.join(a.fixtures, "tokenizers", name, "tokenizer.json"))
        ids = tok.encode(text, add_special_tokens=False).ids
        t_whole = best(lambda: tok.encode(text, add_special_tokens=False), a.reps)
        t_lines = best(lambda: [tok.encode(s, add_special_tokens=False) for s in lines], a.reps)
        t_dec = best(lambda: tok.decode(ids, skip_special_tokens=False), a.reps)
        mb = nbytes / 1e6
        print(f"| {name} | {mb / t_whole:.1f} | {mb / t_lines:.1f} | {len(ids) / t_lines / 1e6:.2f}M | "
              f"{mb / t_dec:.0f} | {nbytes / len(ids):.2f} |")


if __name__ == "__main__":
    main()
