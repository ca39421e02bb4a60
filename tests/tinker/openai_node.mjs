// `glint serve`'s OpenAI-compatible endpoint driven by OpenAI's own client
// library for Node.js (the npm package openai, scripts/setup_openai.sh):
// chat completions with n, seed and logprobs, the same call streamed (its
// deltas add up to the answer, usage at the end), tools, text completions
// with logprobs, the model list, a refused field and a wrong key as the
// client's own errors.
//   node openai_node.mjs BASE_URL KEY BASE_MODEL   (NODE_PATH: the package's node_modules)
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.env.NODE_PATH ?? ".", "x.js"));
const OpenAI = require("openai");
const [url, key, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: url + "/v1", apiKey: key, maxRetries: 0 });
let checks = 0;
function check(cond, what) {
  if (!cond) throw new Error("FAIL: " + what);
  checks++;
}

const messages = [{ role: "user", content: "the quick brown fox" }];
const r = await client.chat.completions.create({ model, messages, max_tokens: 8, n: 2, seed: 3, logprobs: true, top_logprobs: 2 });
check(r.object === "chat.completion" && r.choices.length === 2, JSON.stringify(r));
check(r.choices.every((c) => typeof c.message.content === "string" && c.logprobs.content.every((t) => t.top_logprobs.length === 2)),
      "choices and logprobs");
check(r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens, "usage");

const stream = await client.chat.completions.create({ model, messages, max_tokens: 8, n: 2, seed: 3, logprobs: true,
                                                      top_logprobs: 2, stream: true, stream_options: { include_usage: true } });
const text = ["", ""];
let usage = null;
for await (const chunk of stream) {
  for (const c of chunk.choices) text[c.index] += c.delta.content ?? "";
  if (chunk.usage) usage = chunk.usage;
}
check(text[0] === r.choices[0].message.content && text[1] === r.choices[1].message.content, "the stream adds up to the answer");
check(usage && usage.total_tokens === r.usage.total_tokens, "the stream's usage");

const t = await client.chat.completions.create({ model, max_tokens: 4, seed: 1, messages: [{ role: "user", content: "fox" }],
                                                 tools: [{ type: "function", function: { name: "f", parameters: {} } }] });
check(t.choices.length === 1 && ["stop", "length", "tool_calls"].includes(t.choices[0].finish_reason), "tools");

const c = await client.completions.create({ model, prompt: "the quick", max_tokens: 5, logprobs: 2, seed: 1 });
check(c.object === "text_completion" && c.choices[0].logprobs.tokens.length === c.choices[0].logprobs.token_logprobs.length,
      "completions");
const models = await client.models.list();
check(models.data.some((m) => m.id === model), "the model list");

try {
  await client.chat.completions.create({ model, messages, frequency_penalty: 1 });
  check(false, "frequency_penalty was not refused");
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.message.includes("frequency_penalty"), "a refused field: " + e);
}
try {
  await new OpenAI({ baseURL: url + "/v1", apiKey: "wrong", maxRetries: 0 }).models.list();
  check(false, "a wrong key was let in");
} catch (e) {
  check(e instanceof OpenAI.AuthenticationError, "a wrong key: " + e);
}
console.log(`openai (npm openai ${require("openai/version").VERSION}): ${checks} checks passed`);
