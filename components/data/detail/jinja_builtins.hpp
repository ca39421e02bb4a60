#pragma once
// Jinja2's filters, tests, globals and attribute lookup, and the methods of
// Python's str, list and dict that templates call ("a b".split(),
// message.get('content')), in the immutable sandbox transformers renders
// in: a method that would change a list or dict fails as unsafe.

#include "components/data/detail/jinja_value.hpp"

#include <optional>
#include <string>

namespace glint::components::jinja {

/// Jinja2's environment.getattr (`obj.name`): a method of that name, else
/// the item; Undefined (with Jinja2's message) when neither exists.
Value get_attr(const Value& obj, const std::string& name);
/// Jinja2's environment.getitem (`obj[key]`): the item, else an attribute.
Value get_item(const Value& obj, const Value& key);
/// Python's obj[start:stop:step] for lists, tuples and strings.
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

Value apply_filter(const std::string& name, const Value& subject, Args& args);
bool apply_test(const std::string& name, const Value& subject, Args& args);

/// What the globals read from the world: strftime_now's clock.
struct Clock {
  /// Seconds since the epoch for strftime_now; unset: now. SOURCE_DATE_EPOCH
  /// sets it (jinja.cpp), so renders can be reproduced.
  std::optional<int64_t> epoch;
};
/// range, namespace, dict, cycler, joiner, raise_exception, strftime_now;
/// Undefined for other names.
Value global(const std::string& name, const Clock& clock);

/// Python's binary operators (+ - * / // % **) on values.
Value arithmetic(const std::string& op, const Value& a, const Value& b);
/// Python's printf-style `fmt % values` (%s %r %d %i %f %e %g %x %%);
/// `allow_unused`: values left over are no error (a mapping on the right).
std::string printf_format(const std::string& fmt, const std::vector<Value>& values, bool allow_unused);
/// Python's `fmt % b`: a tuple's items, else b itself.
Value printf_percent(const std::string& fmt, const Value& b);

/// Python's `a in b`.
bool contains(const Value& container, const Value& item);
/// The items a for loop (or list()) walks: a list's items, a dict's keys, a
/// string's characters, nothing for Undefined; fails for other types.
std::vector<Value> iterate(const Value& v);

/// An argument by position or keyword (Python's rules), or `fallback`.
Value argument(Args& args, size_t position, const char* keyword, Value fallback = Undefined{});

}  // namespace glint::components::jinja
