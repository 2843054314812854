#include "dstrain/core/json_error.h"
#include "dstrain/core/json_field.h"
#include "dstrain/data/bpe_tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <optional>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/xxhash.h"
#include "dstrain/data/byte_level.h"
#include "dstrain/data/unicode_normalizer.h"

namespace dstrain {
namespace {

using nlohmann::json;

Error field_error(const std::string& where, const std::string& field, const std::string& expected) {
  return Error(ExitCode::kUsage, where + ": " + field + ": " + expected);
}

// A per-thread memo of piece → ids. Natural text repeats its words, so most pieces are found
// here and never reach the merge loop. Open addressing over one arena of keys and one of ids:
// a lookup allocates nothing. Bounded: emptied when half full.
class PieceCache {
 public:
  static constexpr size_t kSlots = 1 << 17;  // 4 MB of slots per thread
  uint64_t owner = 0;

  PieceCache() : slots_(kSlots) {}
  void clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    used_ = 0;
  }
  // The ids of `piece`, or nullptr; *slot receives where to insert it.
  const uint32_t* find(std::string_view piece, size_t hash, size_t* slot, uint32_t* count) const {
    for (size_t i = hash & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
      const Slot& s = slots_[i];
      if (s.key_length == 0) {
        *slot = i;
        return nullptr;
      }
      if (s.hash == hash && s.key_length == piece.size() &&
          std::memcmp(keys_.data() + s.key_offset, piece.data(), piece.size()) == 0) {
        *count = s.id_count;
        return ids_.data() + s.id_offset;
      }
    }
  }
  void insert(size_t slot, std::string_view piece, size_t hash, const uint32_t* ids, uint32_t count) {
    if (used_ >= kSlots / 2 || keys_.size() > (uint64_t{1} << 31)) return clear();  // keep it bounded
    slots_[slot] = Slot{hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(piece.size()),
                        static_cast<uint32_t>(ids_.size()), count};
    keys_.append(piece.data(), piece.size());
    ids_.insert(ids_.end(), ids, ids + count);
    ++used_;
  }

