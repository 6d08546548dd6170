// The reference for ltm's tokenizer.json reader: Hugging Face's own tokenizers library, through
// its Node binding (npm `tokenizers`, installed by scripts/setup_test_npm), offline on a local
// file. Used by tests/python/test_tokenizer_json.py.
//
//   node tokenizers_oracle.mjs TOKENIZER_JSON < lines
// reads one JSON string per line; writes one JSON object per line:
//   {"ids": encode(text) without special tokens added, "prompt_ids": with them (the
//    post-processor's), "decoded": decode(ids) keeping special tokens}
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';

const require = createRequire(import.meta.url);
const { Tokenizer } = require('tokenizers');

const tokenizer = Tokenizer.fromFile(process.argv[2]);
const lines = readFileSync(0, 'utf-8').split('\n').filter((l) => l.length > 0);
const out = [];
for (const line of lines) {
  const text = JSON.parse(line);
  const plain = await tokenizer.encode(text, null, { addSpecialTokens: false });
  const prompt = await tokenizer.encode(text, null, { addSpecialTokens: true });
  const ids = plain.getIds();
  out.push(JSON.stringify({
    ids,
    prompt_ids: prompt.getIds(),
    decoded: await tokenizer.decode(ids, false),
  }));
}
process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
