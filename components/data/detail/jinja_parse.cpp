// Jinja2's lexer and grammar, as transformers' environment configures them:
// trim_blocks (the newline after a block or comment tag goes), lstrip_blocks
// (spaces and tabs before a block or comment tag on its own line go), no
// trailing newline kept, `-` and `+` whitespace control on every tag, and
// loopcontrols' {% break %} and {% continue %}. Precedence follows Jinja2's
// parser exactly (in it `~` binds tighter than `+`, and a filter tighter
// than any operator).
#include "components/data/detail/jinja_ast.hpp"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <set>

namespace glint::components::jinja {
namespace {

enum class Tok : uint8_t { data, block_begin, block_end, var_begin, var_end, name, string, integer, floating, op, eof };

struct Token {
  Tok type;
  std::string text;
  int line;
};

[[noreturn]] void syntax(int line, const std::string& what) { throw Failure{what, line}; }

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string rstrip(const std::string& s) {
  size_t n = s.size();
  while (n > 0 && is_ws(s[n - 1])) --n;
  return s.substr(0, n);
}

int count_lines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// Python's unicode-escape decoding of a string literal's body, as Jinja2
// decodes it (after backslash-replacing non-ASCII, so that survives as is).
std::string unescape(std::string_view s, int line) {
  std::u32string out;
  const std::u32string in = decode(s);
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\' || i + 1 == in.size()) {
      out.push_back(in[i]);
      continue;
    }
    const char32_t c = in[++i];
    auto hex = [&](size_t digits) {
      char32_t v = 0;
      for (size_t k = 1; k <= digits; ++k) {
        if (i + k >= in.size() || in[i + k] >= 128 || !std::isxdigit(static_cast<int>(in[i + k])))
          syntax(line, "a truncated \\x, \\u or \\U escape in a string");
        v = v * 16 + static_cast<char32_t>(in[i + k] <= '9' ? in[i + k] - '0' : (in[i + k] | 0x20) - 'a' + 10);
      }
      i += digits;
      if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        syntax(line, "a \\u or \\U escape names no character (a surrogate, or past U+10FFFF)");
      out.push_back(v);
    };
    switch (c) {
      case '\n': break;
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x': hex(2); break;
      case 'u': hex(4); break;
      case 'U': hex(8); break;
      case 'N': syntax(line, "\\N{...} escapes in strings are not supported by glint's Jinja");
      default:
        if (c >= '0' && c <= '7') {
          char32_t v = 0;
          size_t k = 0;
          for (; k < 3 && i + k < in.size() && in[i + k] >= '0' && in[i + k] <= '7'; ++k) v = v * 8 + (in[i + k] - '0');
          i += k - 1;
          out.push_back(v);
        } else {
          out.push_back('\\');
          out.push_back(c);
        }
    }
  }
  return encode(out);
}

class Lexer {
public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    // Jinja2 reads the source by lines and joins them with "\n": line ends
    // become "\n", and (keep_trailing_newline off) a last one goes.
    std::string s;
    s.reserve(src_.size());
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\r') {
        s.push_back('\n');
        if (i + 1 < src_.size() && src_[i + 1] == '\n') ++i;
      } else {
        s.push_back(src_[i]);
      }
    }
    if (!s.empty() && s.back() == '\n') s.pop_back();
    src_ = std::move(s);
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) root();
    tokens_.push_back({Tok::eof, "", line_});
    return std::move(tokens_);
  }