 private:
  struct Slot {
    size_t hash = 0;
    uint32_t key_offset = 0, key_length = 0, id_offset = 0, id_count = 0;
  };
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<uint32_t> ids_;
  size_t used_ = 0;
};

PieceCache& thread_cache(uint64_t owner) {
  thread_local PieceCache cache;
  if (cache.owner != owner) {
    cache.clear();
    cache.owner = owner;
  }
  return cache;
}

// One entry of pre_tokenizer (possibly a Sequence) → the splitters it stands for, in order.
// `after_byte_level`: whether a ByteLevel came before (the splitters run on the raw bytes).
template <typename Add>
void read_pre_tokenizer(const JsonField& node, const std::string& where, Add add, bool* after_byte_level) {
  if (node.is_null()) return;
  if (!node.has("type")) node.fail("an object with a \"type\"");
  const std::string type = node["type"].string();
  const std::string& field = node.path();
  if (type == "Sequence") {
    for (const JsonField& inner : node.member_or_null("pretokenizers").elements())
      read_pre_tokenizer(inner, where, add, after_byte_level);
  } else if (type == "ByteLevel") {
    *after_byte_level = true;
    if (node.member_or_null("add_prefix_space").boolean_or(false))
      throw field_error(where, field + ".add_prefix_space",
                        "true is not supported (it would make decode(encode(x)) differ from x); expected false");
    if (node.member_or_null("use_regex").boolean_or(true))
      add(std::make_unique<RegexSplitter>(kGpt2PatternFast, false, where + ": " + field), SplitKeeps::kMatchesAndGaps);
  } else if (type == "Split") {
    if (*after_byte_level)
      throw field_error(where, field, "a Split after ByteLevel is not supported (it would see byte-level characters); "
                                      "expected the Splits first, as DeepSeek's files have them");
    const JsonField pattern = node.member_or_null("pattern");
    const bool literal = pattern.has("String");
    if (!literal && !pattern.has("Regex")) pattern.fail("{\"Regex\": ...} or {\"String\": ...}");
    const std::string behavior = node.member_or_null("behavior").string_or("Isolated");
    if (behavior != "Isolated" && behavior != "Removed")
      throw field_error(where, field + ".behavior",
                        "'" + behavior + "' is not supported; expected Isolated or Removed");
    // `invert` swaps what counts as the delimiter: it changes nothing when both sides are kept.
    const bool invert = node.member_or_null("invert").boolean_or(false);
    const SplitKeeps keeps = behavior == "Isolated" ? SplitKeeps::kMatchesAndGaps
                             : invert               ? SplitKeeps::kMatches
                                                    : SplitKeeps::kGaps;
    add(std::make_unique<RegexSplitter>(pattern[literal ? "String" : "Regex"].string(), literal, where + ": " + field),
        keeps);
  } else {
    throw field_error(where, field + ".type",
                      "pre-tokenizer '" + type + "' is not supported; expected ByteLevel, Split or Sequence");
  }
}

// The special token a post-processor puts before every sequence: the first item of a
// TemplateProcessing's "single" template when that is a SpecialToken (also inside a Sequence of
// processors, as Llama 3's files have it); "" when there is none.
std::string leading_special_token(const JsonField& processor) {
  if (!processor.is_object()) return "";
  const std::string type = processor.member_or_null("type").string_or("");
  if (type == "Sequence") {
    for (const JsonField& inner : processor.member_or_null("processors").elements())
      if (std::string name = leading_special_token(inner); !name.empty()) return name;
    return "";
  }
  if (type != "TemplateProcessing") return "";
  const std::vector<JsonField> single = processor.member_or_null("single").elements();
  if (single.empty() || !single[0].has("SpecialToken")) return "";
  return single[0]["SpecialToken"]["id"].string();
}

json parse_json(const std::string& json_text, const std::string& where) {
  try {
    return json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(ExitCode::kUsage, where + ": not valid JSON " + describe_json_error(e));
  }
}

// The normalizer: none, or one Unicode normalization form (also as the only entry of a Sequence,
// as Qwen's files write NFC). Anything else would change text in ways not carried out here.
std::optional<UnicodeNormalizer> read_normalizer(const JsonField& node, const std::string& where) {
  std::vector<JsonField> list = {node};
  if (node.is_object() && node.member_or_null("type").string_or("") == "Sequence") {
    list = node.member_or_null("normalizers").elements();
    if (list.empty()) return std::nullopt;
  }
  if (list.size() == 1 && list[0].is_null()) return std::nullopt;
  if (list.size() == 1 && list[0].is_object())
    if (auto form = UnicodeNormalizer::form_named(list[0].member_or_null("type").string_or("")))
      return UnicodeNormalizer(*form);
  throw field_error(where, "normalizer",
                    "'" + node.value().dump() +
                        "' is not supported; expected null, NFC, NFD, NFKC or NFKD (alone or in a Sequence)");
}

void check_decoder(const JsonField& node, const std::string& where) {
  if (!node.is_null() && node.member_or_null("type").string_or("") != "ByteLevel")
    throw field_error(where, "decoder.type", "'" + node.member_or_null("type").string_or("?") + "': expected ByteLevel");
}

// The model's options that only plain byte-level BPE takes, each checked for that value.
void check_model_options(const JsonField& model, const std::string& where) {
  const std::string type = model.member_or_null("type").string_or("BPE");
  if (type != "BPE") throw field_error(where, "model.type", "'" + type + "' is not supported; expected BPE");
  const json& dropout = model.member_or_null("dropout").value();
  if (!dropout.is_null() && !(dropout.is_number() && dropout.get<double>() == 0.0))
    throw field_error(where, "model.dropout", "expected null (BPE dropout is for training tokenizers)");
  if (model.member_or_null("byte_fallback").boolean_or(false))
    throw field_error(where, "model.byte_fallback", "expected false (byte-level BPE)");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.member_or_null(affix).string_or("") != "")
      throw field_error(where, std::string("model.") + affix, "expected null");
}

