// lns_generate: text from a checkpoint (any layout, any scheme but the routed ones) or
// a Hugging Face LLaMA directory, with a key/value cache, on the CPU or CUDA.
//
//   lns_generate --checkpoint=runs/tiny_lns --prompt="The cat" --max_new_tokens=100
//   lns_generate --checkpoint=runs/x/checkpoints/step_0000300 --prompt_file=p.txt --temperature=0.8 --top_p=0.9
//   lns_generate --hf_dir=export/ --prompt_ids=1,2,3 --temperature=0 --format=json
//
// --checkpoint takes a step directory or a run directory (its latest checkpoint). The
// tokenizer is the one the training data was prepared with (--tokenizer=auto: the run's
// --data, then tools/prepare_data.py's record of it; an HF directory's tokenizer.json):
// byte-level in C++, a Hugging Face tokenizer.json or SentencePiece model through
// tools/tokens.py. docs/generation.md.
#include <gflags/gflags.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <absl/strings/strip.h>
#include <nlohmann/json.hpp>

#include "lns/checkpoint/checkpoint.h"
#include "lns/core/device.h"
#include "lns/core/errors.h"
#include "lns/core/files.h"
#include "lns/model/generate.h"
#include "lns/checkpoint/hf_llama.h"
#include "lns/model/ln_free.h"
#include "lns/model/stage.h"

DEFINE_string(checkpoint, "", "Checkpoint directory (any layout), or a run directory: its latest checkpoint.");
DEFINE_string(hf_dir, "", "Or: a Hugging Face LLaMA directory (lns_convert export-hf writes one).");
DEFINE_string(prompt, "", "The text to continue. Empty (and no --prompt_file / --prompt_ids): the model starts "
                          "after an end-of-document token, as a new document.");
DEFINE_string(prompt_file, "", "Or: a file holding the prompt text.");
DEFINE_string(prompt_ids, "", "Or: the prompt as token ids, e.g. 256,84,104 (any tokenizer, or none).");
DEFINE_int64(max_new_tokens, 200, "Tokens to generate at most (fewer when an end-of-document token comes).");
DEFINE_double(temperature, 1.0, "Sampling temperature; 0: greedy (the most likely token at each step).");
DEFINE_int32(top_k, 0, "Sample among the k most likely tokens only; 0: no limit.");
DEFINE_double(top_p, 1.0, "Then among the smallest set of most likely tokens whose probability reaches p; 1: all.");
DEFINE_string(tokenizer, "auto",
              "auto (the run's data record; an HF directory's tokenizer.json), byte, ids (no text: ids in and "
              "out), a tokenizer.json or SentencePiece .model, or tools/prepare_data.py's OUT.json");
DEFINE_bool(stop_at_eos, true, "End at the tokenizer's end-of-document token.");
DEFINE_string(format, "text", "text: the prompt and its continuation on stdout, as it comes; ids: the new "
                              "token ids on one line; json: prompt ids, new ids and text as one JSON object.");
DECLARE_uint64(seed);
DECLARE_string(device);

