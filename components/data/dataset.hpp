#pragma once
/// `Dataset`: rows of conversations read from JSONL or JSON, preprocessed,
/// filtered, shuffled and encoded with a chat template, as Twinkle's
/// Dataset does:
///
///   auto ds = Dataset::load({.path = "data/self_cognition.jsonl", .slice_end = 1000});
///   ds->map(preprocess::self_cognition("glint bot", "the glint team"));
///   ds->shuffle(42);
///   ds->set_template(*chat);
///   ds->encode({.add_generation_prompt = false});   // on a thread pool
///   ds->encoded(0).input_ids;  ds->skipped().summary();
///
/// Formats: a .jsonl file holds one JSON object per line; a .csv file a
/// header and one row per record (RFC 4180: quoted fields may hold commas,
/// quotes and line breaks), as ms-swift reads CSV; any other file a JSON
/// array of objects. A row has "messages" ([{"role", "content"}, ...], with
/// tool calls and tool messages in OpenAI's or ms-swift's agent layout, and
/// "tools": agent_rows.hpp), or ShareGPT's "conversations" ({"from",
/// "value"}), and/or plain fields (strings and numbers, such as GSM8K's
/// "question" and "answer", kept as text); a preprocessor turns fields into
/// messages.
///
/// Bad rows never stop a job: a line that is not JSON, a row without
/// messages at encode time, a preprocessor's refusal, a conversation longer
/// than max_length (or with nothing left to learn once truncated) is
/// skipped, counted by reason in skipped(), and the first few of each
/// reason are logged with their file and line. A file that cannot be read,
/// or a .json file that is not an array of objects, is an error.
///
/// Not thread-safe: one owner (a dataloader) calls it.

#include "components/data/template.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace glint::components {

struct Row {
  std::vector<Message> messages;
  std::map<std::string, std::string> fields;  ///< the row's other string and number fields
  std::string origin;                         ///< "file:line" (JSONL) or "file[index]" (JSON)
  /// Keys whose values were non-empty arrays or objects (other than
  /// "messages" and the lists of messages in `conversations`): not kept,
  /// named so that a layout that would need them refuses the row.
  std::vector<std::string> nested{};
  /// The row's other lists of messages ({"role", "content"} objects), as
  /// preference rows hold them ("chosen": [...], "rejected": [...]).
  std::map<std::string, std::vector<Message>> conversations{};
  /// The tools offered (a JSON list, "tools" of OpenAI's and ms-swift's
  /// agent rows); "" for none.
  std::string tools{};
  friend bool operator==(const Row&, const Row&) = default;
};

/// Skipped rows by reason.
struct SkipReport {
  std::map<std::string, int64_t> counts;
  int64_t total() const;
  /// "3 rows skipped: 2 invalid JSON, 1 too long" or "no rows skipped".
  std::string summary() const;
};

struct DatasetMeta {
  std::string path;
  /// Rows [slice_begin, slice_end) of the valid rows, as Twinkle's data_slice; -1: to the end.
  int64_t slice_begin = 0;
  int64_t slice_end = -1;
  /// Where skipped rows are logged (the first few of each reason); null: stderr.
  std::function<void(const std::string&)> log = nullptr;
};

/// A named row transformation. Returning an error skips the row; the
/// error's text is the reason it is counted under, so keep it free of
/// per-row values (the row's origin is logged with it).
struct Preprocessor {
  std::string name;
  std::function<Result<Row>(Row)> apply;
};

struct EncodeOptions {
  bool add_generation_prompt = false;  ///< prompts to sample from (RL) rather than rows to train on (SFT)
  int threads = 0;                     ///< 0: the machine's hardware threads
};

class Dataset {
public:
  static Result<Dataset> load(const DatasetMeta& meta);
  /// Rows read from `in` as load() reads the file meta.path, whose name
  /// still picks the format (.jsonl or JSON) and names rows in logs; load()
  /// opens the file and calls this.
  static Result<Dataset> parse(std::istream& in, const DatasetMeta& meta);
  static Dataset from_rows(std::vector<Row> rows, std::string name = "rows");

  size_t size() const { return rows_.size(); }
  const Row& row(size_t i) const { return rows_.at(i); }
  const std::string& name() const { return name_; }

