#include "components/data/jinja.hpp"

#include "components/data/detail/jinja_ast.hpp"
#include "components/data/detail/jinja_builtins.hpp"

#include <cstdlib>

namespace glint::components {

struct JinjaTemplate::Program {
  std::string name;
  jinja::Body body;
};

namespace {

caf::error failure(const std::string& name, const jinja::Failure& f, bool parsing) {
  const std::string where = "chat template " + name + (f.line > 0 ? ", line " + std::to_string(f.line) : "");
  if (f.raised) return make_error(errc::invalid_argument, where + ": the template raised an exception: " + f.message);
  return make_error(errc::invalid_argument, where + (parsing ? ": cannot be parsed: " : ": ") + f.message);
}

}  // namespace

Result<JinjaTemplate> JinjaTemplate::parse(const std::string& source, std::string name) {
  auto p = std::make_shared<Program>();
  p->name = std::move(name);
  try {
    p->body = jinja::parse(source);
  } catch (const jinja::Failure& f) {
    return failure(p->name, f, true);
  } catch (const std::exception& e) {  // std::bad_alloc: ours to see
    return make_error(errc::internal, "chat template " + p->name + ": parsing failed: " + e.what());
  }
  JinjaTemplate t;
  t.program_ = std::move(p);
  return t;
}

Result<JinjaTemplate::Rendered> JinjaTemplate::render(const nlohmann::ordered_json& variables) const {
  if (!variables.is_object())
    return make_error(errc::invalid_argument, "chat template " + program_->name + ": the variables must be a JSON object");
  jinja::Clock clock;
  if (const char* e = std::getenv("SOURCE_DATE_EPOCH"); e && *e) {
    char* end = nullptr;
    const long long v = std::strtoll(e, &end, 10);
    if (*end != 0)
      return make_error(errc::invalid_argument, std::string{"SOURCE_DATE_EPOCH='"} + e + "' is not a whole number of seconds");
    clock.epoch = v;
  }
  try {
    jinja::Value vars = jinja::from_json(variables);
    return jinja::render(program_->body, vars.dict_ptr(), clock);
  } catch (const jinja::Failure& f) {
    return failure(program_->name, f, false);
  } catch (const std::exception& e) {  // std::bad_alloc, a std::stoll range error: ours to see
    return make_error(errc::internal, "chat template " + program_->name + ": " + e.what());
  }
}

const std::string& JinjaTemplate::name() const { return program_->name; }

}  // namespace glint::components
