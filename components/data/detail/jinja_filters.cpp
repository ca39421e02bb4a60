// Jinja2's built-in filters and tests, with transformers' tojson (no HTML
// escaping, ensure_ascii off). A filter Jinja2 has and glint does not is
// refused at load by name (jinja_parse.cpp), never ignored.
#include "components/data/detail/jinja_ast.hpp"
#include "components/data/detail/jinja_builtins.hpp"
#include "components/data/detail/unicode.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>

namespace glint::components::jinja {
namespace {

using Filter = std::function<Value(const Value&, Args&)>;
using Test = std::function<bool(const Value&, Args&)>;

const std::map<std::string, Filter>& filters();
const std::map<std::string, Test>& tests();

std::string text_of(const Value& v) { return to_str(v); }

// Jinja2's attrgetter: "a.b.0" looked up part by part with getitem.
Value lookup_path(const Value& item, const Value& path) {
  if (path.integer()) return get_item(item, path);
  Value v = item;
  const std::string& p = path.str();
  size_t at = 0;
  for (;;) {
    size_t dot = p.find('.', at);
    std::string part = p.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
    if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) v = get_item(v, Value{static_cast<int64_t>(std::stoll(part))});
    else v = get_item(v, Value{part});
    if (dot == std::string::npos) return v;
    at = dot + 1;
  }
}

Args rest(Args& args, size_t from) {
  Args out;
  for (size_t i = from; i < args.positional.size(); ++i) out.positional.push_back(args.positional[i]);
  return out;
}

bool run_test(const std::string& name, const Value& v, Args& args) {
  auto it = tests().find(name);
  if (it == tests().end()) fail("no test named '" + name + "'");
  return it->second(v, args);
}

// A generator of what `make` computes: what it raises is raised when the
// generator is iterated, not now (as Jinja2's generator filters do).
template <class F>
Value lazily(F&& make) {
  try {
    return make_generator(make());
  } catch (const Failure& f) {
    if (f.raised) throw;
    return make_generator({}, f.message);
  }
}

// select/reject/selectattr/rejectattr: `attr` (for the *attr forms) and then
// an optional test name and its arguments.
Value select(const Value& seq, Args& args, bool by_attr, bool keep) {
  // Jinja2 walks the value only when it is true (none | select: nothing).
  if (!truthy(seq)) return make_generator({});
  size_t next = 0;
  Value attr;
  if (by_attr) attr = argument(args, next++, "attribute");
  Value test_name = argument(args, next, "test");
  Args test_args = rest(args, next + 1);
  return lazily([&] {
    std::vector<Value> out;
    for (const auto& item : iterate(seq)) {
      const Value subject = by_attr ? lookup_path(item, attr) : item;
      bool pass = test_name.undefined() ? truthy(subject) : run_test(to_str(test_name), subject, test_args);
      if (pass == keep) out.push_back(item);
    }
    return out;
  });
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.string()) {
    auto r = detail::change_case(v.str(), false);
    return r ? Value{*r} : v;
  }
  return v;
}

std::vector<Value> sorted(const Value& seq, Args& args, size_t reverse_pos, size_t case_pos, size_t attr_pos) {
  const bool reverse = truthy(argument(args, reverse_pos, "reverse", false));
  const bool case_sensitive = truthy(argument(args, case_pos, "case_sensitive", false));
  const Value attr = argument(args, attr_pos, "attribute", nullptr);
  std::vector<Value> items = iterate(seq);
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t i = 0; i < items.size(); ++i)
    keyed.emplace_back(sort_key(attr.none() ? items[i] : lookup_path(items[i], attr), case_sensitive), i);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? less(b.first, a.first) : less(a.first, b.first);
  });
  std::vector<Value> out;
  for (auto& [k, i] : keyed) out.push_back(items[i]);
  return out;
}

