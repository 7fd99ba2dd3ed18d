// Typed, range-checked reads of a JSON document that came from a file. A missing key,
// a wrong type or a value out of range is a UserError naming the file and the field,
// e.g. "ck/manifest.json: tensors[3].elem_end: expected an integer in [0, 1099511627776],
// got "12"". Nothing read through it can throw a JSON library exception.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <absl/strings/str_cat.h>
#include <nlohmann/json.hpp>

namespace lns {

class JsonIn {
 public:
  // `field` is the path of v inside the document ("" for the root).
  JsonIn(const nlohmann::json& v, std::string file, std::string field = "");

  bool has(const std::string& key) const;      // v is an object holding key
  JsonIn operator[](const std::string& key) const;  // required key of an object
  JsonIn at(size_t i) const;                   // element of an array
  size_t size() const;                         // of an array (UserError if not one)
  void require_object() const;

  int64_t integer(int64_t lo, int64_t hi) const;
  uint64_t uinteger(uint64_t hi = UINT64_MAX) const;
  double number(double lo, double hi) const;  // finite, integers accepted
  bool boolean() const;
  std::string string() const;
  std::vector<int64_t> integers(size_t min_size, size_t max_size, int64_t lo, int64_t hi) const;

  const nlohmann::json& raw() const { return v_; }
  const std::string& field() const { return field_; }
  // "<file>: <field>: <message>" as a UserError; the message is absl::StrCat(args...).
  template <typename... Args>
  [[noreturn]] void error(const Args&... args) const {
    fail_with(absl::StrCat(args...));
  }
  [[noreturn]] void fail_with(const std::string& message) const;

 private:
  std::string describe() const;  // the value, briefly, for "got ..."
  const nlohmann::json& v_;
  std::string file_, field_;
};

// a * b and a + b for non-negative sizes; false when the result exceeds `cap`.
bool mul_within(int64_t a, int64_t b, int64_t cap, int64_t* out);
bool add_within(int64_t a, int64_t b, int64_t cap, int64_t* out);
// Product of dims (each >= 0), false when it exceeds cap.
bool numel_within(const std::vector<int64_t>& dims, int64_t cap, int64_t* out);

}  // namespace lns
