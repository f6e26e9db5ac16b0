#pragma once
/// A check that text is UTF-8, for the TOML readers: TOML requires it, and
/// toml11 3.7.1 (Debian 12) reads past its buffer while it reports invalid
/// UTF-8 inside a literal string (found by fuzz/cluster_toml; the input is
/// fuzz/regressions/cluster_toml/). Checked before toml11 sees the text.

#include <cstddef>
#include <string>
#include <string_view>

namespace af {

/// Empty if `text` is well-formed UTF-8, else "line L, byte B: ..." naming
/// the first bad byte.
inline std::string utf8_problem(std::string_view text) {
  size_t line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < text.size();) {
    auto c = static_cast<unsigned char>(text[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len != 0 && i + len <= text.size();
    unsigned long cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; ok && k < len; ++k) {
      auto d = static_cast<unsigned char>(text[i + k]);
      ok = (d & 0xC0) == 0x80;
      cp = (cp << 6) | (d & 0x3F);
    }
    // no overlong forms, surrogates or code points past U+10FFFF
    if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)
               || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF))
      ok = false;
    if (!ok)
      return "line " + std::to_string(line) + ", byte " + std::to_string(i - line_start + 1)
             + ": not UTF-8 (byte 0x" + "0123456789abcdef"[c >> 4] + "0123456789abcdef"[c & 0xF]
             + "); save the file as UTF-8";
    if (c == '\n') {
      ++line;
      line_start = i + 1;
    }
    i += len;
  }
  return {};
}

} // namespace af
