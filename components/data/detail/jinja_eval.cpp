// Runs a parsed template with Jinja2's scoping: a for loop's body and a
// macro's get scopes of their own (a {% set %} inside a loop is gone at the
// next iteration and after the loop, which is why templates use
// namespace()), {% if %} does not, and a name is looked up through the
// scopes, then the render's variables, then the globals.
#include "components/data/detail/jinja_ast.hpp"
#include "components/data/detail/jinja_builtins.hpp"

namespace glint::components::jinja {
namespace {

constexpr int kMaxCallDepth = 200;
constexpr size_t kMaxOutputBytes = size_t{256} << 20;
// Loop iterations and macro calls in one render: a chat template takes
// thousands; a template that would take longer than seconds is refused.
constexpr int64_t kMaxSteps = 20'000'000;  // jinja_value.hpp's budget

struct Scope {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Scope> parent;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get())
      for (const auto& [k, v] : s->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, x] : vars)
      if (k == name) {
        x = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow : uint8_t { normal, break_, continue_ };

class Interpreter {
public:
  Interpreter(const DictPtr& variables, const Clock& clock) : variables_(variables), clock_(clock) {}

  Output run(const Body& body) {
    start_budget(kMaxSteps);
    Output out;
    main_ = &out;
    auto top = std::make_shared<Scope>();
    exec(body, top, out.text);
    return out;
  }

private:
  Flow exec(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& n : body) {
      Flow f;
      try {
        f = exec(*n, scope, out);
      } catch (Failure& e) {
        if (e.line == 0) e.line = n->line;
        throw;
      }
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  Flow exec(const Node& n, const ScopePtr& scope, std::string& out) {
    switch (n.kind) {
      case Node::Kind::text: append(out, n.text); return Flow::normal;
      case Node::Kind::output: append(out, to_str(eval(*n.expr, scope))); return Flow::normal;
      case Node::Kind::if_:
        for (size_t i = 0; i < n.conditions.size(); ++i)
          if (truthy(eval(*n.conditions[i], scope))) return exec(n.bodies[i], scope, out);
        return exec(n.else_body, scope, out);
      case Node::Kind::for_: return for_loop(n, scope, out);
      case Node::Kind::set: assign(*n.target, eval(*n.expr, scope), scope); return Flow::normal;
      case Node::Kind::set_block: {
        std::string text;
        exec(n.body, scope, text);
        Value v{std::move(text)};
        if (n.expr) v = filter_chain(*n.expr, std::move(v), scope);
        assign(*n.target, std::move(v), scope);
        return Flow::normal;
      }
      case Node::Kind::macro: scope->set(n.name, macro(n, scope)); return Flow::normal;
      case Node::Kind::break_: return Flow::break_;
      case Node::Kind::continue_: return Flow::continue_;
      case Node::Kind::generation: {
        const size_t begin = out.size();
        Flow f = exec(n.body, scope, out);
        if (&out == &main_->text) main_->generation.emplace_back(begin, out.size());
        return f;
      }
      case Node::Kind::filter: {
        std::string text;
        Flow f = exec(n.body, scope, text);
        append(out, to_str(filter_chain(*n.expr, Value{std::move(text)}, scope)));
        return f;
      }
      case Node::Kind::with: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        for (size_t i = 0; i < n.targets.size(); ++i) assign(*n.targets[i], eval(*n.values[i], scope), inner);
        return exec(n.body, inner, out);
      }
    }
    return Flow::normal;
  }

  static void step() { charge(1); }

  void append(std::string& out, const std::string& text) {
    if (out.size() + text.size() > kMaxOutputBytes) fail("the rendered text passes 256 MiB");
    out += text;
  }

  Flow for_loop(const Node& n, const ScopePtr& scope, std::string& out) {
    const Value seq = eval(*n.expr, scope);
    if (seq.none()) fail("'NoneType' object is not iterable");
    std::vector<Value> items = iterate(seq);
    if (n.condition) {
      std::vector<Value> kept;
      for (auto& item : items) {
        auto probe = std::make_shared<Scope>();
        probe->parent = scope;
        assign(*n.target, item, probe);
        if (truthy(eval(*n.condition, probe))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(n.else_body, scope, out);
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      step();
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      assign(*n.target, items[static_cast<size_t>(i)], inner);
      inner->set("loop", loop_object(items, i));
      Flow f = exec(n.body, inner, out);
      if (f == Flow::break_) break;
    }
    return Flow::normal;
  }

  static Value loop_object(const std::vector<Value>& items, int64_t i) {
    const int64_t len = static_cast<int64_t>(items.size());
    auto d = make_dict(Dict::Kind::loop);
    d->entries = {{"index", i + 1},       {"index0", i},          {"revindex", len - i},  {"revindex0", len - i - 1},
                  {"first", i == 0},      {"last", i == len - 1}, {"length", len},         {"depth", int64_t{1}},
                  {"depth0", int64_t{0}}};
    if (i > 0) d->entries.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
    if (i + 1 < len) d->entries.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
    d->entries.emplace_back("cycle", CallablePtr{std::make_shared<const Callable>(Callable{"loop.cycle", [i](Args& a) {
                                                   if (a.positional.empty()) fail("no items for cycling given");
                                                   return a.positional[static_cast<size_t>(i) % a.positional.size()];
                                                 }})});
    return d;
  }

  void assign(const Expr& target, Value v, const ScopePtr& scope) {
    if (target.kind == Expr::Kind::name) {
      scope->set(target.name, std::move(v));
    } else if (target.kind == Expr::Kind::tuple) {
      std::vector<Value> parts = iterate(v);
      if (parts.size() != target.args.size())
        fail("cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(target.args.size()) + " names");
      for (size_t i = 0; i < parts.size(); ++i) assign(*target.args[i], std::move(parts[i]), scope);
    } else if (target.kind == Expr::Kind::attr) {
      const Value ns = eval(*target.args[0], scope);
      if (!ns.dict() || ns.dict_ptr()->kind != Dict::Kind::namespace_)
        fail("cannot assign attribute on non-namespace object (" + type_name(ns) + ")");
      ns.dict_ptr()->set(target.name, std::move(v));
    } else {
      fail("cannot assign to this expression");
    }
  }

  Value macro(const Node& n, const ScopePtr& defined_in) {
    const Node* node = &n;
    std::weak_ptr<Scope> weak = defined_in;
    // The macro holds its defining scope weakly (the scope holds the macro):
    // a macro called after its scope ended is refused, not undefined behaviour.
    return CallablePtr{std::make_shared<const Callable>(Callable{n.name, [this, node, weak](Args& a) -> Value {
      auto parent = weak.lock();
      if (!parent) fail("macro '" + node->name + "' is called after the scope it was defined in ended");
      step();
      if (++depth_ > kMaxCallDepth) fail("macros nest deeper than " + std::to_string(kMaxCallDepth) + " calls");
      struct Leave {
        int& d;
        ~Leave() { --d; }
      } leave{depth_};
      auto scope = std::make_shared<Scope>();
      scope->parent = parent;
      std::vector<Value> extra;
      for (size_t i = 0; i < a.positional.size(); ++i) {
        if (i < node->params.size()) scope->set(node->params[i].name, a.positional[i]);
        else extra.push_back(a.positional[i]);
      }
      auto kwargs = make_dict();
      for (auto& [k, v] : a.keywords) {
        bool is_param = false;
        for (const auto& p : node->params) is_param = is_param || p.name == k;
        if (is_param) scope->set(k, v);
        else kwargs->set(k, v);
      }
      for (const auto& p : node->params) {
        bool bound = false;
        for (const auto& [k, v] : scope->vars) bound = bound || k == p.name;
        if (!bound) scope->set(p.name, p.default_value ? eval(*p.default_value, scope) : Value{Undefined{"'" + p.name + "' is undefined"}});
      }
      scope->set("varargs", make_list(std::move(extra)));
      scope->set("kwargs", kwargs);
      std::string text;
      exec(node->body, scope, text);
      return text;
    }})};
  }

  Value filter_chain(const Expr& e, Value body, const ScopePtr& scope) {
    Value subject = e.args[0] ? filter_chain(*e.args[0], std::move(body), scope) : std::move(body);
    Args args = arguments(e, scope);
    return apply_filter(e.name, subject, args);
  }

  Args arguments(const Expr& e, const ScopePtr& scope) {
    Args a;
    for (size_t i = 1; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i], scope));
    for (const auto& [k, x] : e.keywords) a.keywords.emplace_back(k, eval(*x, scope));
    return a;
  }

  Value lookup(const std::string& name, const ScopePtr& scope) {
    if (const Value* v = scope->find(name)) return *v;
    if (const Value* v = variables_->find(name)) return *v;
    return global(name, clock_);
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    try {
      return eval_inner(e, scope);
    } catch (Failure& f) {
      if (f.line == 0) f.line = e.line;
      throw;
    }
  }

  Value eval_inner(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case Expr::Kind::literal: return e.value;
      case Expr::Kind::name: return lookup(e.name, scope);
      case Expr::Kind::list:
      case Expr::Kind::tuple: {
        std::vector<Value> items;
        for (const auto& x : e.args) items.push_back(eval(*x, scope));
        return make_list(std::move(items), e.kind == Expr::Kind::tuple);
      }
      case Expr::Kind::dict: {
        auto d = make_dict();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i], scope);
          if (!k.string()) fail("glint's Jinja takes only strings as dict keys, got " + type_name(k));
          d->set(k.str(), eval(*e.args[i + 1], scope));
        }
        return d;
      }
      case Expr::Kind::attr: return get_attr(eval(*e.args[0], scope), e.name);
      case Expr::Kind::item: return get_item(eval(*e.args[0], scope), eval(*e.args[1], scope));
      case Expr::Kind::slice: {
        auto part = [&](size_t i) { return e.args[i] ? eval(*e.args[i], scope) : Value{nullptr}; };
        return slice(eval(*e.args[0], scope), part(1), part(2), part(3));
      }
      case Expr::Kind::call: {
        const Value f = eval(*e.args[0], scope);
        require_defined(f);
        if (!f.callable()) fail("'" + type_name(f) + "' object is not callable");
        Args a = arguments(e, scope);
        return f.fn().call(a);
      }
      case Expr::Kind::filter: {
        Args a = arguments(e, scope);
        return apply_filter(e.name, eval(*e.args[0], scope), a);
      }
      case Expr::Kind::test: {
        Args a = arguments(e, scope);
        return apply_test(e.name, eval(*e.args[0], scope), a) != e.negated;
      }
      case Expr::Kind::unary: {
        const Value v = eval(*e.args[0], scope);
        if (e.name == "not") return !truthy(v);
        require_defined(v);
        if (!v.number()) fail("bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
        if (e.name == "+") return v.boolean() ? Value{v.as_int()} : v;
        if (v.real()) return -v.as_double();
        if (v.as_int() == INT64_MIN) fail("the integer result of - is too large for glint's Jinja (64 bits)");
        return -v.as_int();
      }
      case Expr::Kind::binary: {
        if (e.name == "and") {
          Value a = eval(*e.args[0], scope);
          return truthy(a) ? eval(*e.args[1], scope) : a;
        }
        if (e.name == "or") {
          Value a = eval(*e.args[0], scope);
          return truthy(a) ? a : eval(*e.args[1], scope);
        }
        const Value a = eval(*e.args[0], scope), b = eval(*e.args[1], scope);
        if (e.name == "~") {
          std::string l = to_str(a), r = to_str(b);
          charge_bytes(l.size() + r.size());
          return l + r;
        }
        return arithmetic(e.name, a, b);
      }
      case Expr::Kind::compare: {
        Value left = eval(*e.args[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], scope);
          const std::string& op = e.ops[i];
          bool r;
          if (op == "==") r = equal(left, right);
          else if (op == "!=") r = !equal(left, right);
          else if (op == "<") r = less(left, right);
          else if (op == ">") r = less(right, left);
          else if (op == "<=") r = !less(right, left);
          else if (op == ">=") r = !less(left, right);
          else if (op == "in") r = contains(right, left);
          else r = !contains(right, left);
          if (!r) return false;
          left = std::move(right);
        }
        return true;
      }
      case Expr::Kind::conditional:
        if (truthy(eval(*e.args[1], scope))) return eval(*e.args[0], scope);
        return e.args[2] ? eval(*e.args[2], scope) : Value{Undefined{"the conditional expression has no else"}};
    }
    return Value{};
  }

  DictPtr variables_;
  Clock clock_;
  Output* main_ = nullptr;
  int depth_ = 0;
};

}  // namespace

Output render(const Body& body, const DictPtr& variables, const Clock& clock) {
  return Interpreter{variables, clock}.run(body);
}

}  // namespace glint::components::jinja