private:
  void emit(Tok t, std::string text, int line) { tokens_.push_back({t, std::move(text), line}); }
  void advance(size_t to) {
    line_ += count_lines(std::string_view{src_}.substr(pos_, to - pos_));
    pos_ = to;
  }

  // Text before a tag, stripped as the tag's whitespace control says.
  void data(std::string text, char modifier, bool lstrip) {
    if (modifier == '-') {
      text = rstrip(text);
    } else if (modifier != '+' && lstrip) {
      const size_t l = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      const bool line_starting = pos_ == 0 || src_[pos_ - 1] == '\n';
      if (l > 0 || line_starting) {
        bool blank = l < text.size();
        for (size_t k = l; k < text.size(); ++k) blank = blank && is_ws(text[k]);
        if (blank) text.resize(l);
      }
    }
    if (!text.empty()) emit(Tok::data, std::move(text), line_);
  }

  // After a block or comment end: "-" eats all whitespace, "+" none, and
  // otherwise one newline goes (trim_blocks).
  size_t after_end(size_t at, char modifier, bool trim) {
    if (modifier == '-') {
      while (at < src_.size() && is_ws(src_[at])) ++at;
    } else if (modifier != '+' && trim && at < src_.size() && src_[at] == '\n') {
      ++at;
    }
    return at;
  }

  void root() {
    size_t start = src_.find('{', pos_);
    while (start != std::string::npos && start + 1 < src_.size() && src_[start + 1] != '{' && src_[start + 1] != '%' &&
           src_[start + 1] != '#')
      start = src_.find('{', start + 1);
    if (start == std::string::npos || start + 1 >= src_.size()) {
      std::string text = src_.substr(pos_);
      if (!text.empty()) emit(Tok::data, std::move(text), line_);
      advance(src_.size());
      return;
    }
    const char kind = src_[start + 1];
    const char modifier = start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+') ? src_[start + 2] : 0;
    // data() looks at whether the text starts a line: it starts at pos_.
    data(src_.substr(pos_, start - pos_), modifier, kind != '{');
    advance(start);
    const size_t body = start + 2 + (modifier ? 1 : 0);
    if (kind == '#') {
      size_t end = src_.find("#}", body);
      if (end == std::string::npos) syntax(line_, "a comment that is never closed (no #})");
      const char m = end > body && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
      advance(end + 2);
      advance(after_end(end + 2, m, true));
      return;
    }
    if (kind == '%' && raw_block(body)) return;
    const int line = line_;
    emit(kind == '%' ? Tok::block_begin : Tok::var_begin, "", line);
    advance(body);
    tag(kind == '%');
  }

  // {% raw %}...{% endraw %}: the text between, as data.
  bool raw_block(size_t body) {
    size_t i = body;
    while (i < src_.size() && is_ws(src_[i])) ++i;
    if (src_.compare(i, 3, "raw") != 0 || (i + 3 < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[i + 3])) || src_[i + 3] == '_')))
      return false;
    i += 3;
    while (i < src_.size() && is_ws(src_[i])) ++i;
    char m = 0;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) m = src_[i++];
    if (src_.compare(i, 2, "%}") != 0) syntax(line_, "{% raw %} takes nothing more");
    size_t text_from = m == '-' ? after_end(i + 2, '-', false) : i + 2;
    // The matching {% endraw %}.
    size_t at = text_from;
    for (;;) {
      size_t open = src_.find("{%", at);
      if (open == std::string::npos) syntax(line_, "a {% raw %} block that is never closed (no {% endraw %})");
      size_t k = open + 2;
      char em = 0;
      if (k < src_.size() && (src_[k] == '-' || src_[k] == '+')) em = src_[k++];
      while (k < src_.size() && is_ws(src_[k])) ++k;
      if (src_.compare(k, 6, "endraw") == 0) {
        k += 6;
        while (k < src_.size() && is_ws(src_[k])) ++k;
        char cm = 0;
        if (k < src_.size() && (src_[k] == '-' || src_[k] == '+')) cm = src_[k++];
        if (src_.compare(k, 2, "%}") != 0) syntax(line_, "{% endraw %} takes nothing more");
        std::string text = src_.substr(text_from, open - text_from);
        if (em == '-') text = rstrip(text);
        if (!text.empty()) emit(Tok::data, std::move(text), line_);
        advance(after_end(k + 2, cm, true));
        return true;
      }
      at = open + 2;
    }
  }

  void tag(bool block) {
    int depth = 0;
    for (;;) {
      while (pos_ < src_.size() && is_ws(src_[pos_])) advance(pos_ + 1);
      if (pos_ >= src_.size()) syntax(line_, block ? "a tag that is never closed (no %})" : "an expression that is never closed (no }})");
      if (depth == 0) {
        if (block) {
          for (char m : {'-', '+', '\0'}) {
            const size_t at = pos_ + (m ? 1 : 0);
            if ((!m || src_[pos_] == m) && src_.compare(at, 2, "%}") == 0) {
              emit(Tok::block_end, "", line_);
              advance(at + 2);
              advance(after_end(at + 2, m, true));
              return;
            }
          }
        } else {
          for (char m : {'-', '\0'}) {
            const size_t at = pos_ + (m ? 1 : 0);
            if ((!m || src_[pos_] == m) && src_.compare(at, 2, "}}") == 0) {
              emit(Tok::var_end, "", line_);
              advance(at + 2);
              if (m == '-') advance(after_end(pos_, '-', false));
              return;
            }
          }
        }
      }
      const char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        emit(Tok::name, src_.substr(pos_, e - pos_), line_);
        advance(e);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        number();
      } else if (c == '\'' || c == '"') {
        size_t e = pos_ + 1;
        while (e < src_.size() && src_[e] != c) e += src_[e] == '\\' ? 2 : 1;
        if (e >= src_.size()) syntax(line_, "a string that is never closed");
        emit(Tok::string, unescape(std::string_view{src_}.substr(pos_ + 1, e - pos_ - 1), line_), line_);
        advance(e + 1);
      } else {
        static const char* const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%", "~", "[", "]", "(",
                                          ")", "{", "}", "<", ">", "=", ".", ":", "|", ",", ";"};
        const char* found = nullptr;
        for (const char* op : ops)
          if (src_.compare(pos_, std::char_traits<char>::length(op), op) == 0) {
            found = op;
            break;
          }
        if (!found) syntax(line_, std::string{"unexpected character '"} + c + "'");
        const std::string op = found;
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) syntax(line_, "unexpected '" + op + "'");
          --depth;
        }
        emit(Tok::op, op, line_);
        advance(pos_ + op.size());
      }
    }
  }

  // Jinja2's integer and float literals (digits may be grouped by "_").
  void number() {
    auto digits = [&](size_t at) {
      size_t e = at;
      while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || (src_[e] == '_' && e + 1 < src_.size() &&
                                                                                        std::isdigit(static_cast<unsigned char>(src_[e + 1])))))
        ++e;
      return e;
    };
    size_t e = digits(pos_);
    bool real = false;
    if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      e = digits(e + 1);
      real = true;
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t k = e + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
        e = digits(k);
        real = true;
      }
    }
    std::string text;
    for (size_t k = pos_; k < e; ++k)
      if (src_[k] != '_') text.push_back(src_[k]);
    emit(real ? Tok::floating : Tok::integer, text, line_);
    advance(e);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

