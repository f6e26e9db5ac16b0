#pragma once
/// A bound on how deeply a config nests, checked on the bytes before a parser
/// sees them: toml11 parses arrays and inline tables by recursion, so a value
/// thousands of levels deep ([[[[...) overflowed the stack (SIGSEGV) of
/// actorflow-node and actorflow-train; nlohmann's JSON values are destroyed
/// and printed by recursion too. No config of actorflow nests more than a
/// few levels.

#include <cstddef>
#include <string>
#include <string_view>

namespace af {

/// The deepest nesting a config may have: arrays and inline tables (TOML),
/// arrays and objects (JSON), and the parts of a dotted TOML key (a.b.c is 3).
constexpr size_t max_config_nesting = 64;

/// Empty if `text` nests at most `max_depth` levels, else "line L: ..."
/// naming where it goes deeper. `toml`: the text is TOML (comments with #,
/// basic, literal and multi-line strings, dotted keys), else JSON. The scan
/// skips strings and comments; it does not check the syntax (the parser
/// does, once the text is known not to be too deep for it).
inline std::string nesting_problem(std::string_view text, bool toml,
                                   size_t max_depth = max_config_nesting) {
  size_t line = 1;
  size_t depth = 0;      // open [ and { outside strings and comments
  size_t key_dots = 0;   // TOML: dots of the key being read
  bool in_key = toml;    // TOML: before the '=' of a line (or of an inline table's entry)
  std::string opened;    // the brackets open, innermost last
  auto too_deep = [&](const char* what) {
    return "line " + std::to_string(line) + ": " + what + " nests more than "
           + std::to_string(max_depth) + " levels deep (the most a config may)";
  };
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\n') {
      ++line;
      if (toml && opened.empty()) {
        in_key = true;
        key_dots = 0;
      }
      continue;
    }
    if (toml && c == '#') { // a comment, to the end of the line
      while (i + 1 < text.size() && text[i + 1] != '\n')
        ++i;
      continue;
    }
    if (c == '"' || (toml && c == '\'')) {
      bool multi = toml && text.substr(i, 3) == std::string(3, c);
      bool escapes = c == '"';
      std::string_view close = multi ? text.substr(i, 3) : text.substr(i, 1);
      i += close.size();
      for (; i < text.size(); ++i) {
        if (text[i] == '\n') {
          if (!multi) { // a one-line string ends at its line (else the parser refuses it):
            --i;        // the outer loop counts the line and starts the next key
            break;
          }
          ++line;
        }
        if (escapes && text[i] == '\\') {
          if (i + 1 < text.size() && text[i + 1] == '\n')
            ++line;
          ++i;
          continue;
        }
        if (text.substr(i, close.size()) == close) {
          i += close.size() - 1;
          // A multi-line string may end in one or two quotes of its own
          // before its closing three (x = """q""""): they are its content,
          // not the start of another string.
          for (int more = 0; multi && more < 2 && i + 1 < text.size() && text[i + 1] == c; ++more)
            ++i;
          break;
        }
      }
      continue;
    }
    if (c == '[' || c == '{') {
      opened += c;
      if (++depth + key_dots > max_depth)
        return too_deep(c == '[' ? "an array" : toml ? "an inline table" : "an object");
      if (toml && c == '{') {
        in_key = true;
        key_dots = 0;
      } else if (toml && c == '[' && !in_key) {
        key_dots = 0;
      }
      continue;
    }
    if (c == ']' || c == '}') {
      if (depth > 0)
        --depth;
      if (!opened.empty())
        opened.pop_back();
      continue;
    }
    if (!toml)
      continue;
    if (c == '=' && in_key) {
      in_key = false;
      key_dots = 0;
    } else if (c == ',' && !opened.empty() && opened.back() == '{') {
      in_key = true;
      key_dots = 0;
    } else if (c == '.' && in_key) {
      if (++key_dots + depth > max_depth)
        return too_deep("a dotted key");
    }
  }
  return {};
}

} // namespace af
