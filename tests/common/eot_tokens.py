"""The synthetic token file the LN-free and fold tests share (docs/ln_free.md).

Vocabulary 64, uint16 tokens; documents of 5 to 23 tokens, each ended by token 0, the
end-of-text id, so the schedule's end-of-text cases (attn_v:eot, drop_eot) have rows to act on.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import prepare_data  # noqa: E402


def write_eot_docs(path, n_docs):
    w = prepare_data.TokenFileWriter(path, 2, 64)
    for d in range(n_docs):
        w.add_doc([(d * 13 + i * 5) % 63 + 1 for i in range(4 + d % 19)] + [0])
    w.close()