Value min_max(const Value& seq, Args& args, bool max) {
  const bool case_sensitive = truthy(argument(args, 0, "case_sensitive", false));
  const Value attr = argument(args, 1, "attribute", nullptr);
  std::vector<Value> items = iterate(seq);
  if (items.empty()) return Undefined{"No aggregated item, sequence was empty."};
  size_t best = 0;
  auto key = [&](size_t i) { return sort_key(attr.none() ? items[i] : lookup_path(items[i], attr), case_sensitive); };
  for (size_t i = 1; i < items.size(); ++i)
    if (max ? less(key(best), key(i)) : less(key(i), key(best))) best = i;
  return items[best];
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

int64_t parse_int(const std::string& s, int64_t base, bool& ok) {
  std::string t = s;
  t.erase(0, t.find_first_not_of(" \t\n"));
  t.erase(t.find_last_not_of(" \t\n") + 1);
  t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
  try {
    size_t used = 0;
    int64_t v = std::stoll(t, &used, static_cast<int>(base));
    ok = used == t.size() && !t.empty();
    return v;
  } catch (const std::exception&) {
    ok = false;
    return 0;
  }
}

double parse_float(const std::string& s, bool& ok) {
  try {
    size_t used = 0;
    double v = std::stod(s, &used);
    std::string tail = s.substr(used);
    ok = tail.find_first_not_of(" \t\n") == std::string::npos;
    return v;
  } catch (const std::exception&) {
    ok = false;
    return 0;
  }
}

const std::map<std::string, Filter>& filters() {
  static const std::map<std::string, Filter> table = [] {
    std::map<std::string, Filter> f;
    f["abs"] = [](const Value& v, Args&) -> Value {
      if (v.integer() || v.boolean()) {
        if (v.as_int() == INT64_MIN) fail("abs of the smallest 64-bit integer is too large for glint's Jinja");
        return std::abs(v.as_int());
      }
      return std::fabs(v.as_double());
    };
    f["attr"] = [](const Value& v, Args& a) { return get_attr(v, to_str(argument(a, 0, "name"))); };
    f["capitalize"] = [](const Value& v, Args&) {
      Args none;
      return get_attr(Value{text_of(v)}, "capitalize").fn().call(none);
    };
    f["center"] = [](const Value& v, Args& a) {
      const std::string s = text_of(v);
      const int64_t width = argument(a, 0, "width", int64_t{80}).as_int(), n = static_cast<int64_t>(length(s));
      if (width > (int64_t{64} << 20)) fail("center to a width of more than 64 Mi characters");
      if (width <= n) return Value{s};
      const int64_t pad = width - n, left = pad / 2 + (pad & width & 1);
      return Value{std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(pad - left), ' ')};
    };
    f["default"] = [](const Value& v, Args& a) {
      const bool boolean = truthy(argument(a, 1, "boolean", false));
      if (v.undefined() || (boolean && !truthy(v))) return argument(a, 0, "default_value", "");
      return v;
    };
    f["d"] = f["default"];
    f["dictsort"] = [](const Value& v, Args& a) {
      require_defined(v);
      if (!v.dict()) fail("dictsort expects a mapping, got " + type_name(v));
      const bool case_sensitive = truthy(argument(a, 0, "case_sensitive", false));
      const std::string by = to_str(argument(a, 1, "by", "key"));
      const bool reverse = truthy(argument(a, 2, "reverse", false));
      if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
      std::vector<Value> pairs;
      for (const auto& [k, x] : v.dict_ptr()->entries) pairs.emplace_back(make_list({k, x}, true));
      std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& p, const Value& q) {
        const size_t at = by == "key" ? 0 : 1;
        const Value x = sort_key(p.items().items[at], case_sensitive), y = sort_key(q.items().items[at], case_sensitive);
        return reverse ? less(y, x) : less(x, y);
      });
      return Value{make_list(std::move(pairs))};
    };
    f["escape"] = [](const Value& v, Args&) { return Value{html_escape(text_of(v))}; };
    f["e"] = f["escape"];
    f["forceescape"] = f["escape"];
    f["first"] = [](const Value& v, Args&) -> Value {
      if (v.list() && v.items().generator) {  // takes one item, leaving the rest
        List& g = *v.list_ptr();
        if (!g.deferred.empty()) fail(g.deferred);
        if (g.consumed >= g.items.size()) return Undefined{"No first item, sequence was empty."};
        return g.items[g.consumed++];
      }
      auto items = iterate(v);
      if (items.empty()) return Undefined{"No first item, sequence was empty."};
      return items.front();
    };
    f["last"] = [](const Value& v, Args&) -> Value {
      if (v.list() && v.items().generator) fail("'generator' object is not reversible");
      auto items = iterate(v);
      if (items.empty()) return Undefined{"No last item, sequence was empty."};
      return items.back();
    };
    f["float"] = [](const Value& v, Args& a) -> Value {
      require_defined(v);  // float(Undefined) raises in Jinja2, past its default
      if (v.number()) return v.as_double();
      if (v.string()) {
        bool ok = false;
        double d = parse_float(v.str(), ok);
        if (ok) return d;
      }
      return argument(a, 0, "default", 0.0);
    };
    f["int"] = [](const Value& v, Args& a) -> Value {
      require_defined(v);
      if (v.integer() || v.boolean()) return v.as_int();
      if (v.real()) {
        if (!(std::fabs(v.as_double()) < 9.2e18)) fail("int of " + repr(v) + ": too large for glint's Jinja (64 bits)");
        return static_cast<int64_t>(std::trunc(v.as_double()));
      }
      if (v.string()) {
        bool ok = false;
        int64_t i = parse_int(v.str(), argument(a, 1, "base", int64_t{10}).as_int(), ok);
        if (ok) return i;
        double d = parse_float(v.str(), ok);
        if (ok && std::fabs(d) < 9.2e18) return static_cast<int64_t>(std::trunc(d));
      }
      return argument(a, 0, "default", int64_t{0});
    };
    f["format"] = [](const Value& v, Args& a) {
      if (!a.keywords.empty() && !a.positional.empty()) fail("can't handle positional and keyword arguments at the same time");
      return Value{printf_format(text_of(v), a.positional, false)};
    };
    f["indent"] = [](const Value& v, Args& a) {
      require_defined(v);
      if (!v.string()) fail("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");  // Jinja2 appends to it
      const Value w = argument(a, 0, "width", int64_t{4});
      if (!w.string() && w.as_int() > 4096) fail("indent by more than 4096 spaces");
      const std::string ind = w.string() ? w.str() : std::string(static_cast<size_t>(std::max<int64_t>(0, w.as_int())), ' ');
      const bool first = truthy(argument(a, 1, "first", false)), blank = truthy(argument(a, 2, "blank", false));
      Args none;
      const Value lines_v = get_attr(Value{text_of(v) + "\n"}, "splitlines").fn().call(none);
      const auto& lines = lines_v.items().items;
      std::string out;
      for (size_t i = 0; i < lines.size(); ++i) {
        const std::string& line = lines[i].str();
        if (i > 0) out += "\n";
        out += (i > 0 && (blank || !line.empty())) ? ind + line : line;
      }
      if (first) out = ind + out;
      return Value{out};
    };
    f["items"] = [](const Value& v, Args&) -> Value {
      return lazily([&] {
        std::vector<Value> out;
        if (v.undefined()) return out;
        if (!v.dict() || v.dict_ptr()->kind != Dict::Kind::dict) fail("Can only get item pairs from a mapping.");
        for (const auto& [k, x] : v.dict_ptr()->entries) out.emplace_back(make_list({k, x}, true));
        return out;
      });
    };
    f["join"] = [](const Value& v, Args& a) {
      const std::string d = to_str(argument(a, 0, "d", ""));
      const Value attr = argument(a, 1, "attribute", nullptr);
      std::string out;
      bool first = true;
      for (const auto& x : iterate(v)) {
        out += (first ? "" : d) + to_str(attr.none() ? x : lookup_path(x, attr));
        first = false;
      }
      charge_bytes(out.size());
      return Value{out};
    };
    f["length"] = [](const Value& v, Args&) -> Value {
      if (v.undefined()) return int64_t{0};
      if (v.string()) return static_cast<int64_t>(length(v.str()));
      if (v.list() && !v.items().generator) return static_cast<int64_t>(v.items().items.size());
      if (v.dict()) return static_cast<int64_t>(v.dict_ptr()->entries.size());
      fail("object of type '" + type_name(v) + "' has no len()");
    };
    f["count"] = f["length"];
    f["list"] = [](const Value& v, Args&) { return Value{make_list(iterate(v))}; };
    f["lower"] = [](const Value& v, Args&) {
      Args none;
      return get_attr(Value{text_of(v)}, "lower").fn().call(none);
    };
    f["upper"] = [](const Value& v, Args&) {
      Args none;
      return get_attr(Value{text_of(v)}, "upper").fn().call(none);
    };
    f["map"] = [](const Value& v, Args& a) -> Value {
      if (!truthy(v)) return make_generator({});
      const Value attr = argument(a, 99, "attribute");
      if (attr.undefined() && a.positional.empty()) fail("map requires a filter argument");
      return lazily([&] {
      std::vector<Value> out;
      if (!attr.undefined()) {
        const Value fallback = argument(a, 99, "default");
        for (const auto& x : iterate(v)) {
          Value y = lookup_path(x, attr);
          out.push_back(y.undefined() && !fallback.undefined() ? fallback : y);
        }
        return out;
      }
      const std::string name = to_str(a.positional[0]);
      auto it = filters().find(name);
      if (it == filters().end()) fail("no filter named '" + name + "'");
      Args fargs = rest(a, 1);
      for (auto& kw : a.keywords) fargs.keywords.push_back(kw);
      for (const auto& x : iterate(v)) out.push_back(it->second(x, fargs));
      return out;
      });
    };
    f["max"] = [](const Value& v, Args& a) { return min_max(v, a, true); };
    f["min"] = [](const Value& v, Args& a) { return min_max(v, a, false); };
    f["reject"] = [](const Value& v, Args& a) { return select(v, a, false, false); };
    f["rejectattr"] = [](const Value& v, Args& a) { return select(v, a, true, false); };
    f["select"] = [](const Value& v, Args& a) { return select(v, a, false, true); };
    f["selectattr"] = [](const Value& v, Args& a) { return select(v, a, true, true); };
    f["replace"] = [](const Value& v, Args& a) {
      Args r;
      r.positional = {argument(a, 0, "old"), argument(a, 1, "new")};
      const Value count = argument(a, 2, "count", nullptr);
      if (!count.none()) r.positional.push_back(count);
      return get_attr(Value{text_of(v)}, "replace").fn().call(r);
    };
    f["reverse"] = [](const Value& v, Args&) -> Value {
      if (v.string()) {
        auto u = decode(v.str());
        std::reverse(u.begin(), u.end());
        return encode(u);
      }
      auto items = iterate(v);
      std::reverse(items.begin(), items.end());
      // reversed() of a list is an iterator; a generator is listed first.
      if (v.list() && v.items().generator) return make_list(std::move(items));
      return make_generator(std::move(items));
    };
    f["round"] = [](const Value& v, Args& a) -> Value {
      const int64_t precision = argument(a, 0, "precision", int64_t{0}).as_int();
      const std::string method = to_str(argument(a, 1, "method", "common"));
      const double scale = std::pow(10.0, static_cast<double>(precision)), x = v.as_double() * scale;
      double r;
      // Python's round(int, n) is an int (n < 0: to tens, hundreds, ...).
      if (method == "common" && (v.integer() || v.boolean())) {
        if (precision >= 0) return v.as_int();
        if (precision < -18) return int64_t{0};
        int64_t p10 = 1;
        for (int64_t k = 0; k < -precision; ++k) p10 *= 10;
        const int64_t x = v.as_int(), q = x / p10, rem = x % p10;
        int64_t r = q;  // halves to even, as Python
        if (2 * std::abs(rem) > p10 || (2 * std::abs(rem) == p10 && (q % 2 != 0))) r += x < 0 ? -1 : 1;
        return r * p10;
      }
      if (method == "common") {
        // Python's round(x, n): the decimal nearest the exact binary value
        // (2.675 is 2.67499..., so 2.67), halves to even, as printf does.
        char buf[512];
        std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::clamp<int64_t>(precision, 0, 300)), v.as_double());
        if (precision >= 0) return std::strtod(buf, nullptr);
        r = std::nearbyint(x);
      } else if (method == "ceil") {
        r = std::ceil(x);
      } else if (method == "floor") {
        r = std::floor(x);
      } else {
        fail("method must be 'common', 'ceil' or 'floor'");
      }
      return r / scale;
    };
    f["safe"] = [](const Value& v, Args&) { return v; };
    f["sort"] = [](const Value& v, Args& a) { return Value{make_list(sorted(v, a, 0, 1, 2))}; };
    f["string"] = [](const Value& v, Args&) { return Value{text_of(v)}; };
    f["sum"] = [](const Value& v, Args& a) {
      const Value attr = argument(a, 0, "attribute", nullptr);
      Value total = argument(a, 1, "start", int64_t{0});
      for (const auto& x : iterate(v)) total = arithmetic("+", total, attr.none() ? x : lookup_path(x, attr));
      return total;
    };
    f["title"] = [](const Value& v, Args&) {
      // Jinja2's title: each run after "-", whitespace or an opening bracket
      // gets its first character upper-cased and the rest lower-cased.
      const std::u32string u = decode(text_of(v));
      std::string out;
      size_t i = 0;
      auto sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_space(c); };
      while (i < u.size()) {
        size_t j = i;
        if (sep(u[i])) {
          while (j < u.size() && sep(u[j])) ++j;
          out += encode(std::u32string_view{u}.substr(i, j - i));
        } else {
          while (j < u.size() && !sep(u[j])) ++j;
          Args none;
          out += get_attr(Value{encode(std::u32string_view{u}.substr(i, j - i))}, "capitalize").fn().call(none).str();
        }
        i = j;
      }
      return Value{out};
    };
    f["tojson"] = [](const Value& v, Args& a) {
      JsonStyle st;
      st.ensure_ascii = truthy(argument(a, 0, "ensure_ascii", false));
      const Value indent = argument(a, 1, "indent", nullptr);
      if (!indent.none() && (indent.as_int() < 0 || indent.as_int() > 4096)) fail("tojson's indent must be 0 to 4096");
      st.indent = indent.none() ? -1 : static_cast<int>(indent.as_int());
      const Value separators = argument(a, 2, "separators", nullptr);
      if (!separators.none()) {
        if (!separators.list() || separators.items().items.size() != 2) fail("tojson's separators must be a pair of strings");
        st.item_separator = to_str(separators.items().items[0]);
        st.key_separator = to_str(separators.items().items[1]);
      }
      st.sort_keys = truthy(argument(a, 3, "sort_keys", false));
      return Value{to_json(v, st)};
    };
    f["trim"] = [](const Value& v, Args& a) {
      Args s;
      const Value chars = argument(a, 0, "chars", nullptr);
      if (!chars.none()) s.positional.push_back(chars);
      return get_attr(Value{text_of(v)}, "strip").fn().call(s);
    };
    f["unique"] = [](const Value& v, Args& a) {
      const bool case_sensitive = truthy(argument(a, 0, "case_sensitive", false));
      const Value attr = argument(a, 1, "attribute", nullptr);
      return lazily([&] {
      std::vector<Value> out, seen;
      for (const auto& x : iterate(v)) {
        const Value key = sort_key(attr.none() ? x : lookup_path(x, attr), case_sensitive);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) {
          seen.push_back(key);
          out.push_back(x);
        }
      }
      return out;
      });
    };
    f["wordcount"] = [](const Value& v, Args&) {
      const std::string s = text_of(v);
      int64_t n = 0;
      bool in_word = false;
      for (size_t i = 0; i < s.size();) {
        const bool w = detail::is_word_char(detail::next_utf8(s, i));
        n += w && !in_word;
        in_word = w;
      }
      return Value{n};
    };
    return f;
  }();
  return table;
}