using Vocabulary = std::unordered_map<std::string, uint32_t>;       // token → id
using AddedTokens = std::vector<std::pair<std::string, uint32_t>>;  // content, id

// Ids index tables: a negative, fractional or absurd one is an error, not a wrap-around.
uint32_t read_id(const json& id, const std::string& where, const std::string& field) {
  constexpr int64_t kMaxId = (int64_t{1} << 24) - 1;
  if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxId)
    throw field_error(where, field, "id " + id.dump() + " is not an integer from 0 to " + std::to_string(kMaxId));
  return static_cast<uint32_t>(id.get<int64_t>());
}

// model.vocab into `vocab`; returns its largest id.
uint32_t read_vocab(const JsonField& model, const std::string& where, Vocabulary* vocab) {
  uint32_t max_id = 0;
  std::unordered_map<uint32_t, std::string> token_of;  // two tokens of one id would decode alike
  const JsonField entries = model["vocab"];
  if (!entries.is_object()) entries.fail("an object of token: id");
  for (const auto& [token, id] : entries.members()) {
    const uint32_t value = read_id(id.value(), where, "model.vocab '" + token + "'");
    const auto [other, fresh] = token_of.emplace(value, token);
    if (!fresh)
      throw field_error(where, "model.vocab", "'" + other->second + "' and '" + token + "' both have id " +
                                                 std::to_string(value));
    (*vocab)[token] = value;
    max_id = std::max(max_id, value);
  }
  return max_id;
}

// The entries of added_tokens, in the file's order; each also into `content_ids`, its "normalized"
// flag into `normalized` (Hugging Face's default: not for special tokens), and *max_id raised to
// the largest id.
AddedTokens read_added_tokens(const JsonField& entries, const std::string& where, const Vocabulary& vocab,
                              Vocabulary* content_ids, std::vector<bool>* normalized, uint32_t* max_id) {
  AddedTokens tokens;
  for (const JsonField& entry : entries.elements()) {
    const std::string content = entry["content"].string();
    for (const char* flag : {"single_word", "lstrip", "rstrip"})
      if (entry.member_or_null(flag).boolean_or(false))
        throw field_error(where, "added_tokens '" + content + "'." + flag, "true is not supported; expected false");
    if (content.empty()) throw field_error(where, "added_tokens", "a token with empty content");
    // A token the vocabulary already has keeps its vocabulary id, as Hugging Face's loader gives it.
    const auto in_vocab = vocab.find(content);
    const uint32_t id = in_vocab != vocab.end() ? in_vocab->second
                                                : read_id(entry["id"].value(), where, "added_tokens '" + content + "'");
    tokens.emplace_back(content, id);
    // Hugging Face's default: special tokens are matched in the text as it comes.
    const bool special = entry.member_or_null("special").boolean_or(false);
    normalized->push_back(entry.member_or_null("normalized").boolean_or(!special));
    (*content_ids)[content] = id;
    *max_id = std::max(*max_id, id);
  }
  return tokens;
}

// The id of each byte's symbol, or `missing`. Every byte needs its symbol: that is what makes any
// input encodable. Bytes that valid UTF-8 never contains (C0, C1, F5-FF) may be missing, as in
// DeepSeek-LLM's vocabulary: such a byte of invalid input is read as U+FFFD, the replacement
// character.
std::array<uint32_t, 256> byte_symbol_ids(const Vocabulary& vocab, const std::string& where, uint32_t missing) {
  std::array<uint32_t, 256> ids{};
  const auto& chars = byte_level::byte_to_chars();
  for (int b = 0; b < 256; ++b) {
    auto found = vocab.find(chars[b]);
    const bool never_in_utf8 = b == 0xC0 || b == 0xC1 || b >= 0xF5;
    if (found == vocab.end() && !never_in_utf8)
      throw field_error(where, "model.vocab", "no entry for byte " + std::to_string(b) + " ('" + chars[b] +
                                                  "'): not a byte-level vocabulary");
    ids[b] = found == vocab.end() ? missing : found->second;
  }
  return ids;
}

