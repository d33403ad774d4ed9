// The official `openai` package against the gateway: a completion, a streamed
// completion and models.list. Usage: node openai_client.mjs BASE_URL MODEL
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused" });
const fail = (m) => { console.error("openai client: " + m); process.exit(1); };

const list = await client.models.list();
const ids = [];
for await (const m of list) ids.push(m.id);
if (!ids.includes(model)) fail(`models.list has no ${model}: ${JSON.stringify(ids)}`);

const req = { model, prompt: "Hello there", max_tokens: 8, seed: 5, temperature: 0.8 };
const c = await client.completions.create(req);
if (typeof c.choices[0].text !== "string" || c.usage.completion_tokens < 1)
  fail("bad completion " + JSON.stringify(c));
if (!/^[0-9a-f]{64}$/.test(c.system_fingerprint)) fail("system_fingerprint " + c.system_fingerprint);

const stream = await client.completions.create({ ...req, stream: true });
let text = "";
for await (const chunk of stream) for (const ch of chunk.choices) text += ch.text;
if (text !== c.choices[0].text)
  fail(`streamed text ${JSON.stringify(text)} != ${JSON.stringify(c.choices[0].text)}`);
console.log(`openai client: ok (${ids.length} model(s), completion ${JSON.stringify(text)})`);