namespace lns {
namespace {

namespace fs = std::filesystem;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- tokenizers -------------------------------------------------------------------
// kind: "byte" (UTF-8 bytes, end-of-document 256: prepare_data.py's default), "ids"
// (none), "file" (a tokenizer.json or SentencePiece .model, through tools/tokens.py).
struct Tokenizer {
  std::string kind, file, source;  // source: where the choice came from, for the log
  int32_t eos = -1;
};

std::string read_text(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(flag, "=", path, ": cannot read the file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The run helper: tools/tokens.py COMMAND --tokenizer FILE, stdin -> stdout.
std::string run_tokens_py(const Tokenizer& t, const std::string& command, const std::string& input) {
  const fs::path dir = fs::temp_directory_path() / absl::StrFormat("lns_generate.%d", ::getpid());
  fs::create_directories(dir);
  const std::string in = (dir / "in").string(), out = (dir / "out").string(), err = (dir / "err").string();
  write_file_atomically(in, input);
  const std::string cmd = absl::StrFormat("python3 '%s/tools/tokens.py' %s --tokenizer '%s' < '%s' > '%s' 2> '%s'",
                                          LNS_SOURCE_DIR, command, t.file, in, out, err);
  const int rc = std::system(cmd.c_str());
  std::string result, message;
  {
    std::ifstream o(out, std::ios::binary), e(err);
    std::stringstream so, se;
    so << o.rdbuf(), se << e.rdbuf();
    result = so.str(), message = se.str();
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (rc != 0) {
    const std::string line = message.substr(0, message.find('\n'));
    fail("--tokenizer=", t.file, ": tools/tokens.py ", command, " failed: ", line.empty() ? "(no message)" : line);
  }
  return result;
}

std::vector<int32_t> parse_ids(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  for (absl::string_view s : absl::StrSplit(text, absl::ByAnyChar(", \n\t"), absl::SkipEmpty())) {
    int32_t v;
    if (!absl::SimpleAtoi(s, &v) || v < 0) fail(what, ": '", std::string(s), "' is not a token id (an integer >= 0)");
    ids.push_back(v);
  }
  return ids;
}

std::vector<int32_t> encode(const Tokenizer& t, const std::string& text) {
  if (t.kind == "byte") return std::vector<int32_t>(reinterpret_cast<const uint8_t*>(text.data()),
                                                    reinterpret_cast<const uint8_t*>(text.data()) + text.size());
  LNS_CHECK(t.kind == "file");
  return parse_ids(run_tokens_py(t, "encode", text), "tools/tokens.py encode");
}

// Byte-level text of ids: the bytes (a character split over tokens comes out whole),
// the end-of-document token as nothing.
std::string byte_text(const std::vector<int32_t>& ids) {
  std::string s;
  for (const int32_t id : ids)
    if (id >= 0 && id < 256) s.push_back(static_cast<char>(id));
  return s;
}

std::string decode(const Tokenizer& t, const std::vector<int32_t>& ids) {
  if (t.kind == "byte") return byte_text(ids);
  if (t.kind == "ids") return absl::StrJoin(ids, " ");
  return run_tokens_py(t, "decode", absl::StrJoin(ids, " "));
}

// A tokenizer named by a file: prepare_data.py's record (OUT.json, or manifest.json of
// --shards), or the tokenizer itself.
Tokenizer tokenizer_from_file(const std::string& path, const std::string& source) {
  Tokenizer t;
  t.source = source;
  if (absl::EndsWith(path, ".json")) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_text(path, "--tokenizer"));
    } catch (const nlohmann::json::exception& e) {
      fail(source, ": ", path, " is not JSON (", e.what(), ")");
    }
    if (j.is_object() && j.contains("tokenizer") && j["tokenizer"].is_string()) {  // prepare_data's record
      const std::string name = j["tokenizer"];
      Tokenizer r = name == "byte" ? Tokenizer{"byte", "", "", 256} : tokenizer_from_file(name, source);
      if (j.contains("eos_id") && j["eos_id"].is_number_integer()) r.eos = j["eos_id"];
      r.source = absl::StrCat(source, " (", path, ": tokenizer ", name, ")");
      return r;
    }
  }
  if (!fs::is_regular_file(path)) fail(source, ": ", path, " is not a file");
  t.kind = "file", t.file = fs::absolute(path).string();
  t.eos = parse_ids(run_tokens_py(t, "eos", ""), "tools/tokens.py eos").at(0);
  return t;
}

// prepare_data.py's record of a --data value: OUT.json beside OUT.train.tok, or a
// sharded corpus's manifest.json above its index.json. "" when there is none.
std::string data_record(const std::string& data) {
  // several sources, or a weighted blend (0.7:A,0.3:B): the first (they share a tokenizer)
  std::string path = data.substr(0, data.find(','));
  if (const size_t colon = path.find(':'); colon != std::string::npos) {
    double w;
    if (absl::SimpleAtod(path.substr(0, colon), &w)) path = path.substr(colon + 1);
  }
  for (const char* suffix : {".train.tok", ".val.tok", ".tok"})
    if (absl::EndsWith(path, suffix)) {
      const std::string rec = path.substr(0, path.size() - strlen(suffix)) + ".json";
      if (fs::is_regular_file(rec)) return rec;
    }
  const fs::path p(path);
  for (const fs::path& rec : {p.parent_path().parent_path() / "manifest.json", p.parent_path() / "manifest.json",
                              p / "manifest.json"})
    if (fs::is_regular_file(rec)) return rec.string();
  return "";
}

Tokenizer resolve_tokenizer(const std::string& run_dir) {
  const std::string& flag = FLAGS_tokenizer;
  if (flag == "byte") return {"byte", "", "--tokenizer=byte", 256};
  if (flag == "ids") return {"ids", "", "--tokenizer=ids", -1};
  if (flag != "auto") return tokenizer_from_file(flag, "--tokenizer=" + flag);
  if (!FLAGS_hf_dir.empty()) {
    const fs::path tj = fs::path(FLAGS_hf_dir) / "tokenizer.json";
    if (fs::is_regular_file(tj)) return tokenizer_from_file(tj.string(), tj.string());
    fail("--tokenizer=auto: ", FLAGS_hf_dir, " has no tokenizer.json; give --tokenizer=byte, a tokenizer file, "
         "prepare_data.py's OUT.json, or ids");
  }
  const fs::path flags = fs::path(run_dir) / "config.flags";
  std::string data;
  if (fs::is_regular_file(flags)) {
    std::istringstream in(read_text(flags.string(), "--checkpoint"));
    for (std::string line; std::getline(in, line);)
      if (absl::StartsWith(line, "--data=")) data = line.substr(7);
  }
  if (data.empty() || data == "random")
    fail("--tokenizer=auto: no training data recorded for ", FLAGS_checkpoint, " (", flags.string(),
         data == "random" ? " says --data=random" : " names no --data",
         "); give --tokenizer=byte, a tokenizer file, prepare_data.py's OUT.json, or ids");
  // A relative --data is relative to where lns_train ran: here, or (runs/NAME, as the
  // configs have it) two levels above the run directory.
  std::string rec = data_record(data);
  if (rec.empty() && fs::path(data).is_relative())
    rec = data_record((fs::path(run_dir).parent_path().parent_path() / data).string());
  if (rec.empty())
    fail("--tokenizer=auto: the run's --data=", data, " has no tools/prepare_data.py record beside it (OUT.json); "
         "give --tokenizer=byte, a tokenizer file, prepare_data.py's OUT.json, or ids");
  return tokenizer_from_file(rec, "the run's --data=" + data);
}

// ---- the model ------------------------------------------------------------------------
struct Model {
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<HfDirectory> hf;
  LlamaConfig cfg;
  std::string run_dir;  // a checkpoint's run directory (for the tokenizer), "" for --hf_dir
};

Model open_model() {
  Model m;
  LNS_REQUIRE(FLAGS_checkpoint.empty() != FLAGS_hf_dir.empty(), "give exactly one of --checkpoint and --hf_dir");
  if (!FLAGS_hf_dir.empty()) {
    m.hf = std::make_unique<HfDirectory>(FLAGS_hf_dir);
    m.cfg = m.hf->config();
    return m;
  }
  std::string dir = FLAGS_checkpoint;
  if (fs::is_directory(fs::path(dir) / "checkpoints")) {  // a run directory
    const std::string latest = find_latest_checkpoint(dir);
    if (latest.empty()) fail("--checkpoint=", dir, ": a run directory without a checkpoint yet");
    dir = latest;
  }
  m.ck = std::make_unique<Checkpoint>(dir);
  m.cfg = m.ck->config();
  // step_XXXXXXX lives in <run>/checkpoints/
  fs::path p = fs::absolute(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "dir/"
  m.run_dir = p.parent_path().parent_path().string();
  return m;
}

std::vector<int32_t> prompt_ids(const Tokenizer& tok) {
  const int given = !FLAGS_prompt.empty() + !FLAGS_prompt_file.empty() + !FLAGS_prompt_ids.empty();
  LNS_REQUIRE(given <= 1, "give at most one of --prompt, --prompt_file and --prompt_ids");
  if (!FLAGS_prompt_ids.empty()) return parse_ids(FLAGS_prompt_ids, "--prompt_ids");
  const std::string text = !FLAGS_prompt_file.empty() ? read_text(FLAGS_prompt_file, "--prompt_file") : FLAGS_prompt;
  if (tok.kind == "ids")
    LNS_REQUIRE(text.empty(), "--tokenizer=ids: give the prompt as --prompt_ids");
  std::vector<int32_t> ids = text.empty() ? std::vector<int32_t>{} : encode(tok, text);
  if (ids.empty()) {  // start a new document, as the training data does after one ends
    LNS_REQUIRE(tok.eos >= 0, "an empty prompt starts after an end-of-document token, and --tokenizer=", tok.kind,
                " has none; give --prompt_ids");
    ids.push_back(tok.eos);
  }
  return ids;
}

int run() {
  const Model m = open_model();
  SamplingConfig sc{static_cast<float>(FLAGS_temperature), FLAGS_top_k, static_cast<float>(FLAGS_top_p), FLAGS_seed};
  check_sampling(sc);
  LNS_REQUIRE(FLAGS_max_new_tokens >= 1, "--max_new_tokens must be >= 1, got ", FLAGS_max_new_tokens);
  LNS_REQUIRE(FLAGS_format == "text" || FLAGS_format == "ids" || FLAGS_format == "json",
              "--format must be text, ids or json, got '", FLAGS_format, "'");
  const Tokenizer tok = resolve_tokenizer(m.run_dir);
  LNS_REQUIRE(tok.kind != "byte" || m.cfg.vocab_size >= 257, "--tokenizer: byte-level needs a vocabulary of 257 ",
              "(bytes and end-of-document), the model has ", m.cfg.vocab_size);
  const std::vector<int32_t> prompt = prompt_ids(tok);
  for (const int32_t id : prompt)
    LNS_REQUIRE(id < m.cfg.vocab_size, "the prompt holds token id ", id, ", outside the model's vocabulary of ",
                m.cfg.vocab_size);
  const Device device = parse_device(FLAGS_device);
  if (device == Device::CUDA) bind_local_gpu(local_rank_from_env());
  if (m.ck && m.ck->run_state().training.seq_len > 0 &&
      int64_t(prompt.size()) + FLAGS_max_new_tokens > m.ck->run_state().training.seq_len)
    std::fprintf(stderr, "lns_generate: warning: %zu prompt + %ld new tokens is longer than the %ld positions the "
                 "model was trained at: later positions were never trained\n",
                 prompt.size(), static_cast<long>(FLAGS_max_new_tokens),
                 static_cast<long>(m.ck->run_state().training.seq_len));

  LlamaStage stage(m.cfg, StageSpec::whole(m.cfg), 1, 1, 1, {}, device);
  const TensorSource& src = m.ck ? static_cast<const TensorSource&>(*m.ck) : *m.hf;
  load_from_source(src, stage.params(), nullptr);
  if (m.ck) apply_ln_free(m.ck->run_state().ln_free, stage);  // LN-free: constant divisors (docs/ln_free.md)
  std::fprintf(stderr, "lns_generate: %s (%s, %d layers) on %s; tokenizer %s from %s\n", src.where().c_str(),
               norm_scheme_name(m.cfg.norm_scheme), m.cfg.num_layers, FLAGS_device.c_str(), tok.kind.c_str(),
               tok.source.c_str());

  GenerateOptions opt;
  opt.max_new_tokens = FLAGS_max_new_tokens;
  opt.sampling = sc;
  if (FLAGS_stop_at_eos && tok.eos >= 0) opt.stop_ids = {tok.eos};
  // Byte-level text streams as it comes; other tokenizers decode once at the end.
  const bool stream = FLAGS_format == "text" && tok.kind == "byte";
  if (stream) {
    std::fputs(byte_text(prompt).c_str(), stdout);
    std::fflush(stdout);
  }
  const double t0 = now();
  const std::vector<int32_t> out = generate(stage, prompt, opt, [&](int32_t id) {
    if (!stream) return;
    const std::string s = byte_text({id});
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  });
  const double secs = now() - t0;
  const bool stopped = !out.empty() && !opt.stop_ids.empty() && out.back() == opt.stop_ids[0];
  std::vector<int32_t> text_ids(out.begin(), out.end() - (stopped ? 1 : 0));
  if (FLAGS_format == "text") {
    if (!stream) std::fputs((decode(tok, prompt) + decode(tok, text_ids)).c_str(), stdout);
    std::fputs("\n", stdout);
  } else if (FLAGS_format == "ids") {
    std::printf("%s\n", absl::StrJoin(out, " ").c_str());
  } else {
    nlohmann::json j = {{"prompt_ids", prompt}, {"ids", out}, {"stopped_at_eos", stopped}};
    if (tok.kind != "ids") {
      const std::string text = decode(tok, text_ids);
      // json::dump refuses invalid UTF-8: a byte-level cut mid-character is replaced.
      j["text"] = text;
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("%s\n", j.dump().c_str());
    }
  }
  std::fflush(stdout);
  std::fprintf(stderr, "lns_generate: %zu prompt tokens, %zu new in %.2f s (%.1f tokens/s)%s\n", prompt.size(),
               out.size(), secs, out.size() / std::max(secs, 1e-9), stopped ? ", ended at end-of-document" : "");
  return 0;
}

}  // namespace
}  // namespace lns

int main(int argc, char** argv) {
  gflags::SetUsageMessage("lns_generate --checkpoint=DIR|--hf_dir=DIR [--prompt=TEXT|--prompt_file=F|--prompt_ids=1,2] "
                          "[--max_new_tokens=N] [--temperature=T] [--top_k=K] [--top_p=P] [--seed=S]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  google::InitGoogleLogging(argv[0]);
  if (argc != 1) {
    std::fprintf(stderr, "lns_generate: error: unexpected argument '%s'; see --help\n", argv[1]);
    return 1;
  }
  return lns::main_guard("lns_generate", lns::run);
}
