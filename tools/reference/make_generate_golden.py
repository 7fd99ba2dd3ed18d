#!/usr/bin/env python3
"""Writes tests/golden/generate/: a small LNS model trained on Debian's fortunes
(byte-level) and the tokens Hugging Face `transformers` generates from it greedily.

    python3 tools/reference/make_generate_golden.py --build build [--out_dir tests/golden/generate]

1. tools/prepare_data.py tokenizes /usr/share/games/fortunes (as launch/quickstart.sh);
2. lns_train trains a 2-layer LNS model on it (CPU, one rank, seed 48) and saves its
   checkpoint, which is committed as checkpoint/ (so CI needs no training and no torch);
3. lns_convert export-hf writes it as a LlamaForCausalLM (the LNS scales folded into the
   norm gains), and `LlamaForCausalLM.generate(do_sample=False)` in float32 continues each
   prompt of PROMPTS by MAX_NEW tokens;
4. expected.json records, per prompt, the prompt ids, the generated ids, and the smallest
   gap between the two largest logits over the generated steps (how far greedy is from a
   tie: a gap far above float32 rounding means any correct float32 implementation picks
   the same tokens), with the versions of torch and transformers.

tests/python/test_generate_cli.py (ctest generate_cli) runs lns_generate on the committed
checkpoint and on its export, and requires the same ids token for token.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))

# Byte-level prompts; [256] is an empty prompt: a new document after end-of-document.
PROMPTS = ["", "The ", "Q:\tWhat is the difference between", "A man who", "You will"]
MAX_NEW = 40
MODEL_FLAGS = ["--vocab_size=257", "--hidden_size=64", "--intermediate_size=128", "--num_layers=2",
               "--num_heads=4", "--num_kv_heads=2", "--norm_type=rmsnorm", "--norm_scheme=lns",
               "--init_std=0.02", "--embed_init_std=0.02"]
TRAIN_FLAGS = ["--data_mode=packed", "--seq_len=64", "--micro_batch_size=16", "--global_batch_size=16",
               "--steps=400", "--lr=3e-3", "--warmup_steps=40", "--min_lr_ratio=0.1", "--grad_clip=1.0",
               "--log_every=100", "--seed=48"]


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def prompt_ids(text):
    return [256] if text == "" else list(text.encode("utf-8"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory with lns_train, lns_convert")
    ap.add_argument("--out_dir", default=os.path.join(ROOT, "tests", "golden", "generate"))
    args = ap.parse_args()
    import torch
    import transformers

    torch.manual_seed(0)
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="lns_gen_golden_")
    fortunes = sorted(p for p in glob.glob("/usr/share/games/fortunes/*")
                      if os.path.isfile(p) and not p.endswith((".dat", ".u8")))
    if not fortunes:
        sys.exit("make_generate_golden: no text in /usr/share/games/fortunes (apt-get install fortunes)")
    data = os.path.join(tmp, "fortunes")
    run([sys.executable, os.path.join(ROOT, "tools", "prepare_data.py"), "--input", *fortunes, "--doc_sep", "fortune",
         "--val_fraction", "0.02", "--out", data, "--no_progress"])
    run_dir = os.path.join(tmp, "run")
    env = dict(os.environ, OMP_NUM_THREADS="2")
    run([os.path.join(args.build, "lns_train"), *MODEL_FLAGS, *TRAIN_FLAGS, "--data=%s.train.tok" % data,
         "--out_dir=%s" % run_dir], env=env)
    (ckpt,) = glob.glob(os.path.join(run_dir, "checkpoints", "step_*"))
    hf_dir = os.path.join(tmp, "hf")
    run([os.path.join(args.build, "lns_convert"), "export-hf", "--in=%s" % ckpt, "--out=%s" % hf_dir])

    model = transformers.LlamaForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None  # generate exactly MAX_NEW tokens (no stop token)
    model.generation_config.pad_token_id = 0
    cases = []
    for text in PROMPTS:
        ids = prompt_ids(text)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW,
                                 output_scores=True, return_dict_in_generate=True)
        new = out.sequences[0, len(ids):].tolist()
        gaps = []
        for step_scores in out.scores:
            top2 = torch.topk(step_scores[0], 2).values
            gaps.append(float(top2[0] - top2[1]))
        cases.append({"prompt": text, "prompt_ids": ids, "ids": new, "min_top2_gap": min(gaps),
                      "text": bytes(i for i in new if i < 256).decode("utf-8", errors="replace")})
        print("%r -> %r (smallest top-2 logit gap %.4f)" % (text, cases[-1]["text"], min(gaps)), flush=True)

    os.makedirs(args.out_dir, exist_ok=True)
    dst = os.path.join(args.out_dir, "checkpoint")
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(ckpt, dst)
    record = {"about": "greedy continuations of checkpoint/ by transformers' LlamaForCausalLM.generate on its "
                       "lns_convert export-hf (float32, CPU); tools/reference/make_generate_golden.py",
              "torch": torch.__version__, "transformers": transformers.__version__,
              "model_flags": MODEL_FLAGS, "train_flags": TRAIN_FLAGS, "max_new_tokens": MAX_NEW, "cases": cases}
    with open(os.path.join(args.out_dir, "expected.json"), "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    shutil.rmtree(tmp)
    print("wrote %s/{checkpoint/,expected.json}" % args.out_dir)


if __name__ == "__main__":
    main()
