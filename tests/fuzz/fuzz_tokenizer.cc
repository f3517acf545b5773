// A Hugging Face tokenizer.json (hf_tokenizer.cc, hf_bpe.cc,
// hf_pretokenize.cc): any text is a tokenizer or an InvalidArgument naming
// the file; a tokenizer then encodes a fixed text (every script, digits,
// whitespace runs, contractions, chat markers, bytes that are not UTF-8)
// into ids it knows, which decode without error; every id below 512 decodes
// alone, and an id it does not know is kOutOfRange.
#include <vector>

#include "data/hf_tokenizer.h"
#include "fuzz_util.h"

namespace {

constexpr std::string_view kText =
    "Hello, World! It's 2024: 1234567 tokens... don't STOP\n\n  indented\ttab\r\n"
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
    "<|im_start|>assistant\n<think>\n</think>\n\nok<|im_end|>\n<s>[INST] q [/INST] a</s>"
    " \xe2\x96\x81spaced  \xe2\x96\x81 caf\xc3\xa9 na\xc3\xafve \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 "
    "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xff\xfe\xc3 <0x41> <unk>   \n";

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zinf::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zinf;
  auto tok = data::HfTokenizer::FromJson(fuzz::AsText(data, size), "fuzz.json");
  if (!tok.ok()) {
    fuzz::CheckRejection(tok.status(), "fuzz.json");
    return 0;
  }
  const data::HfTokenizer& t = **tok;
  const int64_t vocab = t.VocabSize();
  const std::vector<int32_t> ids = t.Encode(kText);
  for (int32_t id : ids) ZINF_FUZZ_CHECK(id >= 0 && id < vocab, "encoded id " + std::to_string(id));
  auto text = t.Decode(ids);
  ZINF_FUZZ_CHECK(text.ok(), text.status().message());
  // The same text in chunks of one token gives the same ids.
  std::vector<int32_t> streamed;
  t.EncodeStream(kText, 1,
                 [&](std::span<const int32_t> chunk) { streamed.insert(streamed.end(), chunk.begin(), chunk.end()); });
  ZINF_FUZZ_CHECK(streamed == ids, "EncodeStream differs from Encode");
  std::vector<int32_t> each;
  for (int32_t id = 0; id < 512 && id < vocab; ++id) each.push_back(id);
  (void)t.Decode(each);
  for (int32_t id : {-1, static_cast<int32_t>(std::min<int64_t>(vocab, INT32_MAX))}) {
    if (id >= vocab || id < 0) {
      auto bad = t.Decode(std::vector<int32_t>{id});
      ZINF_FUZZ_CHECK(!bad.ok() && bad.status().code() == StatusCode::kOutOfRange, "unknown id decoded");
    }
  }
  for (std::string_view marker : {"<|im_start|>", "<s>", "</s>", "<unk>"}) {
    const int32_t id = t.TokenToId(marker);
    ZINF_FUZZ_CHECK(id >= -1 && id < vocab, "TokenToId out of range");
    (void)t.IsSpecial(id);
  }
  return 0;
}
