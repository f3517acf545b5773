// Fine-tuning data: conversations in JSONL, rendered by a model family's chat
// template, tokenized with a mask that keeps the loss on the assistant's
// tokens only, and packed into rows of the context length.
//
// Input. One JSON object per line (blank lines are skipped):
//   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
//   {"prompt": "...", "response": "..."}      ("completion" may stand for
//                                             "response"; an optional
//                                             "system" comes first)
// A line that is not one of these is an error naming file:line and the key;
// no line is skipped silently. Every example needs an assistant turn.
//
// Templates (the text each family's chat template renders for training, no
// default system prompt injected, no generation prompt appended):
//   llama3   <|begin_of_text|> then per message
//            <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>
//            with CONTENT trimmed of surrounding whitespace (Llama 3, 3.1,
//            3.2 Instruct).
//   chatml   per message <|im_start|>ROLE\nCONTENT<|im_end|>\n (Qwen2, Qwen2.5,
//            SmolLM2).
//   qwen3    chatml, and an assistant turn after the last user message
//            carries Qwen3's thinking block:
//            <think>\nREASONING\n</think>\n\nCONTENT, REASONING empty unless
//            the content holds "...</think>" (then split as Qwen3's template
//            does). Earlier assistant turns lose their reasoning.
//   mistral  <s>[INST] USER[/INST] ASSISTANT</s>[INST] USER[/INST] ...
//            (Mistral v0.3 spacing; roles must alternate user/assistant; a
//            system message is put before the first user message, followed
//            by "\n\n").
// The trained text of an assistant turn is its content and the marker that
// ends the turn (<|eot_id|>, <|im_end|>, </s>); for qwen3 the thinking block
// too; for mistral the space before the content too. Everything else (BOS,
// headers, system and user turns, the "\n" after <|im_end|>) is context.
//
// Tokens and mask. The conversation is tokenized as one text, the way the
// template's output would be; the boundary between two pieces of text is
// found by tokenizing the text up to it and taking the longest common prefix
// with the whole, so a token that straddles a boundary goes with the text
// after it (Tokenizer::SharedPrefixLengths; for a tokenizer.json, in time
// linear in the conversation, however many turns it has). Target t
// (predicting token t + 1) is trained when token t + 1 is.
//
// Packing. Examples are packed in file order into rows of seq_len + 1
// tokens without splitting any: an example that does not fit in the rest of
// a row starts the next row, and the rest is padding (the end-of-turn token
// as input, no target). An example longer than a row is cut to one row
// (counted as truncated) and dropped if no trained target is left; an
// example that tokenizes to no ids is dropped too. Tokens of one example
// attend to the earlier examples of its row, as in plain-text training;
// positions count from the row's start.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "zinf/status.h"

namespace zinf::data {

enum class ChatTemplate { kLlama3, kChatMl, kQwen3, kMistral };

std::string_view ChatTemplateName(ChatTemplate t);
// "llama3", "chatml", "qwen3", "mistral"; kInvalidArgument listing them.
Result<ChatTemplate> ParseChatTemplate(std::string_view name);
// The template whose markers `tokenizer` has as tokens: <|start_header_id|>
// → llama3; <|im_start|> → qwen3 with a <think> token, else chatml; [INST]
// or <s> and </s> → mistral. kInvalidArgument when none fits.
Result<ChatTemplate> DetectChatTemplate(const Tokenizer& tokenizer);
// kInvalidArgument naming the first of the template's markers that is not a
// single token of `tokenizer`.
Status CheckChatTemplate(ChatTemplate t, const Tokenizer& tokenizer);

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// One JSONL line. Errors name `where` (e.g. "data.jsonl:17") and the key.
Result<std::vector<ChatMessage>> ParseChatLine(std::string_view line, const std::string& where);

struct ChatPiece {
  std::string text;
  bool trained = false;
};
// The template's text as pieces, trained or not. kInvalidArgument for an
// order the template cannot express (mistral's alternation) or no
// assistant turn.
Result<std::vector<ChatPiece>> RenderChat(ChatTemplate t, std::span<const ChatMessage> messages);

struct TokenizedChat {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;  // per token, 1 when it is trained text
};
TokenizedChat TokenizeChat(const Tokenizer& tokenizer, std::span<const ChatPiece> pieces);

// Rows of seq_len + 1 tokens, packed as the file comment says.
class RowPacker {
 public:
  RowPacker(int64_t seq_len, int32_t pad_id) : row_len_(seq_len + 1), pad_id_(pad_id) {}
  void Add(const TokenizedChat& example);
  // Pads the open row, if any.
  void Finish();

  // inputs and targets, [rows, seq_len] each.
  std::vector<int32_t>& inputs() { return inputs_; }
  std::vector<int32_t>& targets() { return targets_; }
  int64_t rows() const { return rows_; }
  int64_t truncated() const { return truncated_; }
  int64_t dropped() const { return dropped_; }
  int64_t packed_tokens() const { return packed_tokens_; }

 private:
  void CloseRow();
  int64_t row_len_;
  int32_t pad_id_;
  std::vector<int32_t> row_ids_;
  std::vector<uint8_t> row_trained_;
  std::vector<int32_t> inputs_, targets_;
  int64_t rows_ = 0, truncated_ = 0, dropped_ = 0, packed_tokens_ = 0;
};

struct ChatDataStats {
  int64_t examples = 0;
  int64_t rows = 0;
  int64_t truncated = 0;  // cut to one row
  int64_t dropped = 0;    // no tokens, or nothing trained left after the cut
  int64_t tokens = 0;     // in rows, padding excluded
  int64_t trained_targets = 0;
};

// A JSONL file of conversations as packed rows, held in memory.
class ChatDataset {
 public:
  // kInvalidArgument for a bad line (file:line and key), a template marker
  // the tokenizer lacks, or a file without examples; I/O errors name the
  // path. `progress`, when set, is called with (bytes done, bytes total).
  static Result<std::unique_ptr<ChatDataset>> Open(const std::string& path, const Tokenizer& tokenizer,
                                                   ChatTemplate chat_template, int64_t seq_len,
                                                   const std::function<void(uint64_t, uint64_t)>& progress = {});
  // The same over the file's text (tests, fuzzing); errors name `path`.
  static Result<std::unique_ptr<ChatDataset>> FromText(std::string_view text, const std::string& path,
                                                       const Tokenizer& tokenizer, ChatTemplate chat_template,
                                                       int64_t seq_len,
                                                       const std::function<void(uint64_t, uint64_t)>& progress = {});

  // The last max(1, floor(rows · valid_fraction)) rows validate, the rest
  // train; kInvalidArgument when fewer than 2 rows or a bad fraction.
  Result<DataSplit> Split(double valid_fraction) const;
  const ChatDataStats& stats() const { return stats_; }
  int64_t seq_len() const { return seq_len_; }

 private:
  ChatDataset() = default;
  std::vector<int32_t> inputs_, targets_;
  int64_t seq_len_ = 0;
  ChatDataStats stats_;
};

// A JSONL path: ends in ".jsonl" (the flag's cue that the data is
// conversations, not text).
bool IsChatDataPath(std::string_view path);

}  // namespace zinf::data
