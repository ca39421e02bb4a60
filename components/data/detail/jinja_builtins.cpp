#include "components/data/detail/jinja_builtins.hpp"

#include "components/data/detail/jinja_ast.hpp"
#include "components/data/detail/unicode.hpp"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>

namespace glint::components::jinja {
namespace {

using Fn = std::function<Value(Args&)>;

Value bound(std::string name, Fn fn) {
  return CallablePtr{std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)})};
}

// By value: the argument it reads is often a temporary.
std::string need_str(const Value& v, const char* what) {
  require_defined(v);
  if (!v.string()) fail(std::string{what} + " expects a string, got " + type_name(v));
  return v.str();
}

std::string cased(const std::string& s, bool upper) {
  auto r = detail::change_case(s, upper);
  if (!r) fail("changing the case of a string: " + describe(r.error()));
  return *r;
}

std::u32string strip_chars(const Value& chars) {
  if (chars.undefined() || chars.none()) return {};
  return decode(need_str(chars, "strip"));
}

std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::u32string u = decode(s), set = strip_chars(chars);
  const bool ws = chars.undefined() || chars.none();
  auto drop = [&](char32_t c) { return ws ? is_space(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && drop(u[b])) ++b;
  if (right)
    while (e > b && drop(u[e - 1])) --e;
  return encode(std::u32string_view{u}.substr(b, e - b));
}

std::vector<Value> split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep.undefined() || sep.none()) {
    const std::u32string u = decode(s);
    std::vector<std::pair<size_t, size_t>> words;
    for (size_t i = 0; i < u.size();) {
      while (i < u.size() && is_space(u[i])) ++i;
      if (i == u.size()) break;
      size_t j = i;
      while (j < u.size() && !is_space(u[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (from_right) {
        const size_t keep = words.size() - static_cast<size_t>(maxsplit);
        size_t b = 0;
        while (b < u.size() && is_space(u[b])) ++b;
        parts.push_back(encode(std::u32string_view{u}.substr(b, words[keep - 1].second - b)));
        for (size_t k = keep; k < words.size(); ++k) parts.push_back(encode(std::u32string_view{u}.substr(words[k].first, words[k].second - words[k].first)));
      } else {
        for (size_t k = 0; k < static_cast<size_t>(maxsplit); ++k)
          parts.push_back(encode(std::u32string_view{u}.substr(words[k].first, words[k].second - words[k].first)));
        size_t e = u.size();
        while (e > 0 && is_space(u[e - 1])) --e;
        const size_t b = words[static_cast<size_t>(maxsplit)].first;
        parts.push_back(encode(std::u32string_view{u}.substr(b, e - b)));
      }
    } else {
      for (auto [b, e] : words) parts.push_back(encode(std::u32string_view{u}.substr(b, e - b)));
    }
  } else {
    const std::string d = need_str(sep, "split");
    if (d.empty()) fail("empty separator");
    if (!from_right) {
      size_t at = 0;
      for (int64_t n = 0;; ++n) {
        size_t f = (maxsplit >= 0 && n >= maxsplit) ? std::string::npos : s.find(d, at);
        if (f == std::string::npos) {
          parts.push_back(s.substr(at));
          break;
        }
        parts.push_back(s.substr(at, f - at));
        at = f + d.size();
      }
    } else {
      size_t end = s.size();
      for (int64_t n = 0;; ++n) {
        size_t f = (maxsplit >= 0 && n >= maxsplit) || end < d.size() ? std::string::npos : s.rfind(d, end - d.size());
        if (f == std::string::npos) {
          parts.insert(parts.begin(), s.substr(0, end));
          break;
        }
        parts.insert(parts.begin(), s.substr(f + d.size(), end - f - d.size()));
        end = f;
      }
    }
  }
  std::vector<Value> out;
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) {  // Python puts `to` between every character
    const std::u32string u = decode(s);
    std::string out;
    int64_t n = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (i < u.size()) out += encode(std::u32string_view{&u[i], 1});
    }
    return out;
  }
  std::string out;
  size_t at = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    size_t f = s.find(from, at);
    if (f == std::string::npos) break;
    out += s.substr(at, f - at) + to;
    at = f + from.size();
  }
  return out + s.substr(at);
}

