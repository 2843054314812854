// Encodes each input file (one document, followed by <|endoftext|>) with one of tiktoken's
// encodings, an implementation independent of dstrain (Rust compiled to WebAssembly), and
// compares the ids with TOKENS.bin (little-endian uint16 or uint32, as `h5dump -b LE` writes a
// corpus's /tokens). Files that are not valid UTF-8 are skipped by the caller's list (JavaScript
// strings cannot carry such bytes). Prints the first difference with its text, and exits 1 on any.
// usage: node compare_tiktoken.js NODE_MODULES ENCODING TOKENS.bin FILE...
const fs = require("fs");
const [modules, encodingName, tokensPath, ...files] = process.argv.slice(2);
const { get_encoding } = require(require.resolve("tiktoken", { paths: [modules] }));
const encoding = get_encoding(encodingName);
const eod = encoding.encode("<|endoftext|>", "all")[0];
const expectedIds = files.map((file) => {
  const ids = Array.from(encoding.encode_ordinary(fs.readFileSync(file, "utf8")));
  ids.push(eod);
  return ids;
});
const count = expectedIds.reduce((n, ids) => n + ids.length, 0);
const actual = fs.readFileSync(tokensPath);
const width = actual.length / count;  // the corpus stores uint16 ids for vocabularies up to 65536
if (width !== 2 && width !== 4) {
  console.error(`dstrain wrote ${actual.length} bytes of ids, tiktoken ${count} ids`);
  process.exit(1);
}
const actualIds = width === 2 ? new Uint16Array(actual.buffer, actual.byteOffset, count)
                              : new Uint32Array(actual.buffer.slice(actual.byteOffset, actual.byteOffset + actual.length));
let position = 0, bytes = 0;
for (const [f, file] of files.entries()) {
  bytes += fs.statSync(file).size;
  const expected = expectedIds[f];
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
console.log(`${encodingName} identical: ${position} tokens of ${files.length} documents, ${(bytes / 1e6).toFixed(2)} MB of text`);