class Parser {
public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body template_body() {
    Body body = subparse({});
    return body;
  }

private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Tok::op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::name && cur().text == n; }
  Token next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  void expect_op(const char* op) {
    if (!is_op(op)) syntax(cur().line, std::string{"expected '"} + op + "', found " + describe(cur()));
    ++i_;
  }
  void expect_name(const char* n) {
    if (!is_name(n)) syntax(cur().line, std::string{"expected '"} + n + "', found " + describe(cur()));
    ++i_;
  }
  void expect_block_end() {
    if (cur().type != Tok::block_end) syntax(cur().line, "expected the end of the tag (%}), found " + describe(cur()));
    ++i_;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::eof: return "the end of the template";
      case Tok::block_end: return "'%}'";
      case Tok::var_end: return "'}}'";
      case Tok::data: return "text";
      case Tok::string: return "a string";
      default: return "'" + t.text + "'";
    }
  }

  // Statements until a {% tag %} named in `ends` (left unconsumed: the
  // stream stands at its name).
  Body subparse(const std::set<std::string>& ends) {
    Body body;
    for (;;) {
      const Token& t = cur();
      if (t.type == Tok::eof) {
        if (!ends.empty()) syntax(t.line, "the template ends inside a block: expected {% " + *ends.begin() + " %}");
        return body;
      }
      if (t.type == Tok::data) {
        auto n = node(Node::Kind::text, t.line);
        n->text = t.text;
        body.push_back(std::move(n));
        ++i_;
      } else if (t.type == Tok::var_begin) {
        ++i_;
        auto n = node(Node::Kind::output, t.line);
        n->expr = parse_tuple(true, false);
        if (cur().type != Tok::var_end) syntax(cur().line, "expected '}}', found " + describe(cur()));
        ++i_;
        body.push_back(std::move(n));
      } else if (t.type == Tok::block_begin) {
        ++i_;
        if (cur().type != Tok::name) syntax(cur().line, "a tag must start with its name, found " + describe(cur()));
        if (ends.count(cur().text)) return body;
        body.push_back(statement());
      } else {
        syntax(t.line, "unexpected " + describe(t));
      }
    }
  }

  NodePtr node(Node::Kind k, int line) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = line;
    return n;
  }

  void end_tag(const char* name) {
    expect_name(name);
    expect_block_end();
  }

  NodePtr statement() {
    Nest nest{*this, cur().line};
    const Token t = next();
    const std::string& w = t.text;
    if (w == "for") return for_statement(t.line);
    if (w == "if") return if_statement(t.line);
    if (w == "set") return set_statement(t.line);
    if (w == "macro") return macro_statement(t.line);
    if (w == "break" || w == "continue") {
      if (loops_ == 0) syntax(t.line, "{% " + w + " %} outside a for loop");
      auto n = node(w == "break" ? Node::Kind::break_ : Node::Kind::continue_, t.line);
      expect_block_end();
      return n;
    }
    if (w == "generation") {
      expect_block_end();
      auto n = node(Node::Kind::generation, t.line);
      n->body = subparse({"endgeneration"});
      end_tag("endgeneration");
      return n;
    }
    if (w == "filter") {
      auto n = node(Node::Kind::filter, t.line);
      n->expr = filter_chain(nullptr);
      expect_block_end();
      n->body = subparse({"endfilter"});
      end_tag("endfilter");
      return n;
    }
    if (w == "with") {
      auto n = node(Node::Kind::with, t.line);
      while (cur().type != Tok::block_end) {
        if (!n->targets.empty()) expect_op(",");
        n->targets.push_back(assign_target(false));
        expect_op("=");
        n->values.push_back(expression(true));
      }
      expect_block_end();
      n->body = subparse({"endwith"});
      end_tag("endwith");
      return n;
    }
    static const std::set<std::string> unsupported = {"include", "import", "from", "extends", "block", "call",
                                                      "autoescape", "do", "trans", "pluralize"};
    if (unsupported.count(w))
      syntax(t.line, "{% " + w + " %} is not supported by glint's Jinja (chat templates are one file; transformers "
                               "enables no extension but loop controls)");
    syntax(t.line, "unknown tag '" + w + "'");
  }

  NodePtr for_statement(int line) {
    auto n = node(Node::Kind::for_, line);
    n->target = assign_target(false, true);
    expect_name("in");
    n->expr = parse_tuple(false, false);
    if (is_name("if")) {
      ++i_;
      n->condition = expression(true);
    }
    if (is_name("recursive")) syntax(cur().line, "recursive for loops are not supported by glint's Jinja");
    expect_block_end();
    ++loops_;
    n->body = subparse({"endfor", "else"});
    --loops_;
    if (is_name("else")) {
      ++i_;
      expect_block_end();
      n->else_body = subparse({"endfor"});
    }
    end_tag("endfor");
    return n;
  }

  NodePtr if_statement(int line) {
    auto n = node(Node::Kind::if_, line);
    n->conditions.push_back(parse_tuple(false, false));
    expect_block_end();
    for (;;) {
      n->bodies.push_back(subparse({"elif", "else", "endif"}));
      if (is_name("elif")) {
        ++i_;
        n->conditions.push_back(parse_tuple(false, false));
        expect_block_end();
        continue;
      }
      if (is_name("else")) {
        ++i_;
        expect_block_end();
        n->else_body = subparse({"endif"});
      }
      end_tag("endif");
      return n;
    }
  }

  NodePtr set_statement(int line) {
    auto target = assign_target(true);
    if (is_op("=")) {
      ++i_;
      auto n = node(Node::Kind::set, line);
      n->target = std::move(target);
      n->expr = parse_tuple(true, false);
      expect_block_end();
      return n;
    }
    auto n = node(Node::Kind::set_block, line);
    if (target->kind != Expr::Kind::name) syntax(line, "a {% set %} block assigns one name");
    n->target = std::move(target);
    if (is_op("|")) n->expr = filter_chain(nullptr);
    expect_block_end();
    n->body = subparse({"endset"});
    end_tag("endset");
    return n;
  }

  NodePtr macro_statement(int line) {
    auto n = node(Node::Kind::macro, line);
    if (cur().type != Tok::name) syntax(cur().line, "a macro needs a name");
    n->name = next().text;
    expect_op("(");
    while (!is_op(")")) {
      if (!n->params.empty()) expect_op(",");
      if (cur().type != Tok::name) syntax(cur().line, "a macro parameter must be a name, found " + describe(cur()));
      MacroParam p{next().text, nullptr};
      if (is_op("=")) {
        ++i_;
        p.default_value = expression(true);
      }
      n->params.push_back(std::move(p));
    }
    ++i_;
    expect_block_end();
    const int saved = loops_;
    loops_ = 0;
    n->body = subparse({"endmacro"});
    loops_ = saved;
    expect_name("endmacro");
    if (cur().type == Tok::name) ++i_;  // {% endmacro name %}
    expect_block_end();
    return n;
  }

  // A name, `a, b` (a tuple of names), or with `with_namespace` `ns.attr`.
  ExprPtr assign_target(bool with_namespace, bool tuple_allowed = true) {
    auto one = [&]() {
      if (cur().type != Tok::name) syntax(cur().line, "cannot assign to " + describe(cur()));
      auto e = expr(Expr::Kind::name, cur().line);
      e->name = next().text;
      if (with_namespace && is_op(".")) {
        ++i_;
        if (cur().type != Tok::name) syntax(cur().line, "expected an attribute name after '.'");
        auto a = expr(Expr::Kind::attr, e->line);
        a->name = next().text;
        a->args.push_back(std::move(e));
        return a;
      }
      return e;
    };
    bool paren = tuple_allowed && is_op("(");
    if (paren) ++i_;
    auto first = one();
    if (!tuple_allowed || !is_op(",")) {
      if (paren) expect_op(")");
      return first;
    }
    auto t = expr(Expr::Kind::tuple, first->line);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (cur().type != Tok::name) break;
      t->args.push_back(one());
    }
    if (paren) expect_op(")");
    return t;
  }

  ExprPtr expr(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  bool tuple_end() const {
    return cur().type == Tok::var_end || cur().type == Tok::block_end || cur().type == Tok::eof || is_op(")") ||
           is_op("]") || is_op("}");
  }

  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parentheses) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool comma = false;
    for (;;) {
      if (!items.empty()) {
        if (!is_op(",")) break;
        ++i_;
        comma = true;
      }
      if (tuple_end()) break;
      items.push_back(expression(with_condexpr));
    }
    if (!comma) {
      if (items.empty()) {
        if (!explicit_parentheses) syntax(line, "expected an expression, found " + describe(cur()));
        return expr(Expr::Kind::tuple, line);
      }
      return std::move(items[0]);
    }
    auto t = expr(Expr::Kind::tuple, line);
    t->args = std::move(items);
    return t;
  }

  // Nesting is bounded, so that a hostile template cannot exhaust the stack.
  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser, int line) : p(parser) {
      if (++p.depth_ > kMaxNesting) syntax(line, "expressions or blocks nest deeper than " + std::to_string(kMaxNesting));
    }
    ~Nest() { --p.depth_; }
  };
  static constexpr int kMaxNesting = 150;
  // Each link of a left-associative chain (a + b + c, x.a.b, x | f | g)
  // deepens the tree as nesting does: counted the same, until the chain ends.
  struct Chain {
    Parser& p;
    int links = 0;
    explicit Chain(Parser& parser) : p(parser) {}
    void link(int line) {
      ++links;
      if (++p.depth_ > kMaxNesting) syntax(line, "an expression chains or nests deeper than " + std::to_string(kMaxNesting));
    }
    ~Chain() { p.depth_ -= links; }
  };

  ExprPtr expression(bool with_condexpr) {
    Nest nest{*this, cur().line};
    return with_condexpr ? condexpr() : or_expr();
  }

  ExprPtr condexpr() {
    Nest nest{*this, cur().line};
    auto e = or_expr();
    while (is_name("if")) {
      const int line = next().line;
      auto cond = or_expr();
      ExprPtr other;
      if (is_name("else")) {
        ++i_;
        other = condexpr();
      }
      auto c = expr(Expr::Kind::conditional, line);
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr a, ExprPtr b, int line) {
    auto e = expr(Expr::Kind::binary, line);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr or_expr() {
    auto e = and_expr();
    Chain chain{*this};
    while (is_name("or")) {
      chain.link(cur().line);
      const int line = next().line;
      e = binary("or", std::move(e), and_expr(), line);
    }
    return e;
  }
  ExprPtr and_expr() {
    auto e = not_expr();
    Chain chain{*this};
    while (is_name("and")) {
      chain.link(cur().line);
      const int line = next().line;
      e = binary("and", std::move(e), not_expr(), line);
    }
    return e;
  }
  ExprPtr not_expr() {
    Nest nest{*this, cur().line};
    if (is_name("not")) {
      auto e = expr(Expr::Kind::unary, next().line);
      e->name = "not";
      e->args.push_back(not_expr());
      return e;
    }
    return compare();
  }
  ExprPtr compare() {
    auto first = math1();
    std::vector<ExprPtr> operands;
    std::vector<std::string> ops;
    const int line = first->line;
    Chain chain{*this};
    for (;;) {
      chain.link(cur().line);
      if (cur().type == Tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
                                    cur().text == ">" || cur().text == ">=")) {
        ops.push_back(next().text);
      } else if (is_name("in")) {
        ++i_;
        ops.push_back("in");
      } else if (is_name("not") && peek().type == Tok::name && peek().text == "in") {
        i_ += 2;
        ops.push_back("notin");
      } else {
        break;
      }
      operands.push_back(math1());
    }
    if (ops.empty()) return first;
    auto e = expr(Expr::Kind::compare, line);
    e->args.push_back(std::move(first));
    for (auto& o : operands) e->args.push_back(std::move(o));
    e->ops = std::move(ops);
    return e;
  }
  ExprPtr math1() {
    auto e = concat();
    Chain chain{*this};
    while (is_op("+") || is_op("-")) {
      chain.link(cur().line);
      const Token t = next();
      e = binary(t.text, std::move(e), concat(), t.line);
    }
    return e;
  }
  ExprPtr concat() {
    auto e = math2();
    Chain chain{*this};
    while (is_op("~")) {
      chain.link(cur().line);
      const int line = next().line;
      e = binary("~", std::move(e), math2(), line);
    }
    return e;
  }
  ExprPtr math2() {
    auto e = power();
    Chain chain{*this};
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      chain.link(cur().line);
      const Token t = next();
      e = binary(t.text, std::move(e), power(), t.line);
    }
    return e;
  }
  ExprPtr power() {
    auto e = unary(true);
    Chain chain{*this};
    while (is_op("**")) {
      chain.link(cur().line);
      const int line = next().line;
      e = binary("**", std::move(e), unary(true), line);
    }
    return e;
  }
  ExprPtr unary(bool with_filter) {
    Nest nest{*this, cur().line};
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = expr(Expr::Kind::unary, cur().line);
      e->name = next().text;
      e->args.push_back(unary(false));
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filter_expr(std::move(e));
    return e;
  }

  ExprPtr primary() {
    const Token t = cur();
    if (t.type == Tok::name) {
      ++i_;
      if (t.text == "true" || t.text == "True") return literal(true, t.line);
      if (t.text == "false" || t.text == "False") return literal(false, t.line);
      if (t.text == "none" || t.text == "None") return literal(nullptr, t.line);
      auto e = expr(Expr::Kind::name, t.line);
      e->name = t.text;
      return e;
    }
    if (t.type == Tok::string) {
      std::string s;
      while (cur().type == Tok::string) s += next().text;
      return literal(std::move(s), t.line);
    }
    if (t.type == Tok::integer) {
      ++i_;
      try {
        return literal(static_cast<int64_t>(std::stoll(t.text)), t.line);
      } catch (const std::exception&) {
        syntax(t.line, "the integer " + t.text + " is too large for glint's Jinja (64 bits)");
      }
    }
    if (t.type == Tok::floating) {
      ++i_;
      return literal(std::strtod(t.text.c_str(), nullptr), t.line);  // 1e400: inf, as Python
    }
    if (is_op("(")) {
      ++i_;
      auto e = parse_tuple(true, true);
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++i_;
      auto e = expr(Expr::Kind::list, t.line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(expression(true));
      }
      ++i_;
      return e;
    }
    if (is_op("{")) {
      ++i_;
      auto e = expr(Expr::Kind::dict, t.line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->args.push_back(expression(true));
        expect_op(":");
        e->args.push_back(expression(true));
      }
      ++i_;
      return e;
    }
    syntax(t.line, "expected an expression, found " + describe(t));
  }

  ExprPtr literal(Value v, int line) {
    auto e = expr(Expr::Kind::literal, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr postfix(ExprPtr e) {
    Chain chain{*this};
    for (;;) {
      if (is_op(".") || is_op("[") || is_op("(")) chain.link(cur().line);
      if (is_op(".")) {
        const int line = next().line;
        if (cur().type == Tok::name) {
          auto a = expr(Expr::Kind::attr, line);
          a->name = next().text;
          a->args.push_back(std::move(e));
          e = std::move(a);
        } else if (cur().type == Tok::integer) {
          auto a = expr(Expr::Kind::item, line);
          a->args.push_back(std::move(e));
          const std::string digits = next().text;
          errno = 0;
          const long long v = std::strtoll(digits.c_str(), nullptr, 10);
          if (errno == ERANGE) syntax(line, "the index " + digits + " is too large for glint's Jinja (64 bits)");
          a->args.push_back(literal(static_cast<int64_t>(v), line));
          e = std::move(a);
        } else {
          syntax(line, "expected an attribute name after '.', found " + describe(cur()));
        }
      } else if (is_op("[")) {
        e = subscript(std::move(e));
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr subscript(ExprPtr e) {
    const int line = next().line;
    std::vector<ExprPtr> parts(3);
    int part = 0;
    bool slice = false;
    while (!is_op("]")) {
      if (is_op(":")) {
        ++i_;
        slice = true;
        if (++part > 2) syntax(line, "a slice has at most three parts");
        continue;
      }
      if (parts[static_cast<size_t>(part)]) syntax(line, "expected ']' or ':' in a subscript, found " + describe(cur()));
      parts[static_cast<size_t>(part)] = expression(true);
      if (!slice && is_op(",")) {  // x[a, b]: a tuple as the key, as Jinja2 reads it
        auto t = expr(Expr::Kind::tuple, line);
        t->args.push_back(std::move(parts[0]));
        while (is_op(",")) {
          ++i_;
          if (is_op("]")) break;
          t->args.push_back(expression(true));
        }
        parts[0] = std::move(t);
      }
    }
    ++i_;
    if (!slice) {
      if (!parts[0]) syntax(line, "an empty subscript");
      auto a = expr(Expr::Kind::item, line);
      a->args.push_back(std::move(e));
      a->args.push_back(std::move(parts[0]));
      return a;
    }
    auto s = expr(Expr::Kind::slice, line);
    s->args.push_back(std::move(e));
    for (auto& p : parts) s->args.push_back(std::move(p));
    return s;
  }

  // "(" args ")" into e's args (after what is already there) and keywords.
  void call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) syntax(cur().line, "*args and **kwargs in calls are not supported by glint's Jinja");
      if (cur().type == Tok::name && peek().type == Tok::op && peek().text == "=") {
        std::string key = next().text;
        ++i_;
        e.keywords.emplace_back(std::move(key), expression(true));
      } else {
        if (!e.keywords.empty()) syntax(cur().line, "a positional argument after a keyword argument");
        e.args.push_back(expression(true));
      }
    }
    ++i_;
  }

  ExprPtr call(ExprPtr e) {
    auto c = expr(Expr::Kind::call, cur().line);
    c->args.push_back(std::move(e));
    call_args(*c);
    return c;
  }

  std::string dotted_name() {
    if (cur().type != Tok::name) syntax(cur().line, "expected a name, found " + describe(cur()));
    std::string n = next().text;
    while (is_op(".") && peek().type == Tok::name) {
      ++i_;
      n += "." + next().text;
    }
    return n;
  }

  // `| f(args) | g` applied to `e` (nullptr: the body of a filter or set block).
  ExprPtr filter_chain(ExprPtr e) {
    Chain chain{*this};
    bool first = true;
    while (first || is_op("|")) {
      chain.link(cur().line);
      if (!first || is_op("|")) expect_op("|");
      first = false;
      const int line = cur().line;
      auto f = expr(Expr::Kind::filter, line);
      f->name = dotted_name();
      if (!has_filter(f->name)) syntax(line, "no filter named '" + f->name + "'");
      f->args.push_back(std::move(e));
      if (is_op("(")) call_args(*f);
      e = std::move(f);
    }
    return e;
  }

  ExprPtr filter_expr(ExprPtr e) {
    Chain chain{*this};
    for (;;) {
      if (is_op("|") || is_name("is") || is_op("(")) chain.link(cur().line);
      if (is_op("|")) {
        e = filter_chain(std::move(e));
      } else if (is_name("is")) {
        const int line = next().line;
        auto t = expr(Expr::Kind::test, line);
        if (is_name("not")) {
          ++i_;
          t->negated = true;
        }
        t->name = dotted_name();
        if (!has_test(t->name)) syntax(line, "no test named '" + t->name + "'");
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          call_args(*t);
        } else if ((cur().type == Tok::name || cur().type == Tok::string || cur().type == Tok::integer ||
                    cur().type == Tok::floating || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          t->args.push_back(postfix(primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int loops_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse(const std::string& source) { return Parser{Lexer{source}.run()}.template_body(); }

}  // namespace glint::components::jinja
