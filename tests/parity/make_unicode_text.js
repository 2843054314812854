// Writes varied generated Unicode text (seeded, so every run writes the same): words of many
// scripts, digits of several numeral systems, combining marks, emoji, the unusual white space
// characters (U+0085, U+00A0, U+2028, U+3000, ...), words that mix scripts and classes, runs of
// spaces and newlines, apostrophe
// contractions and punctuation: the cases where pre-tokenizer regexes differ if any do.
// usage: node make_unicode_text.js OUTPUT BYTES
const fs = require("fs");
const [output, size] = [process.argv[2], Number(process.argv[3])];
let state = 12345;
const random = (n) => { state = (state * 1103515245 + 12345) % 2147483648; return Math.floor(state / 65536) % n; };
const ranges = [[0x41, 0x5a], [0x61, 0x7a], [0xc0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x530, 0x58f],
                [0x5d0, 0x5ea], [0x620, 0x64a], [0x900, 0x97f], [0xe00, 0xe5b], [0x10a0, 0x10ff], [0x3041, 0x3096],
                [0x30a1, 0x30fa], [0x4e00, 0x9fa5], [0xac00, 0xd7a3], [0x1f300, 0x1f64f], [0x300, 0x36f],
                [0x660, 0x669], [0x966, 0x96f], [0xff10, 0xff19], [0x2160, 0x2188], [0x2000, 0x206f],
                [0x20a0, 0x20bf], [0x2190, 0x22ff], [0x1d400, 0x1d7ff],
                // assigned in Unicode 15.0, after PCRE2's tables: emoji (So), CJK Extension H (Lo),
                // Kawi letters (Lo) and digits (Nd)
                [0x1fae0, 0x1fae8], [0x1faf0, 0x1faf8], [0x31350, 0x323af], [0x11f04, 0x11f10], [0x11f50, 0x11f59]];
const spaces = [" ", " ", " ", "  ", "\n", "\n\n", "\t", "\r\n", "\u0085", "\u00a0", "\u1680", "\u2003",
                "\u2028", "\u2029", "\u202f", "\u3000", "   \n", " \n ", "\u000b", "\u000c", "\ufeff"];
const extras = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "’s", "...", "!!", "?", "--", "\"", "(", ")",
                "123", "4567", "2024-01-01", "3.14159", "0x1F", "<|end|>", "</s>", "@user", "#tag", "http://x.y/z"];
const out = [];
let length = 0;
while (length < size) {
  let word = "";
  const kind = random(10);
  if (kind < 2) word = extras[random(extras.length)];
  else {
    // Most words keep to one range; some mix them, so that characters of different classes
    // meet inside a word, where the patterns' class boundaries decide the pieces.
    const mixed = kind === 2;
    let [low, high] = ranges[random(ranges.length)];
    const n = 1 + random(8);
    for (let i = 0; i < n; ++i) {
      if (mixed) [low, high] = ranges[random(ranges.length)];
      word += String.fromCodePoint(low + random(high - low + 1));
    }
  }
  const piece = word + spaces[random(spaces.length)];
  out.push(piece);
  length += Buffer.byteLength(piece, "utf8");
}
fs.writeFileSync(output, out.join(""));
