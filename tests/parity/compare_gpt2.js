// Encodes each input file (one document, followed by <|endoftext|>) with tiktoken's GPT-2
// encoding, an implementation independent of dstrain (Rust compiled to WebAssembly), and
// compares the ids with TOKENS.bin (little-endian uint16, as `h5dump -b LE` writes a corpus's
// /tokens). Files that are not valid UTF-8 are skipped by the caller's list (JavaScript strings
// cannot carry such bytes). Prints the first difference with its text, and exits 1 on any.
// usage: node compare_gpt2.js NODE_MODULES TOKENS.bin FILE...
const fs = require("fs");
const [modules, tokensPath, ...files] = process.argv.slice(2);
const { get_encoding } = require(require.resolve("tiktoken", { paths: [modules] }));
const encoding = get_encoding("gpt2");
const eod = 50256;
const actual = fs.readFileSync(tokensPath);
const actualIds = new Uint16Array(actual.buffer, actual.byteOffset, actual.length / 2);
let position = 0, bytes = 0;
for (const file of files) {
  const text = fs.readFileSync(file, "utf8");
  bytes += Buffer.byteLength(text, "utf8");
  const expected = Array.from(encoding.encode_ordinary(text));
  expected.push(eod);
  for (let i = 0; i < expected.length; ++i, ++position) {
    if (position >= actualIds.length || actualIds[position] !== expected[i]) {
      const context = expected.slice(Math.max(0, i - 8), i + 8);
      console.error(`${file}: token ${i} (corpus position ${position}): dstrain ${actualIds[position]}, ` +
                    `tiktoken ${expected[i]}; text around it: ${JSON.stringify(Buffer.from(encoding.decode(new Uint32Array(context))).toString())}`);
      process.exit(1);
    }
  }
}
if (position !== actualIds.length) {
  console.error(`dstrain wrote ${actualIds.length} tokens, tiktoken ${position}`);
  process.exit(1);
}
console.log(`identical: ${position} tokens of ${files.length} documents, ${(bytes / 1e6).toFixed(2)} MB of text`);
