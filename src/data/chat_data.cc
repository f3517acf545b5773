#include "data/chat_data.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "data/file_util.h"

namespace zinf::data {
namespace {

using Json = nlohmann::json;

struct TemplateInfo {
  ChatTemplate t;
  std::string_view name;
  std::vector<std::string_view> markers;  // must be single tokens
  std::string_view end_of_turn;           // also the padding token
};

const std::vector<TemplateInfo>& Templates() {
  static const std::vector<TemplateInfo> kTemplates = {
      {ChatTemplate::kLlama3,
       "llama3",
       {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
       "<|eot_id|>"},
      {ChatTemplate::kChatMl, "chatml", {"<|im_start|>", "<|im_end|>"}, "<|im_end|>"},
      {ChatTemplate::kQwen3, "qwen3", {"<|im_start|>", "<|im_end|>"}, "<|im_end|>"},
      {ChatTemplate::kMistral, "mistral", {"<s>", "</s>"}, "</s>"},
  };
  return kTemplates;
}

const TemplateInfo& Info(ChatTemplate t) {
  for (const TemplateInfo& i : Templates()) {
    if (i.t == t) return i;
  }
  return Templates().front();
}

std::string_view Trim(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}
std::string_view StripNewlines(std::string_view s, bool left, bool right) {
  while (left && !s.empty() && s.front() == '\n') s.remove_prefix(1);
  while (right && !s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

// Qwen3's split of an assistant message into (reasoning, answer): what its
// template does with a message holding "</think>".
std::pair<std::string, std::string> SplitThinking(std::string_view content) {
  const size_t first_close = content.find("</think>");
  if (first_close == std::string_view::npos) return {"", std::string(content)};
  std::string_view reasoning = StripNewlines(content.substr(0, first_close), false, true);
  if (const size_t open = reasoning.rfind("<think>"); open != std::string_view::npos) {
    reasoning = reasoning.substr(open + 7);
  }
  const size_t last_close = content.rfind("</think>");
  return {std::string(StripNewlines(reasoning, true, false)),
          std::string(StripNewlines(content.substr(last_close + 8), true, false))};
}

}  // namespace

std::string_view ChatTemplateName(ChatTemplate t) { return Info(t).name; }

Result<ChatTemplate> ParseChatTemplate(std::string_view name) {
  for (const TemplateInfo& i : Templates()) {
    if (i.name == name) return i.t;
  }
  return InvalidArgument("unknown chat template '" + std::string(name) + "' (llama3, chatml, qwen3 or mistral)");
}

Result<ChatTemplate> DetectChatTemplate(const Tokenizer& tokenizer) {
  auto has = [&](std::string_view token) { return tokenizer.TokenId(token) >= 0; };
  if (has("<|start_header_id|>")) return ChatTemplate::kLlama3;
  if (has("<|im_start|>")) return has("<think>") ? ChatTemplate::kQwen3 : ChatTemplate::kChatMl;
  if (has("[INST]") || (has("<s>") && has("</s>"))) return ChatTemplate::kMistral;
  return InvalidArgument("the " + tokenizer.Name() +
                         " tokenizer has none of the chat templates' markers (<|start_header_id|>, <|im_start|>, "
                         "<s>): give a tokenizer.json with them, or --chat-template");
}

Status CheckChatTemplate(ChatTemplate t, const Tokenizer& tokenizer) {
  for (std::string_view m : Info(t).markers) {
    if (tokenizer.TokenId(m) < 0) {
      return InvalidArgument("chat template " + std::string(Info(t).name) + " needs the token " + std::string(m) +
                             ", which the " + tokenizer.Name() + " tokenizer does not have");
    }
  }
  return Status::Ok();
}

Result<std::vector<ChatMessage>> ParseChatLine(std::string_view line, const std::string& where) {
  Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(where + ": not a JSON object");
  if (!j.is_object()) return InvalidArgument(where + ": not a JSON object");
  auto text = [&](const Json& v, const std::string& key) -> Result<std::string> {
    if (!v.is_string()) return InvalidArgument(where + ": " + key + ": expected a string");
    return v.get<std::string>();
  };
  std::vector<ChatMessage> out;
  if (j.contains("messages")) {
    const Json& m = j["messages"];
    if (!m.is_array() || m.empty()) return InvalidArgument(where + ": messages: expected a non-empty array");
    for (size_t i = 0; i < m.size(); ++i) {
      const std::string key = "messages[" + std::to_string(i) + "]";
      if (!m[i].is_object() || !m[i].contains("role") || !m[i].contains("content")) {
        return InvalidArgument(where + ": " + key + ": expected {\"role\", \"content\"}");
      }
      ChatMessage msg;
      ZINF_ASSIGN_OR_RETURN(msg.role, text(m[i]["role"], key + ".role"));
      ZINF_ASSIGN_OR_RETURN(msg.content, text(m[i]["content"], key + ".content"));
      if (msg.role != "system" && msg.role != "user" && msg.role != "assistant") {
        return InvalidArgument(where + ": " + key + ".role: '" + msg.role + "' is not system, user or assistant");
      }
      out.push_back(std::move(msg));
    }
  } else if (j.contains("prompt")) {
    const char* answer = j.contains("response") ? "response" : "completion";
    if (!j.contains(answer)) return InvalidArgument(where + ": a \"prompt\" needs a \"response\"");
    if (j.contains("system")) {
      ZINF_ASSIGN_OR_RETURN(std::string s, text(j["system"], "system"));
      out.push_back({"system", std::move(s)});
    }
    ZINF_ASSIGN_OR_RETURN(std::string p, text(j["prompt"], "prompt"));
    ZINF_ASSIGN_OR_RETURN(std::string r, text(j[answer], answer));
    out.push_back({"user", std::move(p)});
    out.push_back({"assistant", std::move(r)});
  } else {
    return InvalidArgument(where + ": expected \"messages\", or \"prompt\" and \"response\"");
  }
  const bool any_assistant =
      std::any_of(out.begin(), out.end(), [](const ChatMessage& m) { return m.role == "assistant"; });
  if (!any_assistant) return InvalidArgument(where + ": no assistant message: nothing to train on");
  return out;
}

Result<std::vector<ChatPiece>> RenderChat(ChatTemplate t, std::span<const ChatMessage> messages) {
  std::vector<ChatPiece> pieces;
  auto context = [&](std::string s) {
    if (!pieces.empty() && !pieces.back().trained)
      pieces.back().text += s;
    else
      pieces.push_back({std::move(s), false});
  };
  auto trained = [&](std::string s) { pieces.push_back({std::move(s), true}); };
  switch (t) {
    case ChatTemplate::kLlama3:
      context("<|begin_of_text|>");
      for (const ChatMessage& m : messages) {
        context("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n");
        const std::string body = std::string(Trim(m.content)) + "<|eot_id|>";
        if (m.role == "assistant")
          trained(body);
        else
          context(body);
      }
      break;
    case ChatTemplate::kChatMl:
    case ChatTemplate::kQwen3: {
      size_t last_user = messages.size();
      for (size_t i = 0; i < messages.size(); ++i) {
        if (messages[i].role == "user") last_user = i;
      }
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        context("<|im_start|>" + m.role + "\n");
        if (m.role != "assistant") {
          context(m.content + "<|im_end|>\n");
          continue;
        }
        std::string body = m.content;
        if (t == ChatTemplate::kQwen3) {
          auto [reasoning, answer] = SplitThinking(m.content);
          const bool after_query = last_user < messages.size() && i > last_user;
          if (after_query && (i + 1 == messages.size() || !reasoning.empty())) {
            body = "<think>\n" + std::string(StripNewlines(reasoning, true, true)) + "\n</think>\n\n" +
                   std::string(StripNewlines(answer, true, false));
          } else {
            body = answer;
          }
        }
        trained(body + "<|im_end|>");
        context("\n");
      }
      break;
    }
    case ChatTemplate::kMistral: {
      size_t first = 0;
      std::string system;
      if (!messages.empty() && messages[0].role == "system") {
        system = messages[0].content + "\n\n";
        first = 1;
      }
      context("<s>");
      for (size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        const bool want_user = (i - first) % 2 == 0;
        if ((m.role == "user") != want_user || m.role == "system") {
          return InvalidArgument("messages[" + std::to_string(i) +
                                 "]: the mistral template needs user and assistant "
                                 "turns alternating, starting with user (after an optional system message)");
        }
        if (m.role == "user") {
          context("[INST] " + (i == first ? system : std::string()) + m.content + "[/INST]");
        } else {
          trained(" " + m.content + "</s>");
        }
      }
      break;
    }
  }
  return pieces;
}

TokenizedChat TokenizeChat(const Tokenizer& tokenizer, std::span<const ChatPiece> pieces) {
  std::string whole;
  std::vector<size_t> cuts;  // where each piece but the last ends
  for (const ChatPiece& p : pieces) {
    whole += p.text;
    cuts.push_back(whole.size());
  }
  if (!cuts.empty()) cuts.pop_back();
  TokenizedChat out;
  out.ids = tokenizer.Encode(whole);
  out.trained.assign(out.ids.size(), 0);
  const std::vector<size_t> shared = tokenizer.SharedPrefixLengths(whole, out.ids, cuts);
  size_t begin = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const size_t end = i < shared.size() ? std::clamp(shared[i], begin, out.ids.size()) : out.ids.size();
    std::fill(out.trained.begin() + begin, out.trained.begin() + end, pieces[i].trained ? 1 : 0);
    begin = end;
  }
  return out;
}

// ---- RowPacker -----------------------------------------------------------------

void RowPacker::CloseRow() {
  if (row_ids_.empty()) return;
  const int64_t T = row_len_ - 1;
  packed_tokens_ += static_cast<int64_t>(row_ids_.size());
  row_ids_.resize(row_len_, pad_id_);
  row_trained_.resize(row_len_, 0);
  for (int64_t t = 0; t < T; ++t) {
    inputs_.push_back(row_ids_[t]);
    targets_.push_back(row_trained_[t + 1] ? row_ids_[t + 1] : -1);
  }
  ++rows_;
  row_ids_.clear();
  row_trained_.clear();
}

void RowPacker::Add(const TokenizedChat& example) {
  const int64_t n = static_cast<int64_t>(example.ids.size());
  if (n == 0) {  // tokenized to nothing: no target to train
    ++dropped_;
    return;
  }
  int64_t take = n;
  if (n > row_len_) {
    take = row_len_;
    ++truncated_;
    // Target t is trained when token t + 1 is: token 0 never counts.
    if (std::find(example.trained.begin() + 1, example.trained.begin() + take, 1) == example.trained.begin() + take) {
      ++dropped_;
      return;
    }
  }
  if (static_cast<int64_t>(row_ids_.size()) + take > row_len_) CloseRow();
  row_ids_.insert(row_ids_.end(), example.ids.begin(), example.ids.begin() + take);
  row_trained_.insert(row_trained_.end(), example.trained.begin(), example.trained.begin() + take);
  // The first token of an example is never a target of the one before it.
  row_trained_[row_trained_.size() - take] = 0;
}

void RowPacker::Finish() { CloseRow(); }

// ---- ChatDataset ----------------------------------------------------------------

Result<std::unique_ptr<ChatDataset>> ChatDataset::Open(const std::string& path, const Tokenizer& tokenizer,
                                                       ChatTemplate chat_template, int64_t seq_len,
                                                       const std::function<void(uint64_t, uint64_t)>& progress) {
  if (seq_len < 1) return InvalidArgument("chat data: sequence length must be >= 1");
  ZINF_RETURN_IF_ERROR(CheckChatTemplate(chat_template, tokenizer).WithContext(path));
  auto file_or = MappedFile::Open(path);
  if (!file_or.ok()) return std::move(file_or).status().WithContext("--data");
  const MappedFile file = std::move(file_or).value();
  return FromText(std::string_view(file.chars(), file.size_bytes()), path, tokenizer, chat_template, seq_len, progress);
}

Result<std::unique_ptr<ChatDataset>> ChatDataset::FromText(std::string_view text, const std::string& path,
                                                           const Tokenizer& tokenizer, ChatTemplate chat_template,
                                                           int64_t seq_len,
                                                           const std::function<void(uint64_t, uint64_t)>& progress) {
  if (seq_len < 1) return InvalidArgument("chat data: sequence length must be >= 1");
  ZINF_RETURN_IF_ERROR(CheckChatTemplate(chat_template, tokenizer).WithContext(path));
  auto ds = std::unique_ptr<ChatDataset>(new ChatDataset());
  ds->seq_len_ = seq_len;
  RowPacker packer(seq_len, tokenizer.TokenId(Info(chat_template).end_of_turn));
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (Trim(line).empty()) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    ZINF_ASSIGN_OR_RETURN(std::vector<ChatMessage> messages, ParseChatLine(line, where));
    auto pieces = RenderChat(chat_template, messages);
    if (!pieces.ok()) return std::move(pieces).status().WithContext(where);
    packer.Add(TokenizeChat(tokenizer, *pieces));
    ++ds->stats_.examples;
    if (progress) progress(std::min<uint64_t>(pos, text.size()), text.size());
  }
  packer.Finish();
  if (ds->stats_.examples == 0) return InvalidArgument(path + ": no examples (one JSON object per line)");
  ds->stats_.rows = packer.rows();
  ds->stats_.truncated = packer.truncated();
  ds->stats_.dropped = packer.dropped();
  ds->stats_.tokens = packer.packed_tokens();
  ds->inputs_ = std::move(packer.inputs());
  ds->targets_ = std::move(packer.targets());
  ds->stats_.trained_targets =
      std::count_if(ds->targets_.begin(), ds->targets_.end(), [](int32_t t) { return t >= 0; });
  return ds;
}

Result<DataSplit> ChatDataset::Split(double valid_fraction) const {
  if (!(valid_fraction >= 0.0 && valid_fraction < 1.0)) {
    return InvalidArgument("validation fraction must be in [0, 1), got " + std::to_string(valid_fraction));
  }
  const int64_t rows = stats_.rows;
  if (rows < 2) {
    return InvalidArgument("the chat data packs into " + std::to_string(rows) + " row(s) of " +
                           std::to_string(seq_len_) + " tokens: need at least 2 (one to train, one to validate)");
  }
  const int64_t valid = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(rows) * valid_fraction));
  const size_t cut = static_cast<size_t>((rows - valid) * seq_len_);
  const std::span<const int32_t> in(inputs_), tg(targets_);
  return DataSplit{in.first(cut), in.subspan(cut), tg.first(cut), tg.subspan(cut)};
}

bool IsChatDataPath(std::string_view path) { return path.ends_with(".jsonl"); }

}  // namespace zinf::data