// id → the bytes it decodes to.
std::vector<std::string> bytes_of_ids(const Vocabulary& vocab, const AddedTokens& added, uint32_t vocab_size) {
  std::vector<std::string> id_bytes(vocab_size, std::string());
  std::string bytes;
  for (const auto& [token, id] : vocab)
    // An entry outside the byte-level alphabet (a special token the trainer wrote into the
    // vocabulary) is never made by merges; it decodes as written.
    id_bytes[id] = byte_level::chars_to_bytes(token, &bytes) ? bytes : token;
  for (const auto& [content, id] : added) id_bytes[id] = content;
  return id_bytes;
}

// One entry of model.merges → its left and right token.
std::pair<std::string, std::string> merge_pair(const JsonField& merge, const std::string& where) {
  if (merge.is_string()) {  // "Ġ t" (older files)
    const std::string text = merge.string();
    size_t space = text.find(' ');
    if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
      throw field_error(where, merge.path(), "expected \"LEFT RIGHT\", got '" + text + "'");
    return {text.substr(0, space), text.substr(space + 1)};
  }
  // ["Ġ", "t"] (newer files)
  const std::vector<JsonField> pair = merge.value().is_array() ? merge.elements() : std::vector<JsonField>();
  if (pair.size() != 2) merge.fail("\"LEFT RIGHT\" or [\"LEFT\", \"RIGHT\"]");
  return {pair[0].string(), pair[1].string()};
}

// model.merges, each given to add(pair key (left id << 32 | right id), rank, merged id) in order.
template <typename Add>
void read_merges(const JsonField& merges, const Vocabulary& vocab, const std::string& where, Add add) {
  const std::vector<JsonField> entries = merges.elements();
  for (size_t rank = 0; rank < entries.size(); ++rank) {
    const auto [left, right] = merge_pair(entries[rank], where);
    auto l = vocab.find(left), r = vocab.find(right), m = vocab.find(left + right);
    if (l == vocab.end() || r == vocab.end() || m == vocab.end())
      throw field_error(where, "model.merges[" + std::to_string(rank) + "]",
                        "'" + left + " " + right + "' names a token missing from model.vocab");
    add((uint64_t{l->second} << 32) | r->second, static_cast<uint32_t>(rank), m->second);
  }
}

// The id of the special token `processor` puts before every sequence, if it names one.
std::optional<uint32_t> beginning_token_id(const BpeTokenizer& tokenizer, const JsonField& processor,
                                           const std::string& where) {
  const std::string bos = leading_special_token(processor);
  if (bos.empty()) return std::nullopt;
  if (tokenizer.token_id(bos) < 0)
    throw field_error(where, "post_processor", "its template starts with '" + bos + "', which is no token of the file");
  return static_cast<uint32_t>(tokenizer.token_id(bos));
}