bool starts_or_ends(const std::string& s, const Value& what, bool start) {
  auto one = [&](const std::string& p) {
    return p.size() <= s.size() && (start ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0);
  };
  if (what.list()) {
    for (const auto& p : what.items().items)
      if (one(need_str(p, start ? "startswith" : "endswith"))) return true;
    return false;
  }
  return one(need_str(what, start ? "startswith" : "endswith"));
}

std::string capitalize(const std::string& s) {
  const std::u32string u = decode(s);
  if (u.empty()) return s;
  return cased(encode(std::u32string_view{u}.substr(0, 1)), true) + cased(encode(std::u32string_view{u}.substr(1)), false);
}

bool all_chars(const std::string& s, bool (*pred)(char32_t)) {
  const std::u32string u = decode(s);
  if (u.empty()) return false;
  return std::all_of(u.begin(), u.end(), pred);
}

// Python's str.format for "{}" and "{0}"/"{name}" fields, no format specs.
std::string format_fields(const std::string& fmt, Args& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (fmt[i] == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (fmt[i] == '{') {
      size_t e = fmt.find('}', i);
      if (e == std::string::npos) fail("Single '{' encountered in format string");
      std::string field = fmt.substr(i + 1, e - i - 1);
      if (field.find_first_of(":!") != std::string::npos) fail("format specs in str.format are not supported by glint's Jinja");
      Value v;
      if (field.empty()) {
        if (auto_index >= args.positional.size()) fail("Replacement index " + std::to_string(auto_index) + " out of range");
        v = args.positional[auto_index++];
      } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
        size_t k = std::stoul(field);
        if (k >= args.positional.size()) fail("Replacement index " + field + " out of range");
        v = args.positional[k];
      } else {
        bool found = false;
        for (auto& [k, x] : args.keywords)
          if (k == field) {
            v = x;
            found = true;
          }
        if (!found) fail("'" + field + "'");
      }
      out += to_str(v);
      i = e;
    } else {
      out += fmt[i];
    }
  }
  return out;
}

[[noreturn]] void unsafe(const std::string& name, const Value& obj) {
  fail("access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe");
}

