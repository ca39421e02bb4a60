#include "components/data/dataset.hpp"

#include "components/data/detail/json_depth.hpp"

#include "components/data/agent_rows.hpp"

#include "components/data/detail/splitmix.hpp"
#include "runtime/text.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

namespace glint::components {

namespace {

constexpr int kLoggedPerReason = 3;

std::string scalar_text(const nlohmann::ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());  // past int64: not as a negative
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) return v.dump();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  return {};
}

// A row from a JSON object; a string error is the reason to skip it. Kept
// in the file's key order (a tool call's arguments render in it).
Result<Row> row_of(const nlohmann::ordered_json& j, std::string origin) {
  if (!j.is_object()) return make_error(errc::invalid_argument, "not a JSON object");
  Row row;
  row.origin = std::move(origin);
  auto is_message = [](const nlohmann::ordered_json& m) {
    return m.is_object() && m.contains("role") && m.contains("content") && m["role"].is_string() &&
           (m["content"].is_string() || m["content"].is_null());
  };
  auto message_of = [](const nlohmann::ordered_json& m) {
    return Message{m["role"].get<std::string>(), m["content"].is_null() ? "" : m["content"].get<std::string>()};
  };
  bool sharegpt = false;
  for (const auto& [key, v] : j.items()) {
    if (key == "messages") {
      auto ms = agent_messages(v, false);
      if (!ms) return ms.error();
      row.messages = std::move(*ms);
    } else if (key == "conversations" && is_sharegpt(v)) {
      auto ms = agent_messages(v, true);
      if (!ms) return ms.error();
      if (!j.contains("messages")) row.messages = std::move(*ms), sharegpt = true;
    } else if (key == "tools" && !v.is_null() && !(v.is_array() && v.empty()) && !(v.is_string() && v.get<std::string>().empty())) {
      auto tools = agent_tools(v);
      if (!tools) return tools.error();
      if (*tools != "[]") row.tools = std::move(*tools);  // "[]" as a string: none either
    } else if (v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), is_message)) {
      auto& c = row.conversations[key];
      for (const auto& m : v) c.push_back(message_of(m));
    } else if (v.is_primitive() && !v.is_null()) {
      row.fields[key] = scalar_text(v);
    } else if (v.is_structured() && !v.empty()) {
      row.nested.push_back(key);
    }
  }
  // ShareGPT keeps the system prompt beside the turns.
  if (sharegpt)
    if (auto s = row.fields.find("system"); s != row.fields.end() && !s->second.empty() &&
                                            (row.messages.empty() || row.messages.front().role != "system"))
      row.messages.insert(row.messages.begin(), Message{"system", s->second});
  return row;
}

// The longest line a .jsonl row may have; past it the reading stops
// instead of taking a line without end (a binary file) into memory.
constexpr size_t kMaxLineBytes = size_t{64} << 20;

// std::getline, but stops a line one byte past kMaxLineBytes.
bool read_line(std::istream& in, std::string& line) {
  line.clear();
  std::streambuf* buf = in.rdbuf();
  for (;;) {
    const int c = buf->sbumpc();
    if (c == std::char_traits<char>::eof()) {
      if (line.empty()) in.setstate(std::ios::eofbit);
      return !line.empty();
    }
    if (c == '\n') return true;
    line.push_back(static_cast<char>(c));
    if (line.size() > kMaxLineBytes) return true;
  }
}

// The records of a CSV file (RFC 4180: a field in double quotes may hold
// commas, line breaks and "" for a quote), each with the line it starts on.
// false: a quoted field never closed.
bool csv_records(std::istream& in, std::vector<std::pair<int64_t, std::vector<std::string>>>& out) {
  std::string text{std::istreambuf_iterator<char>(in), {}};
  if (text.starts_with("\xEF\xBB\xBF")) text.erase(0, 3);  // a byte order mark, as spreadsheets write
  std::vector<std::string> record;
  std::string field;
  bool quoted = false, any = false;
  int64_t line = 1, start = 1;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') field += '"', ++i;
      else if (c == '"') quoted = false;
      else field += c, line += c == '\n';
      continue;
    }
    if (c == '"' && field.empty()) {
      quoted = any = true;
    } else if (c == ',') {
      record.push_back(std::move(field));
      field.clear();
      any = true;
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      if (any || !field.empty()) {
        record.push_back(std::move(field));
        out.emplace_back(start, std::move(record));
      }
      record.clear();
      field.clear();
      any = false;
      start = ++line;
    } else {
      field += c;
      any = true;
    }
  }
  if (quoted) return false;
  if (any || !field.empty()) {
    record.push_back(std::move(field));
    out.emplace_back(start, std::move(record));
  }
  return true;
}

