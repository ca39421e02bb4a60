#pragma once
// The values a Jinja template computes with, and what Python does with them:
// glint's Jinja interpreter (components/data/jinja.hpp) renders what Jinja2
// renders, and Jinja2's values are Python's. So a value prints as Python's
// str() does (True, None, 1.0, ['a', 1]), compares and adds as Python does
// (1 == 1.0, True == 1, 7 // -2 == -4), and a string counts code points,
// not bytes. Lists and dicts are shared and immutable once built, as in
// Jinja2's immutable sandbox; a namespace is the one mutable value.
//
// Errors are thrown as jinja::Failure and caught where a render ends
// (jinja.cpp): nothing here crosses the layer as an exception.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace glint::components::jinja {

/// What went wrong in a template, with the template line it happened on
/// (0 where none is known yet; the interpreter fills it in on the way out).
struct Failure {
  std::string message;
  int line = 0;
  bool raised = false;  ///< raise_exception(): the template's own message
};
[[noreturn]] void fail(std::string message);

/// A render's work budget (jinja_eval.cpp starts one per render on its
/// thread): loop iterations, macro calls and range items count one each,
/// bytes of strings built by + and ~ one per 64. Past it the render fails;
/// so does a string built past 256 MiB.
void charge(int64_t units);
void charge_bytes(size_t bytes);
/// Starts a budget of `units` on this thread (the previous one is replaced).
void start_budget(int64_t units);

struct Value;
struct List;
struct Dict;
struct Callable;
using ListPtr = std::shared_ptr<List>;
using DictPtr = std::shared_ptr<Dict>;
using CallablePtr = std::shared_ptr<const Callable>;

/// Jinja's Undefined: a missing variable, key or attribute. It prints as
/// "", is false, iterates as empty and has length 0; anything else done to
/// it (attributes, arithmetic, ordering, calls) fails with `hint`, Jinja2's
/// message ("'dict object' has no attribute 'tools'").
struct Undefined {
  std::string hint;
};

struct Value {
  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string, ListPtr, DictPtr, CallablePtr> v;

  Value() = default;
  Value(Undefined u) : v(std::move(u)) {}
  Value(std::nullptr_t) : v(nullptr) {}
  Value(bool b) : v(b) {}
  Value(int64_t i) : v(i) {}
  Value(int i) : v(static_cast<int64_t>(i)) {}
  Value(double d) : v(d) {}
  Value(std::string s) : v(std::move(s)) {}
  Value(const char* s) : v(std::string{s}) {}
  Value(ListPtr l) : v(std::move(l)) {}
  Value(DictPtr d) : v(std::move(d)) {}
  Value(CallablePtr c) : v(std::move(c)) {}

  bool undefined() const { return std::holds_alternative<Undefined>(v); }
  bool none() const { return std::holds_alternative<std::nullptr_t>(v); }
  bool boolean() const { return std::holds_alternative<bool>(v); }
  bool integer() const { return std::holds_alternative<int64_t>(v); }
  bool real() const { return std::holds_alternative<double>(v); }
  bool number() const { return integer() || real() || boolean(); }
  bool string() const { return std::holds_alternative<std::string>(v); }
  bool list() const { return std::holds_alternative<ListPtr>(v); }
  bool dict() const { return std::holds_alternative<DictPtr>(v); }
  bool callable() const { return std::holds_alternative<CallablePtr>(v); }

  const std::string& str() const { return std::get<std::string>(v); }
  const List& items() const { return *std::get<ListPtr>(v); }
  const ListPtr& list_ptr() const { return std::get<ListPtr>(v); }
  const DictPtr& dict_ptr() const { return std::get<DictPtr>(v); }
  const Callable& fn() const { return *std::get<CallablePtr>(v); }
  const Undefined& undef() const { return std::get<Undefined>(v); }
  /// A number as a double (bools count as 0 and 1, as in Python).
  double as_double() const;
  /// An integer or bool as int64; fails for anything else.
  int64_t as_int() const;
};

struct List {
  std::vector<Value> items;
  bool tuple = false;  ///< prints as (a, b)
  /// What Jinja2's select, reject, selectattr, rejectattr, map, items and
  /// unique return, and reverse of a list: a Python generator. It is true
  /// even when empty, has no length and no index, iterates once (what is
  /// left: `consumed` counts what was taken), and raises what its filter
  /// raised (`deferred`) only when iterated.
  bool generator = false;
  size_t consumed = 0;
  std::string deferred{};
};

/// A dict in insertion order (Python's), keyed by strings; or a namespace()
/// (mutable by `{% set ns.x = ... %}`), or a for loop's `loop`.
struct Dict {
  enum class Kind : uint8_t { dict, namespace_, loop };
  std::vector<std::pair<std::string, Value>> entries;
  Kind kind = Kind::dict;

  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);  ///< replaces in place, else appends
};

/// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

/// A macro, a global function (range, namespace, raise_exception) or a
/// bound method ("a,b".split). `call` may throw Failure.
struct Callable {
  std::string name;
  std::function<Value(Args&)> call;
};

ListPtr make_list(std::vector<Value> items = {}, bool tuple = false);
/// A generator over `items`, or one that raises `deferred` when iterated.
ListPtr make_generator(std::vector<Value> items, std::string deferred = {});
DictPtr make_dict(Dict::Kind kind = Dict::Kind::dict);

/// Python's truth value.
bool truthy(const Value& v);
/// Python's str(): what {{ v }} prints.
std::string to_str(const Value& v);
/// Python's repr(): how a value prints inside a list or dict.
std::string repr(const Value& v);
/// Python's repr() of a float: the shortest text that reads back the same
/// (0.1, 1.0, 1e-05, 1e+16, inf, nan).
std::string repr_float(double d);
/// Python's ==.
bool equal(const Value& a, const Value& b);
/// Python's <, for numbers, strings and lists; fails for other types, naming them.
bool less(const Value& a, const Value& b);
/// Jinja2's name for a value's type in messages ("dict object", "str object").
std::string type_name(const Value& v);
/// [[noreturn]] when v is Undefined: fails with its hint.
void require_defined(const Value& v);

/// JSON (the render's variables) into values, in the document's key order;
/// integers stay integers, 1.0 stays a float.
Value from_json(const nlohmann::ordered_json& j);
Value from_json(const nlohmann::ordered_json& j, int depth);  ///< fails past 256 levels

/// transformers' tojson: json.dumps(x, ensure_ascii, indent, separators,
/// sort_keys); ensure_ascii false by default, as transformers has it.
struct JsonStyle {
  bool ensure_ascii = false;
  int indent = -1;  ///< < 0: none (one line)
  std::string item_separator, key_separator;  ///< "": json.dumps' defaults for the indent
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonStyle& style);

// -- Python strings, by code point ------------------------------------------

/// The UTF-8 text as code points (an invalid byte becomes U+FFFD's place
/// holder: its own value 0xDC00 + byte, as Python's surrogateescape).
std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);
size_t length(std::string_view s);
/// Python's str.isspace() for one code point.
bool is_space(char32_t c);

}  // namespace glint::components::jinja
