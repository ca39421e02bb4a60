// placement/config.cpp with toml++ as glint ships it. The main build links
// Debian's libtomlplusplus, built without assertions; here toml++ is
// compiled header-only (so it is instrumented), and its debug assertions
// would stop on inputs its release build refuses with a parse error (3.3.0
// asserts in parse_key on "[\n"). Memory errors behind them still show
// under the sanitizers. (Not NDEBUG: toml++ then turns them into
// __builtin_assume, and glint's own asserts stay on.)
#define TOML_ASSERT(expr) static_assert(true)
#include "placement/config.cpp"