constexpr int kMaxRowDepth = 64;

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

}  // namespace

int64_t SkipReport::total() const {
  int64_t n = 0;
  for (const auto& [_, c] : counts) n += c;
  return n;
}

std::string SkipReport::summary() const {
  if (counts.empty()) return "no rows skipped";
  std::string s = std::to_string(total()) + (total() == 1 ? " row" : " rows") + " skipped:";
  bool first = true;
  for (const auto& [reason, c] : counts) {
    s += (first ? " " : ", ") + std::to_string(c) + " " + reason;
    first = false;
  }
  return s;
}

void Dataset::skip(const std::string& reason, const std::string& origin, const std::string& detail) {
  auto n = ++skipped_.counts[reason];
  if (n > kLoggedPerReason) return;
  auto line = "dataset " + name_ + ": skipped " + origin + " (" + reason + ")" + (detail.empty() ? "" : ": " + detail);
  if (n == kLoggedPerReason) line += " [further rows skipped for this reason are counted, not logged]";
  if (log_) log_(line);
  else std::fprintf(stderr, "glint: %s\n", line.c_str());
}

Result<Dataset> Dataset::load(const DatasetMeta& meta) {
  // Only regular files: a directory would read as "failed part way", a FIFO
  // with no writer would block forever, and /dev/zero would be read until
  // memory ran out.
  std::error_code ec;
  const auto status = std::filesystem::status(meta.path, ec);
  if (!ec && std::filesystem::is_directory(status))
    return make_error(errc::invalid_argument, "dataset " + meta.path +
                                                  " is a directory: name a .jsonl or .json file (one of its files)");
  if (!ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
    return make_error(errc::invalid_argument, "dataset " + meta.path +
                                                  " is not a regular file (a FIFO, socket or device): datasets are read "
                                                  "from .jsonl or .json files");
  std::ifstream in{meta.path, std::ios::binary};
  if (!in) return make_error(errc::not_found, "cannot read dataset " + meta.path + " (does it exist, and may we read it?)");
  return parse(in, meta);
}

Result<Dataset> Dataset::parse(std::istream& in, const DatasetMeta& meta) {
  if (meta.slice_begin < 0 || (meta.slice_end >= 0 && meta.slice_end < meta.slice_begin))
    return make_error(errc::invalid_argument, "data slice [" + std::to_string(meta.slice_begin) + ", " +
                                                  std::to_string(meta.slice_end) + ") of " + meta.path + " is empty or negative");
  Dataset ds;
  ds.name_ = meta.path;
  ds.log_ = meta.log;
  std::vector<Row> rows;
  const bool jsonl = meta.path.ends_with(".jsonl"), csv = meta.path.ends_with(".csv");
  if (csv) {
    std::vector<std::pair<int64_t, std::vector<std::string>>> records;
    if (!csv_records(in, records))
      return make_error(errc::invalid_argument, meta.path + ": a quoted field is never closed (a \" without its pair)");
    if (records.empty()) return make_error(errc::invalid_argument, meta.path + " has no header line");
    const auto header = records.front().second;
    for (size_t r = 1; r < records.size(); ++r) {
      const auto& [line, cells] = records[r];
      auto origin = meta.path + ":" + std::to_string(line);
      if (cells.size() > header.size()) {
        ds.skip("malformed row", origin, std::to_string(cells.size()) + " fields, the header names " + std::to_string(header.size()));
        continue;
      }
      // Columns as fields (an empty cell is an absent one, as ms-swift reads
      // CSV); "messages" or "tools" holding JSON read as in a JSON row.
      nlohmann::ordered_json j = nlohmann::ordered_json::object();
      for (size_t k = 0; k < cells.size(); ++k) {
        if (cells[k].empty()) continue;
        if ((header[k] == "messages" || header[k] == "conversations") && !detail::json_nests_deeper(cells[k], kMaxRowDepth)) {
          auto v = nlohmann::ordered_json::parse(cells[k], nullptr, false);
          j[header[k]] = v.is_discarded() ? nlohmann::ordered_json(cells[k]) : v;
        } else {
          j[header[k]] = cells[k];
        }
      }
      auto row = row_of(j, origin);
      if (!row) ds.skip("malformed row", origin, context_of(row.error()));
      else rows.push_back(std::move(*row));
    }
  } else if (jsonl) {
    std::string line;
    for (int64_t n = 1; read_line(in, line); ++n) {
      auto origin = meta.path + ":" + std::to_string(n);
      if (line.size() > kMaxLineBytes)
        return make_error(errc::invalid_argument, origin + " is longer than " + std::to_string(kMaxLineBytes >> 20) +
                                                      " MiB: a .jsonl file holds one row per line (is it JSONL?)");
      if (trim(line).empty()) continue;
      if (detail::json_nests_deeper(line, kMaxRowDepth)) {
        ds.skip("nested deeper than 64 levels", origin, "");
        continue;
      }
      auto j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) {
        ds.skip("invalid JSON", origin, "");
        continue;
      }
      auto row = row_of(j, origin);
      if (!row) ds.skip("malformed row", origin, context_of(row.error()));
      else rows.push_back(std::move(*row));
    }
    if (in.bad()) return make_error(errc::unavailable, "reading " + meta.path + " failed part way");
  } else {
    std::stringstream s;
    s << in.rdbuf();
    if (detail::json_nests_deeper(s.str(), kMaxRowDepth + 1))
      return make_error(errc::invalid_argument, meta.path + " nests deeper than 64 levels in a row");
    auto j = nlohmann::ordered_json::parse(s.str(), nullptr, false);
    if (j.is_discarded() || !j.is_array())
      return make_error(errc::invalid_argument, meta.path + " is not a JSON array of rows (a .jsonl file holds one JSON object per line)");
    for (size_t i = 0; i < j.size(); ++i) {
      auto origin = meta.path + "[" + std::to_string(i) + "]";
      auto row = row_of(j[i], origin);
      if (!row) ds.skip("malformed row", origin, context_of(row.error()));
      else rows.push_back(std::move(*row));
    }
  }
  auto begin = std::min<size_t>(static_cast<size_t>(meta.slice_begin), rows.size());
  auto end = meta.slice_end < 0 ? rows.size() : std::min<size_t>(static_cast<size_t>(meta.slice_end), rows.size());
  ds.rows_.assign(std::make_move_iterator(rows.begin() + static_cast<std::ptrdiff_t>(begin)),
                  std::make_move_iterator(rows.begin() + static_cast<std::ptrdiff_t>(end)));
  return ds;
}

