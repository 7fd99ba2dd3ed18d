// safetensors reading and writing, and loading weights by name: round trips, the
// layout other readers require (sorted, contiguous, 8-byte aligned data), and a
// clear UserError naming the file for every kind of damage.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "lns/core/bf16.h"
#include "lns/core/errors.h"
#include "lns/checkpoint/param_io.h"
#include "lns/model/stage.h"
#include "test_util.h"

namespace lns {
namespace {

using namespace lns::test;

std::string tmp_path(const std::string& name) {
  return ::testing::TempDir() + "/lns_st_" + std::to_string(::getpid()) + "_" + name + ".safetensors";
}

void expect_user_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected a UserError containing '" << needle << "'";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
  }
}

std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void write_all(const std::string& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

TEST(Safetensors, RoundTripWithMetadataAndStandardLayout) {
  auto a = randn(6, 1);
  std::vector<int32_t> ids = {1, -100, 7};
  const float scalar = 2.5f;
  SafetensorsWriter w;
  w.add("b.weights", view(a, {2, 3}));
  w.add("a.ids", view(ids, {3}));
  w.add_f32("loss", {}, &scalar);
  w.set_metadata("config", "{\"x\": 1}");
  const std::string p = tmp_path("roundtrip");
  w.write(p);

  SafetensorsReader r(p);
  EXPECT_EQ(r.read_f32("b.weights"), a);
  EXPECT_EQ(r.read_i32("a.ids"), ids);
  EXPECT_EQ(r.read_f32("loss"), std::vector<float>{2.5f});
  EXPECT_TRUE(r.entry("loss").shape.empty());
  EXPECT_EQ(r.metadata().at("config"), "{\"x\": 1}");
  // Names sorted, data contiguous from offset 0, header padded to 8 bytes.
  EXPECT_EQ(r.entry("a.ids").begin, 0u);
  EXPECT_EQ(r.entry("b.weights").begin, r.entry("a.ids").end);
  uint64_t header_len = 0;
  std::memcpy(&header_len, read_all(p).data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
}

TEST(Safetensors, ReadsBf16AndF16) {
  // Header and data written by hand, as another library would.
  const uint16_t bf[2] = {f32_to_bf16(1.5f), f32_to_bf16(-0.25f)};
  const uint16_t hf[2] = {0x3C00 /*1.0*/, 0xC500 /*-5.0*/};
  std::string header =
      R"({"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"y":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})";
  uint64_t n = header.size();
  std::string file(reinterpret_cast<char*>(&n), 8);
  file += header;
  file.append(reinterpret_cast<const char*>(bf), 4).append(reinterpret_cast<const char*>(hf), 4);
  const std::string p = tmp_path("half");
  write_all(p, file);
  SafetensorsReader r(p);
  EXPECT_EQ(r.read_f32("x"), (std::vector<float>{1.5f, -0.25f}));
  EXPECT_EQ(r.read_f32("y"), (std::vector<float>{1.0f, -5.0f}));
}

TEST(Safetensors, DamagedFilesAreClearErrors) {
  auto a = randn(64, 2);
  SafetensorsWriter w;
  w.add("t", view(a, {64}));
  const std::string good = tmp_path("good");
  w.write(good);
  const std::string bytes = read_all(good);

  const std::string truncated = tmp_path("truncated");
  write_all(truncated, bytes.substr(0, bytes.size() - 10));
  expect_user_error([&] { SafetensorsReader r(truncated); }, truncated);
  expect_user_error([&] { SafetensorsReader r(truncated); }, "truncated?");

  const std::string tiny = tmp_path("tiny");
  write_all(tiny, "abc");
  expect_user_error([&] { SafetensorsReader r(tiny); }, "not a safetensors file");

  std::string bad_len = bytes;
  bad_len[7] = 0x7f;  // absurd header length
  const std::string p_len = tmp_path("badlen");
  write_all(p_len, bad_len);
  expect_user_error([&] { SafetensorsReader r(p_len); }, "header length");

  std::string bad_json = bytes;
  bad_json[8] = '[';
  bad_json[9] = '!';
  const std::string p_json = tmp_path("badjson");
  write_all(p_json, bad_json);
  expect_user_error([&] { SafetensorsReader r(p_json); }, "not JSON");

  expect_user_error([&] { SafetensorsReader r(tmp_path("does_not_exist")); }, "cannot open");
  SafetensorsReader r(good);
  std::vector<float> dst(32);
  expect_user_error([&] { r.read_into("t", view(dst, {32})); }, "has shape [64], expected [32]");
  expect_user_error([&] { r.entry("nope"); }, "no tensor named 'nope'");
}

