#!/usr/bin/env python3
"""Text <-> token ids with the tokenizers of tools/prepare_data.py, for lns_generate.

    python3 tools/tokens.py encode --tokenizer tokenizer.json < text   # ids on one line
    python3 tools/tokens.py decode --tokenizer tokenizer.json < ids    # the text (ids: spaces or commas)
    python3 tools/tokens.py eos --tokenizer tokenizer.json             # the end-of-document id

The tokenizer is what prepare_data.py takes ('byte', a Hugging Face tokenizer.json, a
SentencePiece .model), read by the same code, so generation decodes with the tokenizer
the corpus was prepared with. A failure is one line "tokens: ..." and exit status 1.
"""
import argparse
import re
import sys

import prepare_data


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["encode", "decode", "eos"])
    ap.add_argument("--tokenizer", required=True, help="'byte', a tokenizer.json or a SentencePiece .model")
    ap.add_argument("--eos_token", default="", help="end-of-document token (HF tokenizers), as prepare_data.py")
    args = ap.parse_args(argv)
    try:
        tok = prepare_data.make_tokenizer(args.tokenizer, args.eos_token)
        if args.command == "eos":
            print(tok.eos_id)
        elif args.command == "encode":
            text = sys.stdin.buffer.read().decode("utf-8", errors="replace")
            print(" ".join(str(i) for i in tok.encode(text)))
        else:
            ids = [int(t) for t in re.split(r"[\s,]+", sys.stdin.read()) if t]
            sys.stdout.buffer.write(tok.decode(ids).encode("utf-8"))
    except prepare_data.PrepareError as e:
        sys.exit("tokens: %s" % e)
    except ValueError as e:
        sys.exit("tokens: not a list of token ids (%s)" % e)


if __name__ == "__main__":
    main()
