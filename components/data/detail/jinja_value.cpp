#include "components/data/detail/jinja_value.hpp"

#include "components/data/detail/unicode.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace glint::components::jinja {

void fail(std::string message) { throw Failure{std::move(message)}; }

namespace {
thread_local int64_t budget_left = INT64_MAX;
thread_local int64_t budget_total = 0;
}  // namespace

void start_budget(int64_t units) { budget_left = budget_total = units; }

void charge_bytes(size_t bytes) {
  if (bytes > (size_t{256} << 20)) fail("a string of more than 256 MiB");
  charge(static_cast<int64_t>(bytes >> 6));
}

void charge(int64_t units) {
  budget_left -= units;
  if (budget_left < 0)
    fail("the template does more than " + std::to_string(budget_total) +
         " units of work (loop iterations, macro calls, range items, 64-byte pieces of strings built)");
}

double Value::as_double() const {
  if (integer()) return static_cast<double>(std::get<int64_t>(v));
  if (real()) return std::get<double>(v);
  if (boolean()) return std::get<bool>(v) ? 1.0 : 0.0;
  require_defined(*this);
  fail("expected a number, got " + type_name(*this));
}

int64_t Value::as_int() const {
  if (integer()) return std::get<int64_t>(v);
  if (boolean()) return std::get<bool>(v) ? 1 : 0;
  require_defined(*this);
  fail("expected an integer, got " + type_name(*this));
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  for (auto& [k, v] : entries)
    if (k == key) {
      v = std::move(value);
      return;
    }
  entries.emplace_back(std::move(key), std::move(value));
}

ListPtr make_list(std::vector<Value> items, bool tuple) {
  auto l = std::make_shared<List>();
  l->items = std::move(items);
  l->tuple = tuple;
  return l;
}

ListPtr make_generator(std::vector<Value> items, std::string deferred) {
  auto l = make_list(std::move(items));
  l->generator = true;
  l->deferred = std::move(deferred);
  return l;
}

DictPtr make_dict(Dict::Kind kind) {
  auto d = std::make_shared<Dict>();
  d->kind = kind;
  return d;
}

bool truthy(const Value& v) {
  return std::visit(
      [](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined> || std::is_same_v<T, std::nullptr_t>) return false;
        else if constexpr (std::is_same_v<T, bool>) return x;
        else if constexpr (std::is_same_v<T, int64_t>) return x != 0;
        else if constexpr (std::is_same_v<T, double>) return x != 0.0;
        else if constexpr (std::is_same_v<T, std::string>) return !x.empty();
        else if constexpr (std::is_same_v<T, ListPtr>) return x->generator || !x->items.empty();
        else if constexpr (std::is_same_v<T, DictPtr>) return x->kind != Dict::Kind::dict || !x->entries.empty();
        else return true;
      },
      v.v);
}

std::string repr_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  // s is [-]D[.DDD]e(+|-)XX: the shortest digits that read back as d.
  bool negative = s[0] == '-';
  if (negative) s.erase(0, 1);
  auto e = s.find('e');
  int exponent = std::stoi(s.substr(e + 1));
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits + std::string(static_cast<size_t>(exponent + 1) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exponent + 1)) + "." + digits.substr(static_cast<size_t>(exponent + 1));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + ebuf;
}

namespace {

// Python's str.isprintable(), false for what repr() escapes: controls,
// separators other than the ASCII space, format characters.
bool printable(char32_t c) {
  if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) || (c >= 0x205f && c <= 0x2064) ||
      c == 0x3000 || c == 0xfeff)
    return false;
  if (c >= 0xd800 && c <= 0xdfff) return false;  // surrogates (escaped bytes)
  return true;
}

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : decode(s)) {
    char buf[16];
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!printable(c)) {
      if (c < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      else std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += encode(std::u32string_view{&c, 1});
    }
  }
  return out + quote;
}

}  // namespace

namespace {
thread_local int repr_depth = 0;
}  // namespace

std::string repr_container(const Value& v);
std::string repr_scalar(const Value& v);