// A file written by hand: 8-byte length, `header` verbatim, `data_bytes` zero bytes.
std::string handmade(const std::string& name, const std::string& header, size_t data_bytes = 16) {
  const uint64_t n = header.size();
  std::string file(reinterpret_cast<const char*>(&n), 8);
  file += header;
  file.append(data_bytes, '\0');
  const std::string p = tmp_path(name);
  write_all(p, file);
  return p;
}

TEST(Safetensors, HostileHeadersAreOneLineWithoutTheirBytes) {
  // Binary garbage where the JSON header should be: the error names the byte offset,
  // never the bytes themselves.
  const std::string garbage = handmade("garbage", std::string("\x01\x02\xff{\x1b[2J\n", 8));
  try {
    SafetensorsReader r(garbage);
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m, garbage + ": not a safetensors file (its header is not JSON: syntax error at byte offset 8)");
  }
  const std::string ok = R"("dtype":"F32","shape":[4],"data_offsets":[0,16])";
  expect_user_error([&] { SafetensorsReader r(handmade("neg", R"({"t":{"dtype":"F32","shape":[-2,-2],"data_offsets":[0,16]}})")); },
                    "header['t'].shape[0]: expected an integer in [0, 9223372036854775807], got -2");
  // 2^32 x 2^32 x 2^32 elements: the product overflows int64; it must not wrap to a
  // size that matches the data.
  expect_user_error([&] { SafetensorsReader r(handmade("wrap", R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,0]}})")); },
                    "tensor 't' has data offsets [0, 0) that do not fit its shape [4294967296, 4294967296, 4294967296]");
  expect_user_error([&] { SafetensorsReader r(handmade("past", R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})")); },
                    "has data offsets [8, 24) that do not fit its shape [4] or the file (16 data bytes)");
  expect_user_error([&] { SafetensorsReader r(handmade("offneg", R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[-16,0]}})")); },
                    "data_offsets[0]: expected an integer");
  expect_user_error([&] { SafetensorsReader r(handmade("offstr", R"({"t":{"dtype":"F32","shape":[4],"data_offsets":"0,16"}})")); },
                    "header['t'].data_offsets: expected an array");
  expect_user_error([&] { SafetensorsReader r(handmade("dtype", R"({"t":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})")); },
                    "header['t'].dtype: unknown dtype 'Q4'");
  expect_user_error([&] { SafetensorsReader r(handmade("entry", R"({"t":5})")); }, "header['t']: expected an object, got 5");
  expect_user_error([&] { SafetensorsReader r(handmade("meta", R"({"__metadata__":[1]})")); },
                    "header['__metadata__']: expected an object, got an array");
  expect_user_error([&] { SafetensorsReader r(handmade("rank", R"({"t":{"dtype":"F32","shape":[1,1,1,1,4],"data_offsets":[0,16]}})")); },
                    "shape: expected 0 to 4 integers, got 5");
  expect_user_error([&] { SafetensorsReader r(handmade("name", "{\"a\\nb\":{\"dtype\":\"X\",\"shape\":[4],\"data_offsets\":[0,16]}}")); },
                    "header['a\\x0ab'].dtype: unknown dtype 'X'");
  // A header length that the file cannot hold, or beyond any real header.
  uint64_t huge = uint64_t{1} << 62;
  std::string f(reinterpret_cast<const char*>(&huge), 8);
  write_all(tmp_path("huge"), f + "{}");
  expect_user_error([&] { SafetensorsReader r(tmp_path("huge")); },
                    "huge.safetensors: not a safetensors file (its first 8 bytes, read as the header length, give more than the "
                    "file's 10 bytes hold)");
  // A text file (an index that names a JSON file as a shard, say): the message never
  // echoes its first bytes as a number.
  const std::string text = "{\n  \"metadata\": {\"total_size\": 1024},\n  \"weight_map\": {}\n}\n";
  write_all(tmp_path("text"), text);
  uint64_t as_length = 0;
  std::memcpy(&as_length, text.data(), 8);
  try {
    SafetensorsReader r(tmp_path("text"));
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("text.safetensors: not a safetensors file (its first 8 bytes, read as the header length, give more "
                       "than the file's 59 bytes hold)"), std::string::npos) << msg;
    EXPECT_EQ(msg.find(std::to_string(as_length)), std::string::npos) << msg;
  }
  // Within the file but past any real header: the limit, not the number, is named.
  huge = kMaxSafetensorsHeaderBytes + 1;
  write_all(tmp_path("past_limit"), std::string(reinterpret_cast<const char*>(&huge), 8));
  std::filesystem::resize_file(tmp_path("past_limit"), 8 + huge);  // sparse: no 100 MiB written
  expect_user_error([&] { SafetensorsReader r(tmp_path("past_limit")); },
                    "give more than the limit of 104857600 bytes)");
  EXPECT_NO_THROW(SafetensorsReader(handmade("fine", "{\"t\":{" + ok + "}}")));
}

