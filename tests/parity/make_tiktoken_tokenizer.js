// Builds a Hugging Face tokenizer.json from one of tiktoken's encodings (its ranks and pattern, as
// the npm package tiktoken ships them), in the shape of the files published for OpenAI's
// encodings: GPT-4o's (o200k_base) is a Split with the encoding's pattern, behavior "Removed" and
// invert true (keep the matches), then ByteLevel without regex. Merges are recovered from the
// ranks as the usual conversion does: a token's merge is the last step of byte-pair merging its
// bytes with only lower-ranked tokens, and merges are listed by the rank of what they make.
// usage: node make_tiktoken_tokenizer.js NODE_MODULES ENCODING OUTPUT.json
const fs = require("fs");
const path = require("path");
const [modules, encodingName, output] = process.argv.slice(2);
const packageDir = path.join(modules, "tiktoken");
const encoding = JSON.parse(fs.readFileSync(path.join(packageDir, "encoders", encodingName + ".json"), "utf8"));

// bpe_ranks: "! RANK" starts a run of base64 tokens with consecutive ranks.
const rankOf = new Map();  // token bytes as a latin1 string → rank
const items = encoding.bpe_ranks.split(/\s+/).filter((s) => s.length > 0);
for (let i = 0, rank = 0; i < items.length; ++i) {
  if (items[i] === "!") { rank = Number(items[++i]); continue; }
  rankOf.set(Buffer.from(items[i], "base64").toString("latin1"), rank++);
}

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for 256 + n.
const byteChar = [];
for (let b = 0, extra = 0; b < 256; ++b) {
  const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  byteChar[b] = String.fromCodePoint(printable ? b : 256 + extra++);
}
const byteLevel = (latin1) => Array.from(latin1, (c) => byteChar[c.charCodeAt(0)]).join("");

// The two parts a token is made of: byte-pair merging of its bytes, lowest rank first, with
// tokens ranked below it only.
function lastMerge(token, rank) {
  let parts = Array.from(token);
  for (;;) {
    let best = -1, bestRank = rank;
    for (let i = 0; i + 1 < parts.length; ++i) {
      const r = rankOf.get(parts[i] + parts[i + 1]);
      if (r !== undefined && r < bestRank) { best = i; bestRank = r; }
    }
    if (best < 0) break;
    parts.splice(best, 2, parts[best] + parts[best + 1]);
  }
  if (parts.length !== 2) throw new Error(`token of rank ${rank} is not the merge of two lower-ranked tokens`);
  return parts;
}

const vocab = {};
const merges = [];
for (const [token, rank] of [...rankOf.entries()].sort((a, b) => a[1] - b[1])) {
  vocab[byteLevel(token)] = rank;
  if (token.length > 1) merges.push(lastMerge(token, rank).map(byteLevel));
}
const addedTokens = Object.entries(encoding.special_tokens).map(([content, id]) => (
  { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));
const tokenizer = {
  version: "1.0",
  added_tokens: addedTokens,
  normalizer: null,
  pre_tokenizer: { type: "Sequence", pretokenizers: [
    { type: "Split", pattern: { Regex: encoding.pat_str }, behavior: "Removed", invert: true },
    { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
  post_processor: null,
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
           fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges },
};
fs.writeFileSync(output, JSON.stringify(tokenizer));
console.log(`${output}: ${rankOf.size} tokens, ${merges.length} merges, ${addedTokens.length} added tokens`);