std::string repr(const Value& v) {
  if (v.string()) return repr_string(v.str());
  // A namespace can hold itself: Python prints the repeat as {...}; glint
  // stops at a depth no real value reaches.
  if (v.list() || v.dict()) {
    if (repr_depth > 100) return v.list() ? "[...]" : "{...}";
    ++repr_depth;
    struct Leave {
      ~Leave() { --repr_depth; }
    } leave;
    return repr_container(v);
  }
  return repr_scalar(v);
}

std::string repr_container(const Value& v) {
  if (v.list() && v.items().generator) return "<generator object>";  // Jinja2 prints an address
  if (v.list()) {
    const auto& l = v.items();
    std::string out = l.tuple ? "(" : "[";
    for (size_t i = 0; i < l.items.size(); ++i) out += (i ? ", " : "") + repr(l.items[i]);
    if (l.tuple && l.items.size() == 1) out += ",";
    return out + (l.tuple ? ")" : "]");
  }
  if (v.dict()) {
    const auto& d = *v.dict_ptr();
    std::string out = "{";
    for (size_t i = 0; i < d.entries.size(); ++i)
      out += (i ? ", " : "") + repr_string(d.entries[i].first) + ": " + repr(d.entries[i].second);
    out += "}";
    if (d.kind == Dict::Kind::namespace_) return "<Namespace " + out + ">";
    return out;
  }
  return repr_scalar(v);
}

std::string repr_scalar(const Value& v) {
  if (v.undefined()) return "Undefined";
  return to_str(v);
}

std::string to_str(const Value& v) {
  return std::visit(
      [&](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined>) return "";
        else if constexpr (std::is_same_v<T, std::nullptr_t>) return "None";
        else if constexpr (std::is_same_v<T, bool>) return x ? "True" : "False";
        else if constexpr (std::is_same_v<T, int64_t>) return std::to_string(x);
        else if constexpr (std::is_same_v<T, double>) return repr_float(x);
        else if constexpr (std::is_same_v<T, std::string>) return x;
        else if constexpr (std::is_same_v<T, CallablePtr>) return "<function " + x->name + ">";
        else return repr(v);
      },
      v.v);
}