// The id of `eod_token`, or with none named, of the first usual end-of-document token there is.
uint32_t end_of_document_id(const BpeTokenizer& tokenizer, const std::string& eod_token, const std::string& where) {
  if (eod_token.empty()) {
    int64_t found = -1;
    for (const char* candidate : {"<|endoftext|>", "<｜end▁of▁sentence｜>", "</s>", "<eos>"})
      if ((found = tokenizer.token_id(candidate)) >= 0) break;
    if (found < 0)
      throw config_error("--eod-token", "", where + " has none of <|endoftext|>, <｜end▁of▁sentence｜>, </s>, <eos>: "
                                                    "name its end-of-document token");
    return static_cast<uint32_t>(found);
  }
  if (tokenizer.token_id(eod_token) < 0)
    throw config_error("--eod-token", eod_token, "a token of " + where + " (an added token or a vocabulary entry)");
  return static_cast<uint32_t>(tokenizer.token_id(eod_token));
}

}  // namespace

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_file(const std::string& path, const std::string& eod_token) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw config_error("--tokenizer", path, "a tokenizer.json file that can be read, or byte");
  std::ostringstream text;
  text << file.rdbuf();
  return from_json(text.str(), path, eod_token);
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_json(const std::string& json_text, const std::string& where,
                                                      const std::string& eod_token) {
  const json document = parse_json(json_text, where);
  const JsonField root(document, where);
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  static std::atomic<uint64_t> instances{0};
  t->instance_ = ++instances;
  try {
    const JsonField model = root["model"];
    check_model_options(model, where);
    t->ignore_merges_ = model.member_or_null("ignore_merges").boolean_or(false);
    t->normalizer_ = read_normalizer(root.member_or_null("normalizer"), where);
    check_decoder(root.member_or_null("decoder"), where);

    uint32_t max_id = read_vocab(model, where, &t->vocab_);
    std::vector<bool> normalized;
    AddedTokens added = read_added_tokens(root.member_or_null("added_tokens"), where, t->vocab_, &t->added_,
                                          &normalized, &max_id);
    t->vocab_size_ = max_id + 1;
    t->byte_ids_ = byte_symbol_ids(t->vocab_, where, kNoSymbol);
    t->id_bytes_ = bytes_of_ids(t->vocab_, added, t->vocab_size_);
    read_merges(model["merges"], t->vocab_, where, [&](uint64_t pair, uint32_t rank, uint32_t merged) {
      // The last occurrence of a pair wins, as in Hugging Face's tokenizers (its merge map is
      // collected from the list in order).
      t->merges_[pair] = Merge{rank, merged};
    });

    bool after_byte_level = false;
    read_pre_tokenizer(root.member_or_null("pre_tokenizer"), where,
                       [&](std::unique_ptr<RegexSplitter> splitter, SplitKeeps keeps) {
                         t->pre_tokenizers_.push_back(PreTokenizer{std::move(splitter), keeps});
                       },
                       &after_byte_level);
    // Tokens marked "normalized" are found in the normalized text, their content normalized too
    // (Hugging Face's order); the others in the text as it comes.
    AddedTokens raw, in_normalized_text;
    for (size_t i = 0; i < added.size(); ++i) {
      if (!t->normalizer_ || !normalized[i]) {
        raw.push_back(added[i]);
        continue;
      }
      std::string storage;
      in_normalized_text.emplace_back(std::string(t->normalizer_->normalize(added[i].first, &storage)), added[i].second);
    }
    t->raw_added_ = AddedTokenIndex(std::move(raw));
    t->normalized_added_ = AddedTokenIndex(std::move(in_normalized_text));
  } catch (const json::exception& e) {
    throw Error(ExitCode::kUsage, where + ": not a tokenizer.json of the expected shape: " + describe_json_error(e));
  }

  t->bos_id_ = beginning_token_id(*t, root.member_or_null("post_processor"), where);
  t->eod_id_ = end_of_document_id(*t, eod_token, where);
  std::string file_name = where.substr(where.find_last_of('/') + 1);
  t->name_ = "bpe:" + file_name + ":" + hex64(xxh64(json_text.data(), json_text.size()));
  return t;
}

int64_t BpeTokenizer::token_id(const std::string& token) const {
  auto added = added_.find(token);
  if (added != added_.end()) return added->second;
  auto found = vocab_.find(token);
  return found == vocab_.end() ? int64_t{-1} : int64_t{found->second};
}

std::vector<uint32_t> BpeTokenizer::encode(const std::string& text) const {
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3);
  encode_into(text, &ids);
  return ids;
}

void BpeTokenizer::encode_into(std::string_view text, std::vector<uint32_t>* out) const {
  // Added tokens are cut out first; the text between them is encoded as usual.
  auto stretch = [&](std::string_view between) { encode_normalized(between, out); };
  if (raw_added_.empty()) return stretch(text);
  raw_added_.split(text, [out](uint32_t id) { out->push_back(id); }, stretch);
}