Value string_method(const std::string& self, const std::string& name) {
  static const std::map<std::string, std::function<Value(const std::string&, Args&)>> methods = {
      {"strip", [](const std::string& s, Args& a) { return Value{strip(s, argument(a, 0, "chars"), true, true)}; }},
      {"lstrip", [](const std::string& s, Args& a) { return Value{strip(s, argument(a, 0, "chars"), true, false)}; }},
      {"rstrip", [](const std::string& s, Args& a) { return Value{strip(s, argument(a, 0, "chars"), false, true)}; }},
      {"split", [](const std::string& s, Args& a) {
         auto m = argument(a, 1, "maxsplit", int64_t{-1});
         return Value{make_list(split(s, argument(a, 0, "sep"), m.as_int(), false))};
       }},
      {"rsplit", [](const std::string& s, Args& a) {
         auto m = argument(a, 1, "maxsplit", int64_t{-1});
         return Value{make_list(split(s, argument(a, 0, "sep"), m.as_int(), true))};
       }},
      {"splitlines", [](const std::string& s, Args& a) {
         const bool keep = truthy(argument(a, 0, "keepends", false));
         std::vector<Value> lines;
         size_t at = 0;
         while (at < s.size()) {
           size_t e = s.find_first_of("\n\r", at);
           if (e == std::string::npos) {
             lines.emplace_back(s.substr(at));
             break;
           }
           size_t next = e + (s[e] == '\r' && e + 1 < s.size() && s[e + 1] == '\n' ? 2 : 1);
           lines.emplace_back(s.substr(at, (keep ? next : e) - at));
           at = next;
         }
         return Value{make_list(std::move(lines))};
       }},
      {"startswith", [](const std::string& s, Args& a) { return Value{starts_or_ends(s, argument(a, 0, "prefix"), true)}; }},
      {"endswith", [](const std::string& s, Args& a) { return Value{starts_or_ends(s, argument(a, 0, "suffix"), false)}; }},
      {"replace", [](const std::string& s, Args& a) {
         return Value{replace(s, need_str(argument(a, 0, "old"), "replace"), need_str(argument(a, 1, "new"), "replace"),
                              argument(a, 2, "count", int64_t{-1}).as_int())};
       }},
      {"upper", [](const std::string& s, Args&) { return Value{cased(s, true)}; }},
      {"lower", [](const std::string& s, Args&) { return Value{cased(s, false)}; }},
      {"casefold", [](const std::string& s, Args&) { return Value{cased(s, false)}; }},
      {"capitalize", [](const std::string& s, Args&) { return Value{capitalize(s)}; }},
      {"title", [](const std::string& s, Args&) {
         std::u32string u = decode(s), out;
         bool prev_cased = false;
         for (char32_t c : u) {
           std::string one = encode(std::u32string_view{&c, 1});
           std::string up = cased(one, true), low = cased(one, false);
           const bool is_cased = up != low;
           out += decode(is_cased ? (prev_cased ? low : up) : one);
           prev_cased = is_cased;
         }
         return Value{encode(out)};
       }},
      {"find", [](const std::string& s, Args& a) {
         size_t f = s.find(need_str(argument(a, 0, "sub"), "find"));
         return Value{f == std::string::npos ? int64_t{-1} : static_cast<int64_t>(length(s.substr(0, f)))};
       }},
      {"rfind", [](const std::string& s, Args& a) {
         size_t f = s.rfind(need_str(argument(a, 0, "sub"), "rfind"));
         return Value{f == std::string::npos ? int64_t{-1} : static_cast<int64_t>(length(s.substr(0, f)))};
       }},
      {"index", [](const std::string& s, Args& a) {
         size_t f = s.find(need_str(argument(a, 0, "sub"), "index"));
         if (f == std::string::npos) fail("substring not found");
         return Value{static_cast<int64_t>(length(s.substr(0, f)))};
       }},
      {"count", [](const std::string& s, Args& a) {
         const std::string sub = need_str(argument(a, 0, "sub"), "count");
         if (sub.empty()) return Value{static_cast<int64_t>(length(s) + 1)};
         int64_t n = 0;
         for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
         return Value{n};
       }},
      {"join", [](const std::string& s, Args& a) {
         std::string out;
         bool first = true;
         for (const auto& x : iterate(argument(a, 0, "iterable"))) {
           out += (first ? "" : s) + need_str(x, "join");
           first = false;
         }
         return Value{out};
       }},
      {"isdigit", [](const std::string& s, Args&) { return Value{all_chars(s, [](char32_t c) { return c >= '0' && c <= '9'; })}; }},
      {"isnumeric", [](const std::string& s, Args&) { return Value{all_chars(s, [](char32_t c) { return c >= '0' && c <= '9'; })}; }},
      {"isdecimal", [](const std::string& s, Args&) { return Value{all_chars(s, [](char32_t c) { return c >= '0' && c <= '9'; })}; }},
      {"isspace", [](const std::string& s, Args&) { return Value{all_chars(s, is_space)}; }},
      {"isalpha", [](const std::string& s, Args&) {
         return Value{all_chars(s, [](char32_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; })};
       }},
      {"isalnum", [](const std::string& s, Args&) {
         return Value{all_chars(s, [](char32_t c) { return ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || (c >= '0' && c <= '9'); })};
       }},
      {"islower", [](const std::string& s, Args&) { return Value{cased(s, false) == s && cased(s, true) != s}; }},
      {"isupper", [](const std::string& s, Args&) { return Value{cased(s, true) == s && cased(s, false) != s}; }},
      {"removeprefix", [](const std::string& s, Args& a) {
         const std::string p = need_str(argument(a, 0, "prefix"), "removeprefix");
         return Value{s.compare(0, p.size(), p) == 0 ? s.substr(p.size()) : s};
       }},
      {"removesuffix", [](const std::string& s, Args& a) {
         const std::string p = need_str(argument(a, 0, "suffix"), "removesuffix");
         return Value{p.size() <= s.size() && s.compare(s.size() - p.size(), p.size(), p) == 0 ? s.substr(0, s.size() - p.size()) : s};
       }},
      {"partition", [](const std::string& s, Args& a) {
         const std::string d = need_str(argument(a, 0, "sep"), "partition");
         size_t f = s.find(d);
         if (f == std::string::npos) return Value{make_list({s, "", ""}, true)};
         return Value{make_list({s.substr(0, f), d, s.substr(f + d.size())}, true)};
       }},
      {"rpartition", [](const std::string& s, Args& a) {
         const std::string d = need_str(argument(a, 0, "sep"), "rpartition");
         size_t f = s.rfind(d);
         if (f == std::string::npos) return Value{make_list({"", "", s}, true)};
         return Value{make_list({s.substr(0, f), d, s.substr(f + d.size())}, true)};
       }},
      {"format", [](const std::string& s, Args& a) { return Value{format_fields(s, a)}; }},
  };
  auto it = methods.find(name);
  if (it == methods.end()) return Undefined{"'str object' has no attribute '" + name + "'"};
  auto fn = it->second;
  return bound("str." + name, [self, fn](Args& a) { return fn(self, a); });
}