bool equal(const Value& a, const Value& b) {
  if (a.number() && b.number()) {
    if ((a.integer() || a.boolean()) && (b.integer() || b.boolean())) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.v.index() != b.v.index()) return false;
  if (a.undefined() || a.none()) return true;
  if (a.string()) return a.str() == b.str();
  if (a.list()) {
    const auto &x = a.items(), &y = b.items();
    if (x.generator || y.generator) return a.list_ptr() == b.list_ptr();
    if (x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
    for (size_t i = 0; i < x.items.size(); ++i)
      if (!equal(x.items[i], y.items[i])) return false;
    return true;
  }
  if (a.dict()) {
    const auto &x = *a.dict_ptr(), &y = *b.dict_ptr();
    if (x.kind != Dict::Kind::dict || y.kind != Dict::Kind::dict) return a.dict_ptr() == b.dict_ptr();
    if (x.entries.size() != y.entries.size()) return false;
    for (const auto& [k, v] : x.entries) {
      const Value* w = y.find(k);
      if (!w || !equal(v, *w)) return false;
    }
    return true;
  }
  if (a.callable()) return std::get<CallablePtr>(a.v) == std::get<CallablePtr>(b.v);
  return false;
}

bool less(const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  if (a.number() && b.number()) {
    if ((a.integer() || a.boolean()) && (b.integer() || b.boolean())) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.string() && b.string()) return a.str() < b.str();  // UTF-8 byte order is code point order
  if (a.list() && b.list()) {
    const auto &x = a.items().items, &y = b.items().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (less(x[i], y[i])) return true;
      if (less(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  fail("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

std::string type_name(const Value& v) {
  return std::visit(
      [&](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined>) return "Undefined";
        else if constexpr (std::is_same_v<T, std::nullptr_t>) return "NoneType";
        else if constexpr (std::is_same_v<T, bool>) return "bool";
        else if constexpr (std::is_same_v<T, int64_t>) return "int";
        else if constexpr (std::is_same_v<T, double>) return "float";
        else if constexpr (std::is_same_v<T, std::string>) return "str";
        else if constexpr (std::is_same_v<T, ListPtr>) return x->generator ? "generator" : x->tuple ? "tuple" : "list";
        else if constexpr (std::is_same_v<T, DictPtr>)
          return x->kind == Dict::Kind::dict ? "dict" : x->kind == Dict::Kind::loop ? "LoopContext" : "Namespace";
        else return "function";
      },
      v.v);
}

void require_defined(const Value& v) {
  if (v.undefined()) fail(v.undef().hint);
}

Value from_json(const nlohmann::ordered_json& j) { return from_json(j, 0); }

Value from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > 256) fail("the variables nest deeper than 256 levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return nullptr;
    case nlohmann::ordered_json::value_t::boolean: return j.get<bool>();
    case nlohmann::ordered_json::value_t::number_integer: return j.get<int64_t>();
    case nlohmann::ordered_json::value_t::number_unsigned: {
      auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return static_cast<double>(u);
      return static_cast<int64_t>(u);
    }
    case nlohmann::ordered_json::value_t::number_float: return j.get<double>();
    case nlohmann::ordered_json::value_t::string: return j.get<std::string>();
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json(x, depth + 1));
      return make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = make_dict();
      d->entries.reserve(j.size());
      for (const auto& [k, x] : j.items()) d->entries.emplace_back(k, from_json(x, depth + 1));
      return d;
    }
    default: return Undefined{"a binary JSON value has no template value"};
  }
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : decode(s)) {
    char buf[16];
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
      if (c >= 0x10000) {
        const char32_t u = c - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xd800 + (u >> 10)),
                      static_cast<unsigned>(0xdc00 + (u & 0x3ff)));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      out += encode(std::u32string_view{&c, 1});
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, const JsonStyle& st, int level) {
  if (level > 200) fail("ValueError: Circular reference detected (or nesting deeper than 200)");
  const std::string item_sep = !st.item_separator.empty() ? st.item_separator : st.indent >= 0 ? "," : ", ";
  const std::string key_sep = !st.key_separator.empty() ? st.key_separator : ": ";
  auto newline = [&](int l) {
    if (st.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(st.indent * l), ' ');
  };
  if (v.none()) out += "null";
  else if (v.boolean()) out += std::get<bool>(v.v) ? "true" : "false";
  else if (v.integer()) out += std::to_string(std::get<int64_t>(v.v));
  else if (v.real()) {
    double d = std::get<double>(v.v);
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : repr_float(d);
  } else if (v.string()) json_string(out, v.str(), st.ensure_ascii);
  else if (v.list() && v.items().generator) {
    fail("Object of type generator is not JSON serializable");
  } else if (v.list()) {
    const auto& items = v.items().items;
    if (items.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep;
      newline(level + 1);
      json_value(out, items[i], st, level + 1);
    }
    newline(level);
    out += ']';
  } else if (v.dict() && v.dict_ptr()->kind == Dict::Kind::dict) {
    std::vector<const std::pair<std::string, Value>*> entries;
    for (const auto& e : v.dict_ptr()->entries) entries.push_back(&e);
    if (st.sort_keys) std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
    if (entries.empty()) {
      out += "{}";
      return;
    }
    out += '{';
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i) out += item_sep;
      newline(level + 1);
      json_string(out, entries[i]->first, st.ensure_ascii);
      out += key_sep;
      json_value(out, entries[i]->second, st, level + 1);
    }
    newline(level);
    out += '}';
  } else {
    require_defined(v);
    fail("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonStyle& style) {
  std::string out;
  json_value(out, v, style, 0);
  return out;
}

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    int32_t cp = detail::next_utf8(s, i);
    if (cp >= 0) {
      out.push_back(static_cast<char32_t>(cp));
    } else {
      for (size_t k = at; k < i; ++k) out.push_back(0xdc00 + static_cast<unsigned char>(s[k]));
    }
  }
  return out;
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c >= 0xdc80 && c <= 0xdcff) out.push_back(static_cast<char>(c - 0xdc00));  // an escaped byte
    else detail::append_utf8(out, static_cast<int32_t>(c));
  }
  return out;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

}  // namespace glint::components::jinja