void BpeTokenizer::encode_normalized(std::string_view text, std::vector<uint32_t>* out) const {
  if (!normalizer_) return encode_ordinary(text, out);
  thread_local std::string storage;
  const std::string_view normal = normalizer_->normalize(text, &storage);
  if (normalized_added_.empty()) return encode_ordinary(normal, out);
  normalized_added_.split(normal, [out](uint32_t id) { out->push_back(id); },
                          [&](std::string_view between) { encode_ordinary(between, out); });
}

void BpeTokenizer::encode_ordinary(std::string_view text, std::vector<uint32_t>* out) const {
  // Each pre-tokenizer splits every piece of the previous one.
  thread_local std::vector<std::string_view> current, next;
  current.assign(1, text);
  for (const PreTokenizer& pre : pre_tokenizers_) {
    if (!pre.splitter) continue;
    next.clear();
    for (std::string_view piece : current) pre.splitter->split(piece, &next, pre.keeps);
    std::swap(current, next);
  }
  for (std::string_view piece : current) encode_piece(piece, out);
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<uint32_t>* out) const {
  if (piece.empty()) return;
  if (piece.size() == 1 && byte_ids_[static_cast<unsigned char>(piece[0])] != kNoSymbol) {
    out->push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);  // its own symbol: no lookup needed
    return;
  }
  PieceCache& cache = thread_cache(instance_);
  const size_t hash = std::hash<std::string_view>()(piece);
  size_t slot = 0;
  uint32_t count = 0;
  if (const uint32_t* ids = cache.find(piece, hash, &slot, &count)) {
    out->insert(out->end(), ids, ids + count);
    return;
  }
  std::vector<uint32_t> symbols;
  if (ignore_merges_) {  // Llama-3 style: a piece that is a whole token is taken as is
    std::string chars;
    for (unsigned char b : piece) chars += byte_level::byte_to_chars()[b];
    auto whole = vocab_.find(chars);
    if (whole != vocab_.end()) symbols.push_back(whole->second);
  }
  if (symbols.empty()) {
    symbols.reserve(piece.size());
    for (unsigned char b : piece) {
      if (byte_ids_[b] != kNoSymbol) symbols.push_back(byte_ids_[b]);
      else
        for (unsigned char r : std::string(kReplacementCharacter)) symbols.push_back(byte_ids_[r]);
    }
    merge_symbols(&symbols);
  }
  out->insert(out->end(), symbols.begin(), symbols.end());
  if (piece.size() <= 256) cache.insert(slot, piece, hash, symbols.data(), static_cast<uint32_t>(symbols.size()));
}

// Applies merges lowest rank first and, among equal ranks, leftmost first (Hugging Face's
// order): a linked list of symbols and a heap of candidate pairs, O(n log n) even for the long
// pieces that runs of punctuation or digits make.
void BpeTokenizer::merge_symbols(std::vector<uint32_t>* symbols) const {
  std::vector<uint32_t>& id = *symbols;
  const int n = static_cast<int>(id.size());
  if (n < 2) return;
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    uint32_t rank;
    int position;
    uint32_t left, right;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : position > other.position;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    auto found = merges_.find((uint64_t{id[i]} << 32) | id[next[i]]);
    if (found != merges_.end()) heap.push(Candidate{found->second.rank, i, id[i], id[next[i]]});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    int i = c.position, j = alive[i] ? next[i] : -1;
    if (!alive[i] || j < 0 || id[i] != c.left || id[j] != c.right) continue;  // stale
    id[i] = merges_.at((uint64_t{c.left} << 32) | c.right).merged;
    alive[j] = false;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    consider(prev[i]);
    consider(i);
  }
  std::vector<uint32_t> merged;
  for (int i = 0; i >= 0; i = next[i]) merged.push_back(id[i]);
  id.swap(merged);
}

std::string BpeTokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string text;
  for (uint32_t id : ids)
    if (id < id_bytes_.size()) text += id_bytes_[id];
  return text;
}

}  // namespace dstrain