  /// Applies `p` to every row; rows it refuses are skipped. Drops earlier encodings.
  Dataset& map(const Preprocessor& p);
  /// Keeps the rows `keep` accepts; the others are counted as "filtered: <name>".
  Dataset& filter(const std::string& name, const std::function<bool(const Row&)>& keep);
  /// A seeded permutation (Fisher-Yates on splitmix64: the same on every platform).
  Dataset& shuffle(uint64_t seed);

  void set_template(Template chat) { template_ = std::move(chat); }
  /// Encodes every row with the template on `threads` threads; rows that
  /// fail are skipped (in row order, so the result does not depend on the
  /// thread count). Error: no template set.
  Result<void> encode(const EncodeOptions& options = {});
  /// Row i's tokens; valid after encode().
  const EncodedRow& encoded(size_t i) const { return encoded_.at(i); }

  const SkipReport& skipped() const { return skipped_; }

private:
  void skip(const std::string& reason, const std::string& origin, const std::string& detail);

  std::string name_;
  std::vector<Row> rows_;
  std::vector<EncodedRow> encoded_;
  std::optional<Template> template_;
  SkipReport skipped_;
  std::function<void(const std::string&)> log_;
};

/// Writes rows as JSONL (messages, then fields), through a temporary file
/// renamed into place, so a reader never sees half a file.
Result<void> save_jsonl(std::span<const Row> rows, const std::string& path);

/// Every text of a row (message contents and field values): what a
/// tokenizer is trained on.
std::vector<std::string> texts_of(const Dataset& ds);

/// Preprocessors users know from Twinkle.
namespace preprocess {
/// Replaces {{NAME}} and {{AUTHOR}} in every message; rows with "query" and
/// "response" fields (the self-cognition dataset) become user/assistant turns.
Preprocessor self_cognition(std::string model_name, std::string model_author);
/// GSM8K rows ("question", "answer" ending in "#### n") become a system
/// prompt, the question and the reference solution; fields["solution"]
/// keeps n for the rewards. The default system prompt asks for the final
/// answer after "####".
Preprocessor gsm8k(std::string system_prompt = "");

/// The conversation layouts SFT data comes in (ms-swift's and Twinkle's):
/// - messages: "messages": [{"role", "content"}, ...] (as read);
/// - query_response: "query" and "response" (and optionally "system"):
///   one user turn and its answer; a non-empty "history" is refused;
/// - alpaca: "instruction", optional "input" (joined to it by a newline),
///   "output" (and optionally "system"); a non-empty "history" is refused;
/// - gsm8k: "question" and "answer" (its worked answer, "#### n" included);
/// - auto: each row as the first of these its keys fit.
/// A row that does not fit is skipped as "not in the <layout> layout" (or
/// "in no known layout"); `system` becomes a leading system message of rows
/// that have none. Names: layout_names().
Result<Preprocessor> layout(const std::string& name, std::string system = "");
/// "auto", "messages", "query_response", "alpaca", "gsm8k".
const std::vector<std::string>& layout_names();

/// Rows of prompts to sample from (RL), as glint grpo reads them: each
/// becomes messages that end with a user turn, and the reference answer,
/// when the row has one, the field "solution" (a "#### n" final answer is
/// cut to n). Its other fields stay (a reward command reads them).
/// - gsm8k: "question" and "answer" (with its "#### n");
/// - prompt: "prompt" (a string) and optionally "solution" or "answer";
/// - messages: "messages"; a last assistant turn is dropped and, when it
///   has a "#### n" and there is no "solution" field, gives the solution;
/// - query_response: "query", and "response" as the solution;
/// - auto: each row as the first of these its keys fit.
/// `system` becomes a leading system message of rows that have none.
/// Names: prompt_layout_names().
Result<Preprocessor> prompt_layout(const std::string& name, std::string system = "");
/// "auto", "gsm8k", "prompt", "messages", "query_response".
const std::vector<std::string>& prompt_layout_names();
}  // namespace preprocess

/// The final answer of a GSM8K-style solution: the text after the last
/// "####", trimmed, thousands separators removed; nullopt when there is none.
std::optional<std::string> gsm8k_final_answer(std::string_view solution);

}  // namespace glint::components
