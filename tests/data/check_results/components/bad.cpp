// A fixture for scripts/check_results.py: each line marked BAD must be found.
Result<int> parse_number(const std::string& s);
struct Thing {
  static Result<Thing> make(int);
  Result<int> value_of() const;
};
int use(const Thing& t, int x, int y) {
  auto a = *parse_number("1");           // BAD
  auto b = *Thing::make(2);              // BAD
  auto c = *t.value_of();                // BAD
  auto d = x * parse_number("3").value(); // fine: a multiplication, and value() is explicit
  auto r = parse_number("4");
  if (!r) return 0;
  auto e = *r;                           // fine: checked
  return *parse_number("5");             // BAD
}
