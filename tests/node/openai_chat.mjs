// The official `openai` client for Node against an ltm server's HTTP door: one chat completion
// whole and one streamed, printed as one JSON line for tests/python/test_e2e_chat.py to check.
//   node tests/node/openai_chat.mjs BASE_URL MODEL
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0, timeout: 60000 });
const messages = [
  { role: "system", content: "You answer briefly." },
  { role: "user", content: "Who made the light?" },
];

const whole = await client.chat.completions.create({
  model, messages, max_tokens: 8, temperature: 0, seed: 1,
});

const stream = await client.chat.completions.create({
  model, messages, max_completion_tokens: 8, temperature: 0, seed: 1, stream: true,
  stream_options: { include_usage: true },
});
let text = "";
let role = null;
let finish = null;
let usage = null;
let chunks = 0;
for await (const chunk of stream) {
  chunks += 1;
  if (chunk.usage) usage = chunk.usage;
  for (const choice of chunk.choices) {
    if (choice.delta.role) role = choice.delta.role;
    if (choice.delta.content) text += choice.delta.content;
    if (choice.finish_reason) finish = choice.finish_reason;
  }
}

console.log(JSON.stringify({
  object: whole.object,
  content: whole.choices[0].message.content,
  role: whole.choices[0].message.role,
  finish_reason: whole.choices[0].finish_reason,
  usage: whole.usage,
  stream: { text, role, finish_reason: finish, usage, chunks },
}));