Dataset Dataset::from_rows(std::vector<Row> rows, std::string name) {
  Dataset ds;
  ds.name_ = std::move(name);
  ds.rows_ = std::move(rows);
  return ds;
}

Dataset& Dataset::map(const Preprocessor& p) {
  encoded_.clear();
  std::vector<Row> kept;
  kept.reserve(rows_.size());
  for (auto& r : rows_) {
    auto origin = r.origin;
    auto out = p.apply(std::move(r));
    if (!out) {
      skip(p.name + ": " + context_of(out.error()), origin, "");
      continue;
    }
    if (out->origin.empty()) out->origin = origin;
    kept.push_back(std::move(*out));
  }
  rows_ = std::move(kept);
  return *this;
}

Dataset& Dataset::filter(const std::string& name, const std::function<bool(const Row&)>& keep) {
  encoded_.clear();
  std::vector<Row> kept;
  for (auto& r : rows_) {
    if (keep(r)) kept.push_back(std::move(r));
    else skip("filtered: " + name, r.origin, "");
  }
  rows_ = std::move(kept);
  return *this;
}

Dataset& Dataset::shuffle(uint64_t seed) {
  detail::SplitMix64{seed}.shuffle(rows_);
  // Keep rows and encodings together: the same permutation again.
  if (!encoded_.empty()) detail::SplitMix64{seed}.shuffle(encoded_);
  return *this;
}

