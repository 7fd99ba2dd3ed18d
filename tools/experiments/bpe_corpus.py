#!/usr/bin/env python3
"""Train a small byte-level BPE on the quickstart's fortunes corpus, offline, and write
lns token files with it (tools/prepare_data.py, format docs/data.md).

    python3 tools/experiments/bpe_corpus.py [--vocab 4096] [--out data/fortunes_bpe4k]

Writes OUT.tokenizer.json (a Hugging Face tokenizer.json), OUT.{train,val}.tok and
OUT.json. The BPE merges are learned from the training documents only: the same
documents, split by the same rule (prepare_data.is_validation) with the same
--val_fraction, so no validation text leaks into the vocabulary. Idempotent: does
nothing when the three outputs exist. Needs the `tokenizers` package; nothing is
downloaded.
"""
import argparse
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import prepare_data  # noqa: E402  (tools/prepare_data.py: document split and writer)

EOS = "<|endoftext|>"


def fortune_files(root):
    """The text files of Debian's fortunes package, as the quickstart picks them."""
    paths = sorted(p for p in glob.glob(os.path.join(root, "*"))
                   if os.path.isfile(p) and not p.endswith((".dat", ".u8")))
    if not paths:
        raise prepare_data.PrepareError("no text in %s (apt-get install fortunes)" % root)
    return paths


def training_documents(paths, val_fraction):
    """The documents prepare_data puts in the training split, in its order."""
    i = 0
    for path in paths:
        for text, _ in prepare_data.iter_file_documents(path, "text", "text", "fortune", "fatal",
                                                         prepare_data.Quiet(), [], warn=False):
            if not prepare_data.is_validation(i, val_fraction):
                yield text
            i += 1


def train_bpe(paths, vocab, val_fraction, out_json):
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise prepare_data.PrepareError("needs the 'tokenizers' package (pip install tokenizers)")
    tok = Tokenizer(models.BPE())
    # Byte-level: every UTF-8 string is encodable, no unknown token.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_documents(paths, val_fraction), trainer=trainer)
    tok.save(out_json)
    return tok.get_vocab_size(with_added_tokens=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=4096, help="BPE vocabulary size (with the end-of-document token)")
    ap.add_argument("--out", default="data/fortunes_bpe4k", help="output prefix")
    ap.add_argument("--fortunes", default="/usr/share/games/fortunes", help="directory of fortune files")
    ap.add_argument("--val_fraction", type=float, default=0.02)
    args = ap.parse_args(argv)
    if not 300 <= args.vocab <= 65536:
        print("bpe_corpus: --vocab=%d: expected 300..65536 (256 bytes + merges + EOS)" % args.vocab, file=sys.stderr)
        return 1
    outs = [args.out + s for s in (".tokenizer.json", ".train.tok", ".val.tok", ".json")]
    if all(os.path.exists(p) for p in outs):
        print("bpe_corpus: %s.* present" % args.out)
        return 0
    try:
        paths = fortune_files(args.fortunes)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)) or ".", exist_ok=True)
        n = train_bpe(paths, args.vocab, args.val_fraction, outs[0])
        print("bpe_corpus: BPE vocabulary %d -> %s" % (n, outs[0]))
        prepare_data.run(["--input", *paths, "--doc_sep", "fortune", "--val_fraction", str(args.val_fraction),
                          "--tokenizer", outs[0], "--eos_token", EOS, "--out", args.out, "--no_progress"])
    except prepare_data.PrepareError as e:
        print("bpe_corpus: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
