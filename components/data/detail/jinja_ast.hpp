#pragma once
// A parsed Jinja template: statements and expressions, each with the line
// it starts on. jinja_parse.cpp builds it (Jinja2's lexer and grammar, with
// the whitespace rules transformers' environment sets: trim_blocks,
// lstrip_blocks, and no trailing newline kept); jinja_eval.cpp runs it.

#include "components/data/detail/jinja_value.hpp"
#include "components/data/jinja.hpp"

#include <memory>
#include <string>
#include <vector>

namespace glint::components::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind : uint8_t {
    literal,      // value
    name,         // name
    list,         // args
    tuple,        // args
    dict,         // args: key, value, key, value, ...
    attr,         // args[0].name
    item,         // args[0][args[1]]
    slice,        // args[0][args[1]:args[2]:args[3]] (a missing part: nullptr)
    call,         // args[0](args[1:], keywords)
    filter,       // args[0] | name(args[1:], keywords)
    test,         // args[0] is [not: negated] name(args[1:], keywords)
    unary,        // name ("-", "+", "not") args[0]
    binary,       // args[0] name args[1]: + - * / // % ** ~ and or
    compare,      // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in notin
    conditional,  // args[0] if args[1] else args[2] (no else: nullptr)
  };
  Kind kind = Kind::literal;
  int line = 0;
  Value value;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::string> ops;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  ///< nullptr: required
};

struct Node {
  enum class Kind : uint8_t {
    text,        // text
    output,      // {{ expr }}
    if_,         // branches (conditions[i] -> bodies[i]); else_body
    for_,        // for target in expr [if condition]: body; else_body
    set,         // target = expr
    set_block,   // {% set target %}body{% endset %}, then filter (args[0] of it: the body) if any
    macro,       // name(params): body
    break_,
    continue_,
    generation,  // {% generation %}body{% endgeneration %}: an assistant's span (transformers)
    filter,      // {% filter f %}body{% endfilter %}
    with,        // {% with targets[i] = values[i] %}body{% endwith %}
  };
  Kind kind = Kind::text;
  int line = 0;
  std::string text;
  std::string name;
  ExprPtr target, expr, condition;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body body, else_body;
  std::vector<MacroParam> params;
  std::vector<ExprPtr> targets, values;
};

/// Parses `source`; throws Failure (with the line) on a syntax error, an
/// unknown filter or test, or a construct glint does not run ({% include %},
/// {% extends %}, {% call %}, ...), naming it.
Body parse(const std::string& source);

struct Clock;

/// What a render wrote: the text, and the byte ranges {% generation %}
/// blocks wrote into it (transformers' assistant masks).
using Output = JinjaTemplate::Rendered;

/// Runs a parsed template with `variables` (jinja_eval.cpp); throws Failure.
Output render(const Body& body, const DictPtr& variables, const Clock& clock);

/// Whether a filter or test of that name exists (jinja_builtins.cpp): the
/// parser refuses others at load, as Jinja2 does.
bool has_filter(const std::string& name);
bool has_test(const std::string& name);

}  // namespace glint::components::jinja
