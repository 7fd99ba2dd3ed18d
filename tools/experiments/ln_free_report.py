#!/usr/bin/env python3
"""Markdown summary of tools/experiments/ln_free_study.sh, per scheme (Pre-LN, LNS):
the pre-trained model's validation loss (lns_eval), the bump at each replacement (the
mean training loss of the 5 steps after it minus that of the 10 steps before), the
steps each wait took, and the final validation losses of the LN-free run and of the
control fine-tuned for the same steps with its norms (the gap), and the folded model
(lns_convert fold-norms of the final LN-free checkpoint) against that checkpoint, both by
lns_eval."""
import json
import os
import sys


def rows(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def arm(root, name):
    with open(os.path.join(root, "eval_pretrained_%s.json" % name)) as f:
        pretrained = json.load(f)
    lf = rows(os.path.join(root, "lnfree_%s" % name, "metrics.jsonl"))
    ctl = rows(os.path.join(root, "control_%s" % name, "metrics.jsonl"))
    loss = {r["step"]: r["loss"] for r in lf if "loss" in r}
    events = [(r["step"], r["ln_free_event"]) for r in lf if "ln_free_event" in r]
    val_lf = {r["step"]: r["val_loss"] for r in lf if "val_loss" in r}
    val_ctl = {r["step"]: r["val_loss"] for r in ctl if "val_loss" in r}
    return pretrained, loss, events, val_lf, val_ctl


def main(root):
    names = {"pre": "Pre-LN", "lns": "LNS"}
    arms = {a: arm(root, a) for a in ("pre", "lns") if os.path.exists(os.path.join(root, "control_%s" % a))}
    # the last step every run was evaluated at (the arms may have fine-tuned for different lengths)
    common = min(max(set(v[3]) & set(v[4])) for v in arms.values())
    print("Validation loss (nats/token, 8192 tokens of fortunes.val) of the pre-trained model, and after\n"
          "fine-tuning with the LN-free schedule and without it (the control keeps its norms):\n")
    print("| scheme | pre-trained | step | LN-free | control | gap | step | LN-free | control | gap |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    detail = []
    for a, (pretrained, loss, events, val_lf, val_ctl) in arms.items():
        last = max(set(val_lf) & set(val_ctl))
        print("| %s | %.4f | %d | %.4f | %.4f | %+.4f | %d | %.4f | %.4f | %+.4f |" % (
            names[a], pretrained["loss"], common, val_lf[common], val_ctl[common], val_lf[common] - val_ctl[common],
            last, val_lf[last], val_ctl[last], val_lf[last] - val_ctl[last]))
        detail.append("\n%s: replacements (training loss; bump = mean of the 5 steps after minus the 10 before):\n"
                      % names[a])
        detail.append("| first step after | event | why it fired | norms fixed | bump |\n|---|---|---|---|---|")
        for step, e in events:
            before = [loss[s] for s in range(step - 10, step) if s in loss]
            after = [loss[s] for s in range(step, step + 5) if s in loss]
            detail.append("| %d | `%s` | %s | %d | %+.4f |" % (step, e["entry"], e["reason"], e["fixed_total"],
                                                             mean(after) - mean(before)))
    print("\n".join(detail))
    folded = [a for a in arms if os.path.exists(os.path.join(root, "eval_folded_%s.json" % a))]
    if folded:
        print("\nThe final LN-free models with their norms folded away (lns_convert fold-norms; lns_eval, the\n"
              "same validation tokens):\n")
        print("| scheme | LN-free checkpoint | folded (no norms) | relative difference |\n|---|---|---|---|")
        for a in folded:
            with open(os.path.join(root, "eval_lnfree_%s.json" % a)) as f:
                lf = json.load(f)["loss"]
            with open(os.path.join(root, "eval_folded_%s.json" % a)) as f:
                fo = json.load(f)["loss"]
            print("| %s | %.6f | %.6f | %.1e |" % (names[a], lf, fo, abs(fo - lf) / abs(lf)))


if __name__ == "__main__":
    main(sys.argv[1])