Value list_method(const Value& obj, const std::string& name) {
  static const char* const mutating[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"};
  for (const char* m : mutating)
    if (name == m) return bound("list." + name, [obj, name](Args&) -> Value { unsafe(name, obj); });
  if (name == "index" || name == "count") {
    return bound("list." + name, [obj, name](Args& a) -> Value {
      const Value x = argument(a, 0, "value");
      int64_t n = 0;
      const auto& items = obj.items().items;
      for (size_t i = 0; i < items.size(); ++i)
        if (equal(items[i], x)) {
          if (name == "index") return static_cast<int64_t>(i);
          ++n;
        }
      if (name == "index") fail(repr(x) + " is not in list");
      return n;
    });
  }
  return Undefined{"'" + type_name(obj) + " object' has no attribute '" + name + "'"};
}

Value dict_method(const Value& obj, const std::string& name) {
  const DictPtr& d = obj.dict_ptr();
  if (name == "items")
    return bound("dict.items", [d](Args&) {
      std::vector<Value> out;
      for (const auto& [k, v] : d->entries) out.emplace_back(make_list({k, v}, true));
      return Value{make_list(std::move(out))};
    });
  if (name == "keys")
    return bound("dict.keys", [d](Args&) {
      std::vector<Value> out;
      for (const auto& [k, v] : d->entries) out.emplace_back(k);
      return Value{make_list(std::move(out))};
    });
  if (name == "values")
    return bound("dict.values", [d](Args&) {
      std::vector<Value> out;
      for (const auto& [k, v] : d->entries) out.push_back(v);
      return Value{make_list(std::move(out))};
    });
  if (name == "get")
    return bound("dict.get", [d](Args& a) {
      const Value key = argument(a, 0, "key");
      if (key.string())
        if (const Value* v = d->find(key.str())) return *v;
      return argument(a, 1, "default", nullptr);
    });
  if (name == "copy") return bound("dict.copy", [d](Args&) { return Value{std::make_shared<Dict>(*d)}; });
  static const char* const mutating[] = {"pop", "popitem", "setdefault", "update", "clear"};
  for (const char* m : mutating)
    if (name == m) return bound("dict." + name, [obj, name](Args&) -> Value { unsafe(name, obj); });
  return Value{};
}

std::string object_repr(const Value& obj) { return obj.none() ? "None" : type_name(obj) + " object"; }

}  // namespace

