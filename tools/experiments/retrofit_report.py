#!/usr/bin/env python3
"""Markdown summary of tools/experiments/retrofit_study.sh: validation loss of the
pre-trained Pre-LN model and of its LNS retrofit before fine-tuning (lns_eval), then
both arms' validation loss during fine-tuning (metrics.jsonl)."""
import json
import os
import sys


def val_curve(path):
    out = {}
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if "val_loss" in j:
                out[j["step"]] = j["val_loss"]
    return out


def main(root):
    with open(os.path.join(root, "eval_pre.json")) as f:
        pre = json.load(f)
    with open(os.path.join(root, "eval_retrofit.json")) as f:
        rf = json.load(f)
    lns = val_curve(os.path.join(root, "finetune_lns", "metrics.jsonl"))
    ctl = val_curve(os.path.join(root, "finetune_pre", "metrics.jsonl"))
    print("| model | validation loss | perplexity |\n|---|---|---|")
    print("| Pre-LN, pre-trained | %.4f | %.2f |" % (pre["loss"], pre["ppl"]))
    print("| its LNS retrofit, before fine-tuning | %.4f | %.2f |" % (rf["loss"], rf["ppl"]))
    print("\nJump from the retrofit: %+.4f nats.\n" % (rf["loss"] - pre["loss"]))
    print("Validation loss while fine-tuning (step = optimizer steps since initialisation):\n")
    print("| step | LNS retrofit | Pre-LN (untouched) | gap |\n|---|---|---|---|")
    for s in sorted(set(lns) & set(ctl)):
        print("| %d | %.4f | %.4f | %+.4f |" % (s, lns[s], ctl[s], lns[s] - ctl[s]))


if __name__ == "__main__":
    main(sys.argv[1])