Result<void> Dataset::encode(const EncodeOptions& options) {
  if (!template_) return make_error(errc::failed_precondition, "dataset " + name_ + " has no template: call set_template first");
  const size_t n = rows_.size();
  std::vector<Result<EncodedRow>> out(n, Result<EncodedRow>{EncodedRow{}});
  unsigned threads = options.threads > 0 ? static_cast<unsigned>(options.threads) : std::thread::hardware_concurrency();
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(std::max<size_t>(n / 64, 1))));
  auto work = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      if (!rows_[i].messages.empty())
        out[i] = template_->encode(rows_[i].messages, options.add_generation_prompt, rows_[i].tools);
    }
  };
  std::vector<std::thread> pool;
  const size_t chunk = (n + threads - 1) / threads;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work, std::min(n, t * chunk), std::min(n, (t + 1) * chunk));
  work(0, std::min(n, chunk));
  for (auto& t : pool) t.join();

  std::vector<Row> kept;
  encoded_.clear();
  for (size_t i = 0; i < n; ++i) {
    if (rows_[i].messages.empty()) {
      skip("no messages (map a preprocessor first)", rows_[i].origin, "");
      continue;
    }
    if (!out[i]) {
      const auto& e = out[i].error();
      std::string reason = code_of(e) != errc::resource_exhausted ? "cannot encode"
                           : template_->options().truncation == Truncation::refuse ? "too long"
                                                                                   : "too long after truncation";
      skip(reason, rows_[i].origin, context_of(e));
      continue;
    }
    kept.push_back(std::move(rows_[i]));
    encoded_.push_back(std::move(*out[i]));
  }
  rows_ = std::move(kept);
  return {};
}