TEST(ParamIo, LoadChecksNamesAndShapes) {
  LlamaConfig c;
  c.vocab_size = 11, c.hidden_size = 8, c.intermediate_size = 12, c.num_layers = 2;
  c.num_heads = 2, c.num_kv_heads = 1, c.norm_scheme = NormScheme::Post;
  LlamaStage m(c, StageSpec::whole(c), 1, 3);
  m.init_weights(3);
  auto save = [&](const std::string& name, auto&& edit, const std::string& skip = "") {
    SafetensorsWriter w;
    for (int i = 0; i < m.params().size(); ++i)
      if (m.params().info(i).name != skip) w.add(m.params().info(i).name, m.params().param(i));
    edit(w);
    const std::string p = tmp_path(name);
    w.write(p);
    return p;
  };
  // A complete file loads, and non-weight tensors (a dump's logits) are ignored.
  std::vector<float> junk(3);
  const std::string ok = save("ok", [&](SafetensorsWriter& w) { w.add("logits", view(junk, {3})); });
  LlamaStage m2(c, StageSpec::whole(c), 1, 3);
  load_params(m2.params(), SafetensorsReader(ok), m2.config());
  EXPECT_EQ(std::memcmp(m2.params().flat_params().data, m.params().flat_params().data,
                        m.params().numel() * 4), 0);
  // A Post-LN model has no input_layernorm: such a weight is an error.
  std::vector<float> g(8, 1.0f);
  const std::string extra = save("extra", [&](SafetensorsWriter& w) {
    w.add("model.layers.0.input_layernorm.weight", view(g, {8}));
  });
  expect_user_error([&] { load_params(m2.params(), SafetensorsReader(extra), m2.config()); },
                    "has weight 'model.layers.0.input_layernorm.weight'");
  std::vector<float> wrong(11 * 9);
  const std::string shape = save("shape", [&](SafetensorsWriter& w) {
    w.add("model.embed_tokens.weight", view(wrong, {11, 9}));
  });
  expect_user_error([&] { load_params(m2.params(), SafetensorsReader(shape), m2.config()); },
                    "'model.embed_tokens.weight' has shape [11, 9], expected [11, 8]");
  const std::string missing = save("missing", [](SafetensorsWriter&) {}, "model.norm.weight");
  expect_user_error([&] { load_params(m2.params(), SafetensorsReader(missing), m2.config()); },
                    "missing weight 'model.norm.weight'");
  // A Pre-LN model reading a Post-LN file: the scheme mismatch is named.
  LlamaConfig cp = c;
  cp.norm_scheme = NormScheme::Pre;
  LlamaStage m3(cp, StageSpec::whole(cp), 1, 3);
  expect_user_error([&] { load_params(m3.params(), SafetensorsReader(ok), m3.config()); },
                    "post_feedforward_layernorm.weight' that this model");
}

}  // namespace
}  // namespace lns