// Python's printf-style `fmt % args` for %s %r %d %i %f %e %g %x %%.
std::string printf_format(const std::string& fmt, const std::vector<Value>& values, bool allow_unused) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    size_t j = i + 1;
    std::string spec = "%";
    while (j < fmt.size() && std::string_view{"-+ #0123456789."}.find(fmt[j]) != std::string_view::npos) spec += fmt[j++];
    if (j >= fmt.size()) fail("incomplete format");
    const char conv = fmt[j];
    if (conv == '%') {
      out += '%';
      i = j;
      continue;
    }
    if (next >= values.size()) fail("not enough arguments for format string");
    const Value& v = values[next++];
    // Formatted at its full length (a spec's width is bounded: no 1e9-wide fields).
    auto formatted = [&](const std::string& f, auto x) {
      const int n = std::snprintf(nullptr, 0, f.c_str(), x);
      if (n < 0 || n > (64 << 20)) fail("a formatted field of more than 64 MiB");
      std::string buf(static_cast<size_t>(n) + 1, '\0');
      std::snprintf(buf.data(), buf.size(), f.c_str(), x);
      buf.resize(static_cast<size_t>(n));
      return buf;
    };
    if (conv == 's' || conv == 'r') {
      std::string s = conv == 's' ? to_str(v) : repr(v);
      out += spec == "%" ? s : formatted(spec + "s", s.c_str());
    } else if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
      if (v.real() && !(std::fabs(v.as_double()) < 9.2e18)) fail("%d of " + repr(v) + ": too large for glint's Jinja (64 bits)");
      out += formatted(spec + "ll" + (conv == 'i' ? 'd' : conv),
                       static_cast<long long>(v.real() ? std::trunc(v.as_double()) : v.as_int()));
    } else if (conv == 'f' || conv == 'F' || conv == 'e' || conv == 'E' || conv == 'g' || conv == 'G') {
      out += formatted(spec + conv, v.as_double());
    } else {
      fail(std::string{"unsupported format character '"} + conv + "'");
    }
    i = j;
  }
  if (next < values.size() && !allow_unused) fail("not all arguments converted during string formatting");
  return out;
}

Value printf_percent(const std::string& fmt, const Value& b) {
  require_defined(b);
  if (b.list() && b.items().tuple) return printf_format(fmt, b.items().items, false);
  // Python takes a dict or list on the right as a mapping: unused, no error.
  return printf_format(fmt, {b}, b.dict() || (b.list() && !b.items().generator));
}

Value argument(Args& args, size_t position, const char* keyword, Value fallback) {
  for (auto& [k, v] : args.keywords)
    if (k == keyword) return v;
  if (position < args.positional.size()) return args.positional[position];
  return fallback;
}

Value get_attr(const Value& obj, const std::string& name) {
  require_defined(obj);
  if (obj.dict()) {
    const auto& d = *obj.dict_ptr();
    if (d.kind == Dict::Kind::dict) {
      Value m = dict_method(obj, name);
      if (!m.undefined()) return m;
    }
    if (const Value* v = d.find(name)) return *v;
    return Undefined{"'" + object_repr(obj) + "' has no attribute '" + name + "'"};
  }
  if (obj.string()) return string_method(obj.str(), name);
  if (obj.list()) return list_method(obj, name);
  return Undefined{"'" + object_repr(obj) + "' has no attribute '" + name + "'"};
}

