// llama.cpp (through node-llama-cpp's prebuilt binaries) as a child process
// that glint's tests and `glint bench sample` talk to, one line per command:
//
//   node llamacpp_child.mjs --modules DIR --model M.gguf --threads T [--sequences S --context C --batch B]
//     -> "ready: llama.cpp <release> (<build>)"
//   inspect                          -> "inspect: <JSON>"  the file as node-llama-cpp's own GGUF reader sees it
//   tokenize <JSON string>           -> "tokens: <ids>"    llama.cpp's tokenizer: special tokens in the text matched, none added
//   greedy <n> <ids...>              -> "greedy: <ids>"    n greedy tokens after the prompt ids
//   logits <ids...>                  -> "logits: <JSON>"   the raw logits after every position, [T][vocab]
//   run <samples> <max_tokens> <seed> <JSON string: the path of prompts.json>
//                                    -> "ran: <seconds> <tokens>"  every prompt x samples through S parallel
//                                       sequences, each prompt's samples reusing its KV cache, temperature 1
//   quit
//
// DIR is where `npm install node-llama-cpp` put node_modules (scripts/setup_llamacpp.sh).
// Errors go to stdout as "error: <what>" so the parent can show them.
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import path from "node:path";
import { pathToFileURL } from "node:url";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, a, i, all) => (a.startsWith("--") ? [...pairs, [a.slice(2), all[i + 1]]] : pairs), []),
);
const say = (line) => process.stdout.write(line + "\n");

let nlc;
try {
  nlc = await import(pathToFileURL(path.join(args.modules, "node_modules", "node-llama-cpp", "dist", "index.js")).href);
} catch (e) {
  say(`error: cannot load node-llama-cpp from ${args.modules}: ${e.message}; run scripts/setup_llamacpp.sh`);
  process.exit(1);
}
const threads = Number(args.threads ?? 1);
const llama = await nlc.getLlama({ gpu: false, build: "never", maxThreads: threads, logLevel: nlc.LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath: args.model, gpuLayers: 0 });
const sequences = Number(args.sequences ?? 1);
const contextSize = Number(args.context ?? 512);
// One sequence for checks, with an f32 KV cache so that its logits differ
// from glint's by summation order only; and, made at the first `run`, one
// context of S sequences (--sequences) with llama.cpp's default f16 KV cache.
const checkContext = await model.createContext({
  sequences: 1,
  contextSize,
  threads,
  flashAttention: false,
  experimentalKvCacheKeyType: "F32",
  experimentalKvCacheValueType: "F32",
});
let runContext = null;
say(`ready: llama.cpp ${llama.llamaCppRelease.release} (${llama.buildType}, ${llama.cpuMathCores} math cores, ${threads} threads)`);

async function greedy(n, prompt) {
  const seq = checkContext.getSequence();
  const out = [];
  try {
    for await (const t of seq.evaluate(prompt, { temperature: 0, yieldEogToken: true })) {
      out.push(t);
      if (out.length >= n) break;
    }
  } finally {
    seq.dispose();
  }
  return out;
}

async function logits(ids) {
  const seq = checkContext.getSequence();
  try {
    const out = await seq.controlledEvaluate(ids.map((t) => [t, { generateNext: { logits: true } }]));
    return out.map((o) => {
      const dense = new Array(o.next.logits.size).fill(null);
      for (const [t, v] of o.next.logits) dense[t] = v;
      return dense;
    });
  } finally {
    seq.dispose();
  }
}

// Every prompt x samples, through a pool of the context's sequences, as
// llama-server's parallel slots with prompt caching serve them: a slot
// takes the next prompt, evaluates it once and generates its samples one
// after another, rolling its KV cache back to the end of the prompt in
// between (the prompt's last token is evaluated again to get its logits).
async function run(prompts, samples, maxTokens, seed) {
  runContext ??= await model.createContext({
    sequences,
    contextSize,
    batchSize: Number(args.batch ?? 2048),
    threads,
    flashAttention: false,
  });
  let tokens = 0, next = 0;
  const worker = async () => {
    const seq = runContext.getSequence();
    try {
      for (; next < prompts.length; ) {
        const i = next++;
        const prompt = prompts[i];
        await seq.clearHistory();
        for (let s = 0; s < samples; ++s) {
          if (s > 0) await seq.adaptStateToTokens(prompt.slice(0, -1), false);
          const input = s === 0 ? prompt : prompt.slice(-1);
          const options = { temperature: 1, topK: 0, topP: 1, minP: 0, seed: seed + i * samples + s, yieldEogToken: true };
          let n = 0;
          for await (const _ of seq.evaluate(input, options)) {
            if (++n >= maxTokens) break;
          }
          tokens += n;
        }
      }
    } finally {
      seq.dispose();
    }
  };
  const start = process.hrtime.bigint();
  await Promise.all(Array.from({ length: Math.min(sequences, prompts.length) }, worker));
  return [Number(process.hrtime.bigint() - start) / 1e9, tokens];
}

function inspect(info) {
  const meta = {};
  const flatten = (prefix, v) => {
    if (v && typeof v === "object" && !Array.isArray(v)) for (const [k, x] of Object.entries(v)) flatten(prefix ? `${prefix}.${k}` : k, x);
    else meta[prefix] = Array.isArray(v) ? { length: v.length, head: v.slice(0, 8) } : typeof v === "bigint" ? Number(v) : v;
  };
  flatten("", info.metadata);
  const tensors = (info.fullTensorInfo ?? info.tensorInfo ?? []).map((t) => ({
    name: t.name,
    dims: t.dimensions.map(Number),
    type: t.ggmlType,
    offset: Number(t.offset),
  }));
  return { version: info.version, metadata: meta, tensors };
}

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  const [cmd, ...rest] = line.trim().split(/\s+/);
  try {
    if (cmd === "quit") break;
    else if (cmd === "inspect") say("inspect: " + JSON.stringify(inspect(await nlc.readGgufFileInfo(args.model))));
    else if (cmd === "tokenize") say("tokens: " + model.tokenize(JSON.parse(line.slice("tokenize ".length)), true).join(" "));
    else if (cmd === "logits") say("logits: " + JSON.stringify(await logits(rest.map(Number))));
    else if (cmd === "greedy") say("greedy: " + (await greedy(Number(rest[0]), rest.slice(1).map(Number))).join(" "));
    else if (cmd === "run") {
      const path = JSON.parse(line.trim().split(" ").slice(4).join(" "));
      const prompts = JSON.parse(readFileSync(path, "utf8"));
      const [seconds, tokens] = await run(prompts, Number(rest[0]), Number(rest[1]), Number(rest[2]));
      say(`ran: ${seconds} ${tokens}`);
    } else say(`error: unknown command '${cmd}'`);
  } catch (e) {
    say(`error: ${String(e.message ?? e).replace(/\n/g, " ")}`);
  }
}
await runContext?.dispose();
await checkContext.dispose();
await model.dispose();
process.exit(0);
