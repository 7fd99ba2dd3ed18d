#!/usr/bin/env python3
"""Run records of the small CPU studies whose run folders are not kept (issue 45): the
LNS retrofit (retrofit_report.py) and the LN-free study (ln_free_report.py). One place
for what both need: reading a run folder (config.flags, metrics.jsonl, an lns_eval JSON),
writing a record, loading a folder of records with every field a page figure comes from
checked (a missing one is refused: the page states no figure without a record), and the
model shape and budget of a run for study_budget.py.

A record is one JSON per seed, docs/<study>_runs/seed<N>.json, with "study", "seed",
"config" (the study script's settings), "flags" (lns_train's config.flags of a fine-tuning
run: the model and the batch), "source_revision", "started" and "seconds", and the
study's figures (see each report).
"""
import json
import math
import os

import doc_markers
import study_stats


class StudyError(Exception):
    """A one-line reason why a record or a page cannot be written."""


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise StudyError("%s: cannot read (%s)" % (path, e.strerror))
    except json.JSONDecodeError as e:
        raise StudyError("%s: not JSON (%s)" % (path, e))


def read_flags(path):
    """lns_train's config.flags: {name: text}."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("--") and "=" in line:
                    k, v = line[2:].split("=", 1)
                    out[k] = v
    except OSError as e:
        raise StudyError("%s: cannot read (%s)" % (path, e.strerror))
    return out


def read_metrics(path):
    """metrics.jsonl -> (validation [[step, loss]], training [[step, loss]], ln_free
    events [{step, entry, reason, fixed_total}]); a resumed run repeats steps: last wins."""
    val, train, events = {}, {}, []
    try:
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not isinstance(r.get("step"), int):
                    continue
                if "val_loss" in r:
                    val[r["step"]] = r["val_loss"]
                if "loss" in r and "ln_free_event" not in r:
                    train[r["step"]] = r["loss"]
                if "ln_free_event" in r:
                    e = r["ln_free_event"]
                    events.append(dict(step=r["step"], entry=e["entry"], reason=e["reason"],
                                       fixed_total=e["fixed_total"]))
    except OSError as e:
        raise StudyError("%s: cannot read (%s)" % (path, e.strerror))
    return [list(p) for p in sorted(val.items())], [list(p) for p in sorted(train.items())], events


def run_info(run_dir):
    """What a run folder says of itself: its flags, revision and start time."""
    info = read_json(os.path.join(run_dir, "run.json"))
    return dict(flags=read_flags(os.path.join(run_dir, "config.flags")),
                source_revision=info.get("source_revision"), started=info.get("started"))


def write_record(path, rec):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)


def finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_fields(rec, path, fields):
    """fields: dotted names ('eval_pre.loss') that must be finite numbers or non-empty
    lists in REC; the first missing one is refused, naming the file and the field."""
    for name in fields:
        v = rec
        for part in name.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        if v is None or (isinstance(v, list) and not v) or not (finite(v) or isinstance(v, (list, dict, str))):
            raise StudyError("%s: no '%s': every figure of the page comes from a record; rerun the study's "
                             "script for this seed" % (path, name))


def load_records(folder, study, fields):
    """Every seed<N>.json under FOLDER of STUDY, checked; refused when there are none."""
    if not os.path.isdir(folder):
        raise StudyError("%s: no records folder (run the study's script; it writes one record per seed)" % folder)
    recs = []
    for n in sorted(os.listdir(folder)):
        if n.endswith(".json"):
            path = os.path.join(folder, n)
            r = read_json(path)
            if r.get("study") != study:
                raise StudyError("%s: 'study' is %r, expected %r" % (path, r.get("study"), study))
            check_fields(r, path, ["seed", "config", "flags", "seconds"] + list(fields))
            r["_path"] = path
            recs.append(r)
    if not recs:
        raise StudyError("%s: no records of the %s study: the page states no figure without one" % (folder, study))
    seeds = [r["seed"] for r in recs]
    if len(set(seeds)) != len(seeds):
        raise StudyError("%s: seed %s recorded twice" % (folder, [s for s in seeds if seeds.count(s) > 1][0]))
    configs = {json.dumps(r["config"], sort_keys=True) for r in recs}
    if len(configs) > 1:
        raise StudyError("%s: the records were run with different settings (%s); one page holds one study" % (
            folder, " / ".join(sorted(configs))))
    return sorted(recs, key=lambda r: r["seed"])


def shape_of_flags(flags):
    """The model shape and batch a run's flags give (depth_study.shape_of's form)."""
    return dict(hidden=int(flags["hidden_size"]), heads=int(flags["num_heads"]),
                kv_heads=int(flags.get("num_kv_heads", flags["num_heads"])),
                intermediate=int(flags["intermediate_size"]), seq=int(flags["seq_len"]),
                batch=int(flags["global_batch_size"]))


def mean_sd(xs, digits=4, sign=False):
    """'2.2476 ± 0.0012 (3)' (mean ± sample std (seeds)) or '2.2476 (1)'; sign: '+0.1295'."""
    f = "%%%s.%df" % ("+" if sign else "", digits)
    if len(xs) == 1:
        return (f + " (1)") % xs[0]
    return (f + (" ± %%.%df (%%d)" % digits)) % (study_stats.mean(xs), math.sqrt(study_stats.var(xs)), len(xs))


def fmt_paired(d, digits=4):
    """Per-seed differences: '+0.2187 ± 0.0100 (paired t = 21.9, df 2, p = 0.002)'; one seed:
    the difference and 'one seed: no test'."""
    p = study_stats.paired(d)
    if p is None:
        return ("%%+.%df (one seed: no test)" % digits) % d[0]
    return study_stats.fmt_paired(p, digits)


def write_page(args, study, fields, render, plot, begin, end):
    """A report's --records part, the same for every small study: the page from the
    records (written between its markers with --doc, else printed) and --plot."""
    if not args.records:
        if not args.run:
            raise StudyError("give a run folder, or --records")
        return
    recs = load_records(args.records, study, fields)
    body = render(recs)
    if args.doc:
        doc_markers.replace_between(args.doc, begin, end, body)
    else:
        print(body)
    if args.plot:
        plot(recs, args.plot)