// Jinja2's lower and upper tests: str(value).islower() (any value).
bool is_lower(const Value& v) {
  Args none;
  return truthy(get_attr(Value{to_str(v)}, "islower").fn().call(none));
}

const std::map<std::string, Test>& tests() {
  static const std::map<std::string, Test> table = [] {
    std::map<std::string, Test> t;
    t["defined"] = [](const Value& v, Args&) { return !v.undefined(); };
    t["undefined"] = [](const Value& v, Args&) { return v.undefined(); };
    t["none"] = [](const Value& v, Args&) { return v.none(); };
    t["boolean"] = [](const Value& v, Args&) { return v.boolean(); };
    t["true"] = [](const Value& v, Args&) { return v.boolean() && std::get<bool>(v.v); };
    t["false"] = [](const Value& v, Args&) { return v.boolean() && !std::get<bool>(v.v); };
    t["integer"] = [](const Value& v, Args&) { return v.integer(); };
    t["float"] = [](const Value& v, Args&) { return v.real(); };
    t["number"] = [](const Value& v, Args&) { return v.number(); };
    t["string"] = [](const Value& v, Args&) { return v.string(); };
    t["mapping"] = [](const Value& v, Args&) { return v.dict() && v.dict_ptr()->kind == Dict::Kind::dict; };
    t["iterable"] = [](const Value& v, Args&) { return v.list() || v.dict() || v.string() || v.undefined(); };
    t["sequence"] = [](const Value& v, Args&) {
      return (v.list() && !v.items().generator) || v.string() || v.undefined() ||
             (v.dict() && v.dict_ptr()->kind == Dict::Kind::dict);
    };
    t["callable"] = [](const Value& v, Args&) { return v.callable(); };
    t["escaped"] = [](const Value&, Args&) { return false; };
    t["sameas"] = [](const Value& v, Args& a) {
      const Value o = argument(a, 0, "other");
      if (v.v.index() != o.v.index()) return false;
      if (v.list()) return v.list_ptr() == o.list_ptr();
      if (v.dict()) return v.dict_ptr() == o.dict_ptr();
      if (v.callable()) return std::get<CallablePtr>(v.v) == std::get<CallablePtr>(o.v);
      if (v.string()) return v.str() == o.str();
      return equal(v, o);
    };
    t["in"] = [](const Value& v, Args& a) { return contains(argument(a, 0, "seq"), v); };
    // Python's value % 2 (and % num): floats too.
    t["even"] = [](const Value& v, Args&) { return equal(arithmetic("%", v, int64_t{2}), int64_t{0}); };
    t["odd"] = [](const Value& v, Args&) { return equal(arithmetic("%", v, int64_t{2}), int64_t{1}); };
    t["divisibleby"] = [](const Value& v, Args& a) { return equal(arithmetic("%", v, argument(a, 0, "num")), int64_t{0}); };
    t["eq"] = [](const Value& v, Args& a) { return equal(v, argument(a, 0, "other")); };
    t["ne"] = [](const Value& v, Args& a) { return !equal(v, argument(a, 0, "other")); };
    t["lt"] = [](const Value& v, Args& a) { return less(v, argument(a, 0, "other")); };
    t["gt"] = [](const Value& v, Args& a) { return less(argument(a, 0, "other"), v); };
    t["le"] = [](const Value& v, Args& a) { return !less(argument(a, 0, "other"), v); };
    t["ge"] = [](const Value& v, Args& a) { return !less(v, argument(a, 0, "other")); };
    for (auto [alias, name] : {std::pair{"equalto", "eq"}, {"==", "eq"}, {"!=", "ne"}, {"<", "lt"}, {"lessthan", "lt"},
                               {">", "gt"}, {"greaterthan", "gt"}, {"<=", "le"}, {">=", "ge"}})
      t[alias] = t[name];
    t["lower"] = [](const Value& v, Args&) { return is_lower(v); };
    t["upper"] = [](const Value& v, Args&) {
      Args none;
      return truthy(get_attr(Value{to_str(v)}, "isupper").fn().call(none));
    };
    t["filter"] = [](const Value& v, Args&) { return v.string() && filters().count(v.str()) > 0; };
    t["test"] = [](const Value& v, Args&) { return v.string() && tests().count(v.str()) > 0; };
    return t;
  }();
  return table;
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) > 0; }
bool has_test(const std::string& name) { return tests().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& subject, Args& args) {
  auto it = filters().find(name);
  if (it == filters().end()) fail("no filter named '" + name + "'");
  return it->second(subject, args);
}

bool apply_test(const std::string& name, const Value& subject, Args& args) { return run_test(name, subject, args); }

}  // namespace glint::components::jinja