Value get_item(const Value& obj, const Value& key) {
  require_defined(obj);
  // An Undefined key is a key like any other (hashable, found nowhere).
  if (obj.dict()) {
    if (key.string()) {
      if (const Value* v = obj.dict_ptr()->find(key.str())) return *v;
      if (obj.dict_ptr()->kind == Dict::Kind::dict) {
        Value m = dict_method(obj, key.str());
        if (!m.undefined()) return m;
      }
      return Undefined{"'" + object_repr(obj) + "' has no attribute '" + key.str() + "'"};
    }
    return Undefined{"'" + object_repr(obj) + "' has no element " + repr(key)};
  }
  if (obj.list() && obj.items().generator) fail("'generator' object is not subscriptable");
  if ((obj.list() || obj.string()) && (key.integer() || key.boolean())) {
    int64_t i = key.as_int();
    if (obj.list()) {
      const auto& items = obj.items().items;
      const int64_t n = static_cast<int64_t>(items.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Undefined{"'" + object_repr(obj) + "' has no element " + repr(key)};
      return items[static_cast<size_t>(i)];
    }
    const std::u32string u = decode(obj.str());
    const int64_t n = static_cast<int64_t>(u.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Undefined{"'str object' has no element " + repr(key)};
    return encode(std::u32string_view{&u[static_cast<size_t>(i)], 1});
  }
  if (key.string()) return get_attr(obj, key.str());
  return Undefined{"'" + object_repr(obj) + "' has no element " + repr(key)};
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  require_defined(obj);
  auto part = [](const Value& v, int64_t fallback) { return v.undefined() || v.none() ? fallback : v.as_int(); };
  if (obj.list() && obj.items().generator) fail("'generator' object is not subscriptable");
  const int64_t st = part(step, 1);
  if (st == 0) fail("slice step cannot be zero");
  auto pick = [&](int64_t n, auto&& take) {
    int64_t b = part(start, st > 0 ? 0 : n - 1), e = part(stop, st > 0 ? n : -n - 1);
    auto clamp = [&](int64_t x, bool is_start) {
      if (x < 0) x += n;
      if (st > 0) return std::clamp<int64_t>(x, 0, n);
      (void)is_start;
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    if (!(start.undefined() || start.none())) b = clamp(b, true);
    if (!(stop.undefined() || stop.none())) e = clamp(e, false);
    else if (st < 0) e = -1;
    for (int64_t i = b; st > 0 ? i < e : i > e;) {
      take(static_cast<size_t>(i));
      if (__builtin_add_overflow(i, st, &i)) break;
    }
  };
  if (obj.list()) {
    const auto& items = obj.items().items;
    std::vector<Value> out;
    pick(static_cast<int64_t>(items.size()), [&](size_t i) { out.push_back(items[i]); });
    return make_list(std::move(out), obj.items().tuple);
  }
  if (obj.string()) {
    const std::u32string u = decode(obj.str());
    std::u32string out;
    pick(static_cast<int64_t>(u.size()), [&](size_t i) { out.push_back(u[i]); });
    return encode(out);
  }
  fail("'" + type_name(obj) + "' object is not subscriptable");
}

std::vector<Value> iterate(const Value& v) {
  if (v.undefined()) return {};
  if (v.list() && v.items().generator) {
    List& g = *v.list_ptr();
    if (!g.deferred.empty()) fail(g.deferred);
    std::vector<Value> rest(g.items.begin() + static_cast<std::ptrdiff_t>(std::min(g.consumed, g.items.size())), g.items.end());
    g.consumed = g.items.size();
    return rest;
  }
  if (v.list()) return v.items().items;
  if (v.dict()) {
    std::vector<Value> keys;
    for (const auto& [k, x] : v.dict_ptr()->entries) keys.emplace_back(k);
    return keys;
  }
  if (v.string()) {
    std::vector<Value> chars;
    for (char32_t c : decode(v.str())) chars.emplace_back(encode(std::u32string_view{&c, 1}));
    return chars;
  }
  fail("'" + type_name(v) + "' object is not iterable");
}

bool contains(const Value& container, const Value& item) {
  if (container.string()) return container.str().find(need_str(item, "'in <string>'")) != std::string::npos;
  if (container.dict()) return item.string() && container.dict_ptr()->find(item.str()) != nullptr;
  // Undefined has no __contains__: Python walks its (empty) iteration.
  for (const auto& x : iterate(container))
    if (equal(x, item)) return true;
  return false;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "%" && a.string()) return printf_percent(a.str(), b);
  require_defined(a);
  require_defined(b);
  auto unsupported = [&]() -> Value {
    fail("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  if (op == "+") {
    if (a.string() && b.string()) {
      charge_bytes(a.str().size() + b.str().size());
      return a.str() + b.str();
    }
    if (a.list() && b.list() && a.items().tuple == b.items().tuple) {
      auto items = a.items().items;
      items.insert(items.end(), b.items().items.begin(), b.items().items.end());
      return make_list(std::move(items), a.items().tuple);
    }
  }
  if (op == "*" && (a.string() || a.list() || b.string() || b.list())) {
    const Value& seq = a.string() || a.list() ? a : b;
    const Value& n = a.string() || a.list() ? b : a;
    if (!(n.integer() || n.boolean())) return unsupported();
    const int64_t k = std::max<int64_t>(0, n.as_int());
    const size_t unit = seq.string() ? seq.str().size() : seq.items().items.size() * sizeof(Value);
    if (unit > 0 && static_cast<uint64_t>(k) > (uint64_t{256} << 20) / unit) fail("repeating a sequence past 256 MiB");
    if (seq.string()) {
      std::string out;
      for (int64_t i = 0; i < k; ++i) out += seq.str();
      return out;
    }
    std::vector<Value> out;
    for (int64_t i = 0; i < k; ++i) out.insert(out.end(), seq.items().items.begin(), seq.items().items.end());
    return make_list(std::move(out), seq.items().tuple);
  }
  if (!a.number() || !b.number()) return unsupported();
  const bool ints = !a.real() && !b.real();
  if (ints) {
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t r = 0;
    auto too_large = [&]() -> Value { fail("the integer result of " + op + " is too large for glint's Jinja (64 bits)"); };
    if (op == "+") return __builtin_add_overflow(x, y, &r) ? too_large() : Value{r};
    if (op == "-") return __builtin_sub_overflow(x, y, &r) ? too_large() : Value{r};
    if (op == "*") return __builtin_mul_overflow(x, y, &r) ? too_large() : Value{r};
    if (op == "/") {
      if (y == 0) fail("division by zero");
      return static_cast<double>(x) / static_cast<double>(y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) fail("integer division or modulo by zero");
      if (y == -1) {  // INT64_MIN / -1 traps
        if (op == "%") return int64_t{0};
        return x == INT64_MIN ? too_large() : Value{-x};
      }
      int64_t q = x / y;
      r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return op == "//" ? q : r;
    }
    if (op == "**") {
      if (y < 0) return std::pow(static_cast<double>(x), static_cast<double>(y));
      int64_t base = x, e = y;  // square and multiply
      r = 1;
      while (e > 0) {
        if ((e & 1) && __builtin_mul_overflow(r, base, &r)) return too_large();
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) return too_large();
      }
      return r;
    }
  }
  const double x = a.as_double(), y = b.as_double();
  if (op == "+") return x + y;
  if (op == "-") return x - y;
  if (op == "*") return x * y;
  if (op == "/") {
    if (y == 0) fail("float division by zero");
    return x / y;
  }
  if (op == "//" || op == "%") {
    if (y == 0) fail("float modulo");
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return op == "//" ? std::floor((x - r) / y + 0.5) : r;
  }
  if (op == "**") return std::pow(x, y);
  return unsupported();
}

Value global(const std::string& name, const Clock& clock) {
  if (name == "range")
    return bound("range", [](Args& a) {
      int64_t start = 0, stop = 0, step = 1;
      if (a.positional.size() == 1) stop = a.positional[0].as_int();
      else if (a.positional.size() >= 2) {
        start = a.positional[0].as_int();
        stop = a.positional[1].as_int();
        if (a.positional.size() >= 3) step = a.positional[2].as_int();
      } else fail("range expected at least 1 argument, got 0");
      if (step == 0) fail("range() arg 3 must not be zero");
      std::vector<Value> out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        out.emplace_back(i);
        if (out.size() > 1000000) fail("range() of more than a million items");
        if (__builtin_add_overflow(i, step, &i)) break;
      }
      charge(static_cast<int64_t>(out.size()));
      return Value{make_list(std::move(out))};
    });
  if (name == "namespace" || name == "dict")
    return bound(name, [name](Args& a) {
      auto d = make_dict(name == "namespace" ? Dict::Kind::namespace_ : Dict::Kind::dict);
      for (const auto& p : a.positional) {
        if (!p.dict()) fail(name + "() takes a dict and keyword arguments, got " + type_name(p));
        for (const auto& [k, v] : p.dict_ptr()->entries) d->set(k, v);
      }
      for (auto& [k, v] : a.keywords) d->set(k, v);
      return Value{d};
    });
  if (name == "raise_exception")
    return bound(name, [](Args& a) -> Value {
      throw Failure{to_str(argument(a, 0, "message", "")), 0, true};
    });
  if (name == "strftime_now")
    return bound(name, [clock](Args& a) {
      const std::string fmt = need_str(argument(a, 0, "format"), "strftime_now");
      std::time_t t = clock.epoch ? static_cast<std::time_t>(*clock.epoch) : std::time(nullptr);
      std::tm tm{};
      if (clock.epoch) gmtime_r(&t, &tm);
      else localtime_r(&t, &tm);
      char buf[512];
      size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
      return Value{std::string(buf, n)};
    });
  if (name == "joiner")
    return bound(name, [](Args& a) {
      auto sep = std::make_shared<std::string>(to_str(argument(a, 0, "sep", ", ")));
      auto used = std::make_shared<bool>(false);
      return bound("joiner", [sep, used](Args&) {
        if (!*used) {
          *used = true;
          return Value{""};
        }
        return Value{*sep};
      });
    });
  return Undefined{"'" + name + "' is undefined"};
}

}  // namespace glint::components::jinja
