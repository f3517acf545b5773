#include "data/unicode_classes.h"

#include <algorithm>
#include <array>
#include <iterator>
#include <vector>

namespace zinf::data {
namespace {

struct CodePointRange {
  int32_t lo, hi;  // inclusive
};
struct CombiningClassRange {
  int32_t lo, hi;  // inclusive
  int32_t combining_class;
};
struct Decomposition {
  int32_t code_point, first, second;  // second == 0: a one-code-point decomposition
};
struct Composition {
  int32_t first, second, composite;
};

#include "data/unicode_tables.inc"

template <class R, size_t N>
const R* FindRange(const R (&ranges)[N], int32_t cp) {
  auto it = std::upper_bound(std::begin(ranges), std::end(ranges), cp, [](int32_t v, const R& r) { return v < r.lo; });
  if (it == std::begin(ranges)) return nullptr;
  --it;
  return cp <= it->hi ? &*it : nullptr;
}

constexpr uint8_t kClassNfcUnsafe = 8;

// One byte per BMP code point: the three class bits plus NFC-unsafe. Built
// once from the range tables; above U+FFFF the tables are searched directly.
const std::array<uint8_t, 0x10000>& BmpTable() {
  static const auto* table = [] {
    auto* t = new std::array<uint8_t, 0x10000>{};
    auto fill = [&](const auto& ranges, uint8_t bit) {
      for (const CodePointRange& r : ranges) {
        for (int32_t cp = r.lo; cp <= r.hi && cp < 0x10000; ++cp) (*t)[cp] |= bit;
      }
    };
    fill(kLetterRanges, kClassLetter);
    fill(kNumberRanges, kClassNumber);
    fill(kWhiteSpaceRanges, kClassSpace);
    fill(kNfcUnsafeRanges, kClassNfcUnsafe);
    return t;
  }();
  return *table;
}

// Hangul syllables compose and decompose algorithmically (Unicode 3.12).
constexpr int32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

int32_t CombiningClassOf(int32_t cp) {
  if (cp < 0x300) return 0;
  const CombiningClassRange* r = FindRange(kCombiningClass, cp);
  return r ? r->combining_class : 0;
}

void Decompose(int32_t cp, std::vector<int32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const int32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  auto it = std::lower_bound(std::begin(kDecomposition), std::end(kDecomposition), cp,
                             [](const Decomposition& d, int32_t v) { return d.code_point < v; });
  if (it == std::end(kDecomposition) || it->code_point != cp) {
    out->push_back(cp);
    return;
  }
  Decompose(it->first, out);
  if (it->second != 0) Decompose(it->second, out);
}

// The primary composite of (first, second), or -1.
int32_t Compose(int32_t first, int32_t second) {
  if (first < 0 || second < 0) return -1;
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase && second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 && second > kTBase &&
      second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  auto it = std::lower_bound(std::begin(kComposition), std::end(kComposition), std::pair{first, second},
                             [](const Composition& c, std::pair<int32_t, int32_t> v) {
                               return std::pair{c.first, c.second} < v;
                             });
  if (it == std::end(kComposition) || it->first != first || it->second != second) return -1;
  return it->composite;
}

}  // namespace

Utf8Char DecodeUtf8(std::string_view text, size_t pos) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t c0 = b(pos);
  if (c0 < 0x80) return {c0, 1};
  int len;
  int32_t cp;
  int32_t min_cp;
  if ((c0 & 0xE0) == 0xC0) {
    len = 2, cp = c0 & 0x1F, min_cp = 0x80;
  } else if ((c0 & 0xF0) == 0xE0) {
    len = 3, cp = c0 & 0x0F, min_cp = 0x800;
  } else if ((c0 & 0xF8) == 0xF0) {
    len = 4, cp = c0 & 0x07, min_cp = 0x10000;
  } else {
    return {};
  }
  if (pos + len > text.size()) return {};
  for (int i = 1; i < len; ++i) {
    const uint8_t c = b(pos + i);
    if ((c & 0xC0) != 0x80) return {};
    cp = (cp << 6) | (c & 0x3F);
  }
  if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {};
  return {cp, len};
}

void EncodeUtf8(int32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint8_t CodePointClass(int32_t cp) {
  if (cp < 0) return 0;
  if (cp < 0x10000) return BmpTable()[cp] & (kClassLetter | kClassNumber | kClassSpace);
  if (FindRange(kLetterRanges, cp)) return kClassLetter;
  if (FindRange(kNumberRanges, cp)) return kClassNumber;
  if (FindRange(kWhiteSpaceRanges, cp)) return kClassSpace;
  return 0;
}

bool IsWhiteSpace(int32_t cp) { return CodePointClass(cp) == kClassSpace; }
bool IsLetter(int32_t cp) { return CodePointClass(cp) == kClassLetter; }
bool IsNumber(int32_t cp) { return CodePointClass(cp) == kClassNumber; }

const char* UnicodeVersion() { return kUnicodeVersion; }

bool IsNfcQuickSafe(std::string_view text) {
  const auto& table = BmpTable();
  for (size_t pos = 0; pos < text.size();) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Utf8Char c = DecodeUtf8(text, pos);
    pos += c.length;
    if (c.code_point < 0) continue;
    const bool unsafe = c.code_point < 0x10000 ? (table[c.code_point] & kClassNfcUnsafe) != 0
                                               : FindRange(kNfcUnsafeRanges, c.code_point) != nullptr;
    if (unsafe) return false;
  }
  return true;
}

std::string NfcNormalize(std::string_view text) {
  // Decomposed code points; a byte that is not valid UTF-8 is kept as
  // -1 - byte, a starter that composes with nothing.
  std::vector<int32_t> cps;
  cps.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Char c = DecodeUtf8(text, pos);
    if (c.code_point < 0) {
      cps.push_back(-1 - static_cast<int32_t>(static_cast<uint8_t>(text[pos])));
    } else {
      Decompose(c.code_point, &cps);
    }
    pos += c.length;
  }
  std::vector<int32_t> cls(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) cls[i] = cps[i] < 0 ? 0 : CombiningClassOf(cps[i]);
  // Canonical ordering: a stable sort by class of each run of non-starters.
  for (size_t i = 1; i < cps.size(); ++i) {
    for (size_t j = i; j > 0 && cls[j] != 0 && cls[j - 1] > cls[j]; --j) {
      std::swap(cps[j], cps[j - 1]);
      std::swap(cls[j], cls[j - 1]);
    }
  }
  // Canonical composition: a character joins the last starter unless a
  // character between them has a class of 0 or >= its own (it is blocked).
  size_t out_n = 0;
  size_t starter = 0;
  bool have_starter = false;
  int32_t last_class = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const int32_t cp = cps[i], cc = cls[i];
    // Characters between the starter and this one are non-starters in
    // class order, so the last of them has the highest class.
    if (have_starter && (out_n == starter + 1 || last_class < cc)) {
      const int32_t composite = Compose(cps[starter], cp);
      if (composite >= 0) {
        cps[starter] = composite;
        continue;
      }
    }
    if (cc == 0) {
      starter = out_n;
      have_starter = true;
    }
    last_class = cc;
    cps[out_n] = cp;
    cls[out_n] = cc;
    ++out_n;
  }
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < out_n; ++i) {
    if (cps[i] < 0) {
      out.push_back(static_cast<char>(-1 - cps[i]));
    } else {
      EncodeUtf8(cps[i], &out);
    }
  }
  return out;
}

}  // namespace zinf::data