Result<void> save_jsonl(std::span<const Row> rows, const std::string& path) {
  auto tmp = path + ".tmp";
  {
    std::ofstream out{tmp, std::ios::binary | std::ios::trunc};
    if (!out) return make_error(errc::not_found, "cannot write " + tmp + " (does its directory exist?)");
    for (const auto& r : rows) {
      nlohmann::ordered_json j = nlohmann::ordered_json::object();
      if (!r.tools.empty()) j["tools"] = nlohmann::ordered_json::parse(r.tools, nullptr, false);
      if (!r.messages.empty()) {
        auto& ms = j["messages"] = nlohmann::ordered_json::array();
        for (const auto& m : r.messages) ms.push_back(message_json(m));
      }
      for (const auto& [k, c] : r.conversations) {
        auto& ms = j[k] = nlohmann::ordered_json::array();
        for (const auto& m : c) ms.push_back({{"role", m.role}, {"content", m.content}});
      }
      for (const auto& [k, v] : r.fields) j[k] = v;
      // Bytes that are not UTF-8 (a Latin-1 CSV) are replaced, not a throw.
      out << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
    }
    out.flush();
    if (!out) return make_error(errc::resource_exhausted, "writing " + tmp + " failed (is the disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return make_error(errc::unavailable, "cannot rename " + tmp + " to " + path + ": " + ec.message());
  return {};
}

std::vector<std::string> texts_of(const Dataset& ds) {
  std::vector<std::string> out;
  for (size_t i = 0; i < ds.size(); ++i) {
    for (const auto& m : ds.row(i).messages) {
      out.push_back(m.content);
      if (!m.extra.empty()) out.push_back(m.extra);
    }
    if (!ds.row(i).tools.empty()) out.push_back(ds.row(i).tools);
    for (const auto& [_, v] : ds.row(i).fields) out.push_back(v);
  }
  return out;
}

std::optional<std::string> gsm8k_final_answer(std::string_view solution) {
  auto at = solution.rfind("####");
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view a = trim(solution.substr(at + 4));
  std::string out;
  for (char c : a)
    if (c != ',' && c != '$') out.push_back(c);
  if (out.empty()) return std::nullopt;
  return out;
}

namespace preprocess {

Preprocessor self_cognition(std::string model_name, std::string model_author) {
  return {"self_cognition", [name = std::move(model_name), author = std::move(model_author)](Row r) -> Result<Row> {
            if (r.messages.empty()) {
              auto q = r.fields.find("query"), a = r.fields.find("response");
              if (q == r.fields.end() || a == r.fields.end())
                return make_error(errc::invalid_argument, "no messages and no query/response fields");
              r.messages = {{"user", q->second}, {"assistant", a->second}};
            }
            for (auto& m : r.messages) {
              replace_all(m.content, "{{NAME}}", name);
              replace_all(m.content, "{{AUTHOR}}", author);
            }
            return r;
          }};
}

Preprocessor gsm8k(std::string system_prompt) {
  if (system_prompt.empty())
    system_prompt = "Solve the problem step by step. Write the final answer as a number on the last line, after '####'.";
  return {"gsm8k", [system = std::move(system_prompt)](Row r) -> Result<Row> {
            auto q = r.fields.find("question"), a = r.fields.find("answer");
            if (q == r.fields.end() || a == r.fields.end())
              return make_error(errc::invalid_argument, "no question/answer fields");
            auto final = gsm8k_final_answer(a->second);
            if (!final) return make_error(errc::invalid_argument, "the answer has no '#### n' final answer");
            r.fields["solution"] = *final;
            r.messages = {{"system", system}, {"user", q->second}, {"assistant", a->second}};
            return r;
          }};
}

const std::vector<std::string>& layout_names() {
  static const std::vector<std::string> names = {"auto", "messages", "query_response", "alpaca", "gsm8k"};
  return names;
}

Result<Preprocessor> layout(const std::string& name, std::string system) {
  enum class L { automatic, messages, query_response, alpaca, gsm8k };
  L which;
  if (name == "auto") which = L::automatic;
  else if (name == "messages") which = L::messages;
  else if (name == "query_response") which = L::query_response;
  else if (name == "alpaca") which = L::alpaca;
  else if (name == "gsm8k") which = L::gsm8k;
  else
    return make_error(errc::invalid_argument,
                      "unknown dataset layout '" + name + "'; use auto, messages, query_response, alpaca or gsm8k");
  return Preprocessor{
      "layout:" + name, [which, system = std::move(system)](Row r) -> Result<Row> {
        auto has = [&](const char* k) { return r.fields.count(k) > 0; };
        auto nested = [&](const char* k) { return std::find(r.nested.begin(), r.nested.end(), k) != r.nested.end(); };
        L kind = which;
        if (kind == L::automatic) {
          if (!r.messages.empty()) kind = L::messages;
          else if (has("query") && has("response")) kind = L::query_response;
          else if (has("instruction") && has("output")) kind = L::alpaca;
          else if (has("question") && has("answer")) kind = L::gsm8k;
          else
            return make_error(errc::invalid_argument,
                              "in no known layout (messages, query/response, instruction/output, question/answer)");
        }
        std::vector<Message> turns;
        switch (kind) {
          case L::messages:
            if (r.messages.empty()) return make_error(errc::invalid_argument, "not in the messages layout");
            turns = std::move(r.messages);
            break;
          case L::query_response:
            if (!has("query") || !has("response")) return make_error(errc::invalid_argument, "not in the query_response layout");
            if (nested("history"))
              return make_error(errc::invalid_argument, "a query/response row with \"history\" (write it as messages)");
            turns = {{"user", r.fields["query"]}, {"assistant", r.fields["response"]}};
            break;
          case L::alpaca: {
            if (!has("instruction") || !has("output")) return make_error(errc::invalid_argument, "not in the alpaca layout");
            if (nested("history"))
              return make_error(errc::invalid_argument, "an alpaca row with \"history\" (write it as messages)");
            auto prompt = r.fields["instruction"];
            if (auto in = r.fields.find("input"); in != r.fields.end() && !in->second.empty()) prompt += "\n" + in->second;
            turns = {{"user", prompt}, {"assistant", r.fields["output"]}};
            break;
          }
          case L::gsm8k:
            if (!has("question") || !has("answer")) return make_error(errc::invalid_argument, "not in the gsm8k layout");
            turns = {{"user", r.fields["question"]}, {"assistant", r.fields["answer"]}};
            break;
          case L::automatic: break;
        }
        if (turns.empty() || turns.front().role != "system") {
          std::string sys = system;
          if (auto s = r.fields.find("system"); kind != L::messages && s != r.fields.end()) sys = s->second;
          if (!sys.empty()) turns.insert(turns.begin(), Message{"system", sys});
        }
        r.messages = std::move(turns);
        return r;
      }};
}

const std::vector<std::string>& prompt_layout_names() {
  static const std::vector<std::string> names = {"auto", "gsm8k", "prompt", "messages", "query_response"};
  return names;
}

Result<Preprocessor> prompt_layout(const std::string& name, std::string system) {
  enum class L { automatic, gsm8k, prompt, messages, query_response };
  L which;
  if (name == "auto") which = L::automatic;
  else if (name == "gsm8k") which = L::gsm8k;
  else if (name == "prompt") which = L::prompt;
  else if (name == "messages") which = L::messages;
  else if (name == "query_response") which = L::query_response;
  else
    return make_error(errc::invalid_argument,
                      "unknown prompt layout '" + name + "'; use auto, gsm8k, prompt, messages or query_response");
  return Preprocessor{
      "prompt_layout:" + name, [which, system = std::move(system)](Row r) -> Result<Row> {
        auto has = [&](const char* k) { return r.fields.count(k) > 0; };
        auto nested = [&](const char* k) { return std::find(r.nested.begin(), r.nested.end(), k) != r.nested.end(); };
        // A reference answer: its "#### n" final answer when it has one.
        auto solution_of = [](const std::string& text) {
          if (auto final = gsm8k_final_answer(text)) return *final;
          return std::string{trim(text)};
        };
        L kind = which;
        if (kind == L::automatic) {
          if (!r.messages.empty()) kind = L::messages;
          else if (has("question") && has("answer")) kind = L::gsm8k;
          else if (has("prompt") || nested("prompt") || r.conversations.count("prompt")) kind = L::prompt;
          else if (has("query")) kind = L::query_response;
          else return make_error(errc::invalid_argument, "in no known prompt layout (messages, question/answer, prompt, query)");
        }
        std::vector<Message> turns;
        switch (kind) {
          case L::gsm8k: {
            if (!has("question") || !has("answer")) return make_error(errc::invalid_argument, "not in the gsm8k layout");
            auto final = gsm8k_final_answer(r.fields["answer"]);
            if (!final) return make_error(errc::invalid_argument, "the answer has no '#### n' final answer");
            r.fields["solution"] = *final;
            turns = {{"user", r.fields["question"]}};
            break;
          }
          case L::prompt:
            if (nested("prompt") || r.conversations.count("prompt"))
              return make_error(errc::invalid_argument, "a \"prompt\" that is not a string (write turns as messages)");
            if (!has("prompt")) return make_error(errc::invalid_argument, "not in the prompt layout");
            if (!has("solution") && has("answer")) r.fields["solution"] = solution_of(r.fields["answer"]);
            turns = {{"user", r.fields["prompt"]}};
            break;
          case L::messages:
            if (r.messages.empty()) return make_error(errc::invalid_argument, "not in the messages layout");
            turns = std::move(r.messages);
            if (turns.back().role == "assistant") {
              if (!has("solution"))
                if (auto final = gsm8k_final_answer(turns.back().content)) r.fields["solution"] = *final;
              turns.pop_back();
            }
            if (turns.empty() || turns.back().role != "user")
              return make_error(errc::invalid_argument, "messages that do not end with a user turn");
            break;
          case L::query_response:
            if (!has("query")) return make_error(errc::invalid_argument, "not in the query_response layout");
            if (nested("history"))
              return make_error(errc::invalid_argument, "a query/response row with \"history\" (write it as messages)");
            if (!has("solution") && has("response")) r.fields["solution"] = solution_of(r.fields["response"]);
            turns = {{"user", r.fields["query"]}};
            break;
          case L::automatic: break;
        }
        if (turns.front().role != "system") {
          std::string sys = system;
          if (auto s = r.fields.find("system"); kind != L::messages && s != r.fields.end()) sys = s->second;
          if (!sys.empty()) turns.insert(turns.begin(), Message{"system", sys});
        }
        r.messages = std::move(turns);
        return r;
      }};
}

}  // namespace preprocess

}  // namespace glint::components
