#include "lns/core/json_in.h"

#include <cmath>

#include "lns/core/errors.h"
#include "lns/core/files.h"

namespace lns {

JsonIn::JsonIn(const nlohmann::json& v, std::string file, std::string field)
    : v_(v), file_(std::move(file)), field_(std::move(field)) {}

void JsonIn::fail_with(const std::string& message) const {
  fail(file_, ": ", field_.empty() ? "" : field_ + ": ", message);
}

std::string JsonIn::describe() const {
  switch (v_.type()) {
    case nlohmann::json::value_t::string:
      return absl::StrCat("\"", printable(v_.get_ref<const std::string&>(), 40), "\"");
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::discarded: return "nothing";
    default: return v_.dump();  // numbers and booleans print briefly
  }
}

bool JsonIn::has(const std::string& key) const { return v_.is_object() && v_.contains(key); }

void JsonIn::require_object() const {
  if (!v_.is_object()) error("expected an object, got " + describe());
}

JsonIn JsonIn::operator[](const std::string& key) const {
  require_object();
  const auto it = v_.find(key);
  const std::string f = field_.empty() ? key : field_ + "." + key;
  if (it == v_.end()) fail(file_, ": ", f, ": missing");
  return JsonIn(*it, file_, f);
}

size_t JsonIn::size() const {
  if (!v_.is_array()) error("expected an array, got " + describe());
  return v_.size();
}

JsonIn JsonIn::at(size_t i) const {
  if (i >= size()) error("has no element " + std::to_string(i));
  return JsonIn(v_[i], file_, field_ + "[" + std::to_string(i) + "]");
}

int64_t JsonIn::integer(int64_t lo, int64_t hi) const {
  bool ok = false;
  int64_t x = 0;
  if (v_.is_number_integer() && !v_.is_number_unsigned()) {
    x = v_.get<int64_t>();
    ok = true;
  } else if (v_.is_number_unsigned()) {
    const uint64_t u = v_.get<uint64_t>();
    ok = u <= static_cast<uint64_t>(INT64_MAX);
    x = static_cast<int64_t>(u);
  }
  if (!ok || x < lo || x > hi)
    error("expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + describe());
  return x;
}

uint64_t JsonIn::uinteger(uint64_t hi) const {
  bool ok = false;
  uint64_t x = 0;
  if (v_.is_number_unsigned()) {
    x = v_.get<uint64_t>();
    ok = true;
  } else if (v_.is_number_integer()) {
    ok = v_.get<int64_t>() >= 0;
    x = static_cast<uint64_t>(v_.get<int64_t>());
  }
  if (!ok || x > hi) error("expected an integer in [0, " + std::to_string(hi) + "], got " + describe());
  return x;
}

double JsonIn::number(double lo, double hi) const {
  const double x = v_.is_number() ? v_.get<double>() : NAN;
  if (!std::isfinite(x) || x < lo || x > hi)
    error("expected a number in [" + absl::StrCat(lo) + ", " + absl::StrCat(hi) + "], got " + describe());
  return x;
}

bool JsonIn::boolean() const {
  if (!v_.is_boolean()) error("expected true or false, got " + describe());
  return v_.get<bool>();
}

std::string JsonIn::string() const {
  if (!v_.is_string()) error("expected a string, got " + describe());
  return v_.get<std::string>();
}

std::vector<int64_t> JsonIn::integers(size_t min_size, size_t max_size, int64_t lo, int64_t hi) const {
  const size_t n = size();
  if (n < min_size || n > max_size)
    error("expected " + std::to_string(min_size) + (min_size == max_size ? "" : " to " + std::to_string(max_size)) +
          " integers, got " + std::to_string(n));
  std::vector<int64_t> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(at(i).integer(lo, hi));
  return out;
}

bool mul_within(int64_t a, int64_t b, int64_t cap, int64_t* out) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r) || r > cap) return false;
  *out = r;
  return true;
}

bool add_within(int64_t a, int64_t b, int64_t cap, int64_t* out) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r) || r > cap) return false;
  *out = r;
  return true;
}

bool numel_within(const std::vector<int64_t>& dims, int64_t cap, int64_t* out) {
  int64_t n = 1;
  for (int64_t d : dims)
    if (!mul_within(n, d, cap, &n)) return false;
  *out = n;
  return true;
}

}  // namespace lns
