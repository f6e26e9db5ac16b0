#include "repl/parser.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace af::repl {

const std::vector<command_info>& commands() {
  static const std::vector<command_info> table{
    {"help", false, "help [COMMAND]", "lists the commands, or says what one does"},
    {"cluster", false, "cluster", "the cluster's jobs, tasks and addresses, and this session's task"},
    {"devices", false, "devices", "asks every task for its devices (a task that is down says why)"},
    {"ping", false, "ping DEVICE", "asks one task (/job:ps/task:0) who it is and what it has"},
    {"session", false, "session [DEVICE]",
     "shows, or switches to, the session of a task (/job:worker/task:1); each has its own "
     "graph and names, as each TF client process does"},
    {"run", true, "run EXPR {, EXPR} [feed NAME=EXPR {, NAME=EXPR}]",
     "runs the graph for the values (sess.run); placeholders take their value after feed; "
     "the location trace is kept for `trace`"},
    {"print", true, "print EXPR {, EXPR}",
     "shows values without running anything: text, constants, what a name holds"},
    {"trace", false, "trace [detail | save FILE]",
     "where each op and variable of the last run ran, by device; `detail`: each op's "
     "requested and actual device, node and why soft placement moved it; `save` writes "
     "Chrome trace-event JSON (Perfetto, chrome://tracing)"},
    {"vars", false, "vars [DEVICE]",
     "the variables a task holds (every task if none named): name, shape, dtype, "
     "initialized, version, bytes"},
    {"ops", false, "ops", "the operations of this session's graph (graph.get_operations())"},
    {"names", false, "names", "the names bound in this session and what each holds"},
    {"init", false, "init [NAME...]",
     "runs the initializers of this session's variables, or of the named ones "
     "(global_variables_initializer)"},
    {"uninit", false, "uninit [NAME...]",
     "the variables without a value yet (report_uninitialized_variables)"},
    {"wait", false, "wait [DURATION] [NAME...]",
     "waits until the variables have values (default 10s); when it gives up it names "
     "those still missing"},
    {"sleep", false, "sleep DURATION", "pauses (500ms, 2s); Ctrl-C ends it"},
    {"save", false, "save DIR", "writes this session's variables to a checkpoint in DIR"},
    {"restore", false, "restore DIR",
     "sets this session's variables from DIR's latest checkpoint, by name"},
    {"train", false,
     "train start FILE [KEY=VALUE...] | status | mode MODE | wait [DURATION] | stop",
     "a training job on this cluster's ps and worker tasks, in the background; `mode` "
     "switches a running job live (sync, async, ssp, average); `stop` ends it before its "
     "next step"},
    {"reset", false, "reset",
     "a fresh graph and no names for this session (tf.reset_default_graph); the variables on "
     "the cluster stay"},
    {"shutdown", false, "shutdown DEVICE", "asks a task to stop"},
    {"quit", false, "quit", "closes the session and leaves (Ctrl-D too)"},
  };
  return table;
}

const command_info* find_command(const std::string& name) {
  for (const auto& c : commands())
    if (name == c.name)
      return &c;
  if (name == "exit")
    return find_command("quit");
  return nullptr;
}

namespace {

struct fail {
  parse_error e;
};

class parser {
public:
  parser(const std::string& text, size_t first_line) : s_(text), first_line_(first_line) {
    line_starts_.push_back(0);
    for (size_t k = 0; k < s_.size(); ++k)
      if (s_[k] == '\n')
        line_starts_.push_back(k + 1);
  }

  std::vector<stmt> program(bool in_block) {
    std::vector<stmt> out;
    for (;;) {
      skip_space(true);
      if (eof()) {
        if (in_block)
          error("the block is not closed: a '}' is missing", true);
        return out;
      }
      if (peek() == '}') {
        if (!in_block)
          error("'}' without a block to close");
        return out;
      }
      if (peek() == ';') {
        ++i_;
        continue;
      }
      out.push_back(statement());
      skip_space(false);
      if (eof() || peek() == '\n' || peek() == ';' || peek() == '}')
        continue;
      error("unexpected " + found() + " after the statement: put ';' or a new "
            "line between statements");
    }
  }

private:
  // -- characters ------------------------------------------------------------

  bool eof() const { return i_ >= s_.size(); }
  char peek(size_t ahead = 0) const { return i_ + ahead < s_.size() ? s_[i_ + ahead] : '\0'; }

  position pos_of(size_t at) const {
    at = std::min(at, s_.size());
    auto line = std::upper_bound(line_starts_.begin(), line_starts_.end(), at) - line_starts_.begin();
    position p;
    p.line = static_cast<size_t>(line) + first_line_ - 1;
    p.column = at - line_starts_[static_cast<size_t>(line) - 1] + 1;
    return p;
  }

  [[noreturn]] void error_at(size_t at, std::string message, bool incomplete = false) {
    throw fail{parse_error{pos_of(at), std::move(message), incomplete}};
  }
  [[noreturn]] void error(std::string message, bool incomplete = false) {
    error_at(i_, std::move(message), incomplete);
  }

  /// Skips blanks and comments ('#' to the end of the line); newlines too
  /// when `newlines` (between statements, inside brackets).
  void skip_space(bool newlines) {
    while (!eof()) {
      char c = peek();
      if (c == '#') {
        while (!eof() && peek() != '\n')
          ++i_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++i_;
      } else {
        return;
      }
    }
  }

  static bool name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
  static bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

  /// A NAME at i_, or "" (i_ unchanged).
  std::string read_name() {
    if (!name_start(peek()))
      return {};
    size_t b = i_;
    while (name_char(peek()))
      ++i_;
    return s_.substr(b, i_ - b);
  }

  std::string peek_name() const {
    size_t k = i_;
    if (k >= s_.size() || !name_start(s_[k]))
      return {};
    while (k < s_.size() && name_char(s_[k]))
      ++k;
    return s_.substr(i_, k - i_);
  }

  /// True if, after the name at i_, the statement is `NAME {, NAME} =`.
  bool looks_like_assignment() const {
    size_t k = i_;
    for (;;) {
      if (k >= s_.size() || !name_start(s_[k]))
        return false;
      while (k < s_.size() && name_char(s_[k]))
        ++k;
      while (k < s_.size() && (s_[k] == ' ' || s_[k] == '\t'))
        ++k;
      if (k < s_.size() && s_[k] == '=')
        return k + 1 >= s_.size() || s_[k + 1] != '=';
      if (k >= s_.size() || s_[k] != ',')
        return false;
      ++k;
      while (k < s_.size() && (s_[k] == ' ' || s_[k] == '\t'))
        ++k;
    }
  }

  void expect(char c, const char* what) {
    skip_space(depth_ > 0);
    if (peek() != c) {
      if (eof())
        error(std::string{"the input ended where "} + what + " was expected", true);
      error(std::string{"expected "} + what + ", found " + found());
    }
    ++i_;
  }

  std::string found() const {
    if (eof())
      return "the end of the input";
    if (peek() == '\n')
      return "the end of the line";
    auto c = static_cast<unsigned char>(peek());
    if (c < 0x20 || c >= 0x7f) { // a control byte or part of a UTF-8 character: by its code
      char code[8];
      std::snprintf(code, sizeof code, "\\x%02x", c);
      return std::string{"the byte "} + code;
    }
    return std::string{"'"} + peek() + "'";
  }

  // -- statements ------------------------------------------------------------

  stmt statement() {
    stmt st;
    size_t begin = i_;
    st.at = pos_of(i_);
    std::string head = peek_name();
    if (head == "with" || head == "repeat") {
      i_ += head.size();
      skip_space(false);
      if (head == "with") {
        st.what = stmt::kind::with;
        st.device = read_word(true);
        if (st.device.text.empty())
          error("with: a device is missing (with /job:ps/task:0 { ... })", eof());
      } else {
        st.what = stmt::kind::repeat;
        word n = read_word(true);
        char* end = nullptr;
        long long count = std::strtoll(n.text.c_str(), &end, 10);
        if (n.text.empty() || *end != '\0' || count < 0 || count > 1000000)
          error_at(begin + head.size() + 1,
                   "repeat: the count must be a whole number from 0 to 1000000, found '" + n.text
                     + "'");
        st.count = count;
      }
      skip_space(true); // the '{' may start the next line
      if (peek() != '{')
        error(head + ": a '{' must follow, found " + found(), eof());
      if (++blocks_ > 64)
        error(head + ": blocks nest too deeply (more than 64 levels)");
      ++i_;
      st.body = program(true);
      ++i_; // the '}'
      --blocks_;
    } else if (!head.empty() && find_command(head) != nullptr && !looks_like_assignment()) {
      st.what = stmt::kind::command;
      st.command = find_command(head)->name;
      st.command_at = st.at;
      i_ += head.size();
      if (find_command(head)->takes_exprs)
        command_exprs(st);
      else
        command_words(st);
    } else if (!head.empty() && looks_like_assignment()) {
      st.what = stmt::kind::assign;
      for (;;) {
        size_t at = i_;
        std::string n = read_name();
        if (find_command(n) != nullptr || n == "with" || n == "repeat" || n == "feed"
            || n == "true" || n == "false")
          error_at(at, "'" + n + "' is a command or keyword: it cannot be a name");
        st.targets.push_back(n);
        skip_space(false);
        if (peek() == '=')
          break;
        ++i_; // ','
        skip_space(false);
      }
      ++i_; // '='
      st.value = expression();
    } else {
      st.what = stmt::kind::expr;
      st.value = expression();
    }
    st.source = s_.substr(begin, i_ - begin);
    while (!st.source.empty() && (st.source.back() == ' ' || st.source.back() == '\t'))
      st.source.pop_back();
    return st;
  }

  /// A word: up to a blank, ';', '}' or the end of the line; a quoted string
  /// is one word. `stop_at_brace`: '{' ends it too (with DEVICE {).
  word read_word(bool stop_at_brace) {
    skip_space(false);
    word w;
    w.at = pos_of(i_);
    if (peek() == '"' || peek() == '\'') {
      w.text = string_literal();
      return w;
    }
    size_t b = i_;
    while (!eof()) {
      char c = peek();
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ';' || c == '}' || c == '#'
          || (stop_at_brace && c == '{'))
        break;
      ++i_;
    }
    w.text = s_.substr(b, i_ - b);
    return w;
  }

  void command_words(stmt& st) {
    for (;;) {
      skip_space(false);
      if (eof() || peek() == '\n' || peek() == ';' || peek() == '}')
        return;
      st.words.push_back(read_word(false));
    }
  }

  bool at_statement_end() {
    skip_space(false);
    return eof() || peek() == '\n' || peek() == ';' || peek() == '}';
  }

  void command_exprs(stmt& st) {
    if (at_statement_end())
      error(st.command + ": give at least one expression (" + find_command(st.command)->usage
            + ")");
    for (;;) {
      st.exprs.push_back(expression());
      if (at_statement_end())
        return;
      if (peek_name() == "feed" && st.command == "run")
        break;
      if (peek() != ',')
        error("expected ',' or the end of the statement, found " + found());
      ++i_;
    }
    i_ += 4; // "feed"
    if (at_statement_end())
      error("feed: give NAME=VALUE for each placeholder (run y feed x=[[1,2]])");
    for (;;) {
      skip_space(false);
      word w;
      w.at = pos_of(i_);
      w.text = read_name();
      if (w.text.empty())
        error("feed: expected a placeholder's name, found " + found());
      skip_space(false);
      if (peek() != '=')
        error("feed: expected '=' after '" + w.text + "', found " + found());
      ++i_;
      st.feeds.emplace_back(w, expression());
      if (at_statement_end())
        return;
      if (peek() != ',')
        error("feed: expected ',' or the end of the statement, found " + found());
      ++i_;
    }
  }

  // -- expressions -----------------------------------------------------------

  std::shared_ptr<expr> node(expr::kind k, size_t begin) {
    auto e = std::make_shared<expr>();
    e->what = k;
    e->at = pos_of(begin);
    return e;
  }

  void finish(const std::shared_ptr<expr>& e, size_t begin) {
    e->source = s_.substr(begin, i_ - begin);
    // The interpreter walks the tree recursively: a chain of 7,000 '+' is
    // as deep as 7,000 parentheses, and is refused the same way.
    for (const auto& item : e->items)
      e->depth = std::max(e->depth, item->depth + 1);
    for (const auto& a : e->args)
      e->depth = std::max(e->depth, a.value->depth + 1);
    if (e->depth > 500)
      error_at(begin, "the expression nests too deeply (more than 500 operations in one chain): "
                      "split it into several statements");
  }

  expr_ptr expression() {
    if (++nesting_ > 200)
      error("the expression nests too deeply (more than 200 levels)");
    skip_space(depth_ > 0);
    size_t begin = i_;
    auto lhs = term();
    for (;;) {
      skip_space(depth_ > 0);
      char c = peek();
      if (c != '+' && c != '-')
        break;
      ++i_;
      auto e = node(expr::kind::binary, begin);
      e->text = std::string(1, c);
      e->items = {lhs, term()};
      finish(e, begin);
      lhs = e;
    }
    --nesting_;
    return lhs;
  }

  expr_ptr term() {
    skip_space(depth_ > 0);
    size_t begin = i_;
    auto lhs = unary();
    for (;;) {
      skip_space(depth_ > 0);
      char c = peek();
      if (c != '*' && c != '/' && c != '@')
        break;
      ++i_;
      auto e = node(expr::kind::binary, begin);
      e->text = std::string(1, c);
      e->items = {lhs, unary()};
      finish(e, begin);
      lhs = e;
    }
    return lhs;
  }

  expr_ptr unary() {
    skip_space(depth_ > 0);
    size_t begin = i_;
    if (peek() == '-') {
      ++i_;
      if (++nesting_ > 200)
        error("the expression nests too deeply (more than 200 levels)");
      auto operand = unary();
      --nesting_;
      // -3 is a number, so that [[-1, 2]] stays a literal tensor.
      if (operand->what == expr::kind::number) {
        auto e = std::make_shared<expr>(*operand);
        e->number = -e->number;
        e->negative = !e->negative && e->magnitude != 0;
        e->at = pos_of(begin);
        finish(e, begin);
        return e;
      }
      auto e = node(expr::kind::negate, begin);
      e->items = {operand};
      finish(e, begin);
      return e;
    }
    return postfix();
  }

  expr_ptr postfix() {
    size_t begin = i_;
    auto e = primary();
    for (;;) {
      if (peek() != '.')
        return e;
      ++i_;
      size_t at = i_;
      auto m = node(expr::kind::method, begin);
      m->text = read_name();
      if (m->text.empty())
        error_at(at, "expected a method name after '.', found " + found());
      if (peek() != '(')
        error("expected '(' after ." + m->text + " (a method call: x." + m->text + "(...))");
      ++i_;
      m->items = {e};
      m->args = arguments();
      finish(m, begin);
      e = m;
    }
  }

  std::vector<call_arg> arguments() {
    // after '(': args ')'
    std::vector<call_arg> out;
    ++depth_;
    skip_space(true);
    if (peek() == ')') {
      ++i_;
      --depth_;
      return out;
    }
    for (;;) {
      skip_space(true);
      call_arg a;
      if (!peek_name().empty()) {
        size_t save = i_;
        std::string n = read_name();
        skip_space(true);
        if (peek() == '=' && peek(1) != '=') {
          ++i_;
          a.keyword = n;
        } else {
          i_ = save;
        }
      }
      a.value = expression();
      out.push_back(std::move(a));
      skip_space(true);
      if (peek() == ')') {
        ++i_;
        --depth_;
        return out;
      }
      if (peek() != ',') {
        if (eof())
          error("the input ended inside a call: a ')' is missing", true);
        error("expected ',' or ')' in the call, found " + found());
      }
      ++i_;
    }
  }

  expr_ptr primary() {
    skip_space(depth_ > 0);
    size_t begin = i_;
    char c = peek();
    if (eof() || c == '\n')
      error("expected a value, found " + found(), eof() && depth_ > 0);
    if (std::isdigit(static_cast<unsigned char>(c)) || (c == '.' && std::isdigit(static_cast<unsigned char>(peek(1)))))
      return number();
    if (c == '"' || c == '\'') {
      auto e = node(expr::kind::string, begin);
      e->text = string_literal();
      finish(e, begin);
      return e;
    }
    if (c == '[') {
      ++i_;
      ++depth_;
      auto e = node(expr::kind::list, begin);
      skip_space(true);
      if (peek() != ']') {
        for (;;) {
          e->items.push_back(expression());
          skip_space(true);
          if (peek() == ']')
            break;
          if (peek() != ',') {
            if (eof())
              error("the input ended inside a list: a ']' is missing", true);
            error("expected ',' or ']' in the list, found " + found());
          }
          ++i_;
          skip_space(true);
          if (peek() == ']') // a trailing comma, as Python allows
            break;
        }
      }
      ++i_;
      --depth_;
      finish(e, begin);
      return e;
    }
    if (c == '(') {
      ++i_;
      ++depth_;
      auto inner = expression();
      skip_space(true);
      if (peek() != ')') {
        if (eof())
          error("the input ended inside parentheses: a ')' is missing", true);
        error("expected ')', found " + found());
      }
      ++i_;
      --depth_;
      return inner;
    }
    if (name_start(c)) {
      std::string n = read_name();
      if (n == "true" || n == "false") {
        auto e = node(expr::kind::boolean, begin);
        e->number = n == "true" ? 1 : 0;
        e->text = n;
        finish(e, begin);
        return e;
      }
      if (peek() == '(') {
        ++i_;
        auto e = node(expr::kind::call, begin);
        e->text = n;
        e->args = arguments();
        finish(e, begin);
        return e;
      }
      auto e = node(expr::kind::name, begin);
      e->text = n;
      finish(e, begin);
      return e;
    }
    error("expected a value (a number, \"text\", a name, a call or a [list]), found " + found());
  }

  expr_ptr number() {
    size_t begin = i_;
    bool integral = true;
    while (std::isdigit(static_cast<unsigned char>(peek())))
      ++i_;
    if (peek() == '.') {
      integral = false;
      ++i_;
      while (std::isdigit(static_cast<unsigned char>(peek())))
        ++i_;
    }
    if (peek() == 'e' || peek() == 'E') {
      size_t k = 1;
      if (peek(k) == '+' || peek(k) == '-')
        ++k;
      if (std::isdigit(static_cast<unsigned char>(peek(k)))) {
        integral = false;
        i_ += k;
        while (std::isdigit(static_cast<unsigned char>(peek())))
          ++i_;
      }
    }
    if (name_char(peek()))
      error("a number runs into " + found() + ": put an operator or a space between");
    auto e = node(expr::kind::number, begin);
    std::string digits = s_.substr(begin, i_ - begin);
    e->number = std::strtod(digits.c_str(), nullptr);
    if (!std::isfinite(e->number))
      error_at(begin, "the number " + digits + " is out of range");
    e->integral = integral;
    if (integral) {
      // Exactly, digit by digit: a double has 53 bits, int64 has 63.
      e->exact = true;
      for (char c : digits) {
        auto d = static_cast<uint64_t>(c - '0');
        if (e->magnitude > (UINT64_MAX - d) / 10) {
          e->exact = false;
          break;
        }
        e->magnitude = e->magnitude * 10 + d;
      }
    }
    finish(e, begin);
    return e;
  }

  std::string string_literal() {
    char quote = peek();
    size_t begin = i_;
    ++i_;
    std::string out;
    for (;;) {
      if (eof() || peek() == '\n')
        error_at(begin, std::string{"the text is not closed: a "} + quote
                          + " is missing (text does not span lines)");
      char c = peek();
      ++i_;
      if (c == quote)
        return out;
      if (c == '\\') {
        char n = peek();
        ++i_;
        switch (n) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case '\\': out += '\\'; break;
          case '"': out += '"'; break;
          case '\'': out += '\''; break;
          default:
            error_at(i_ - 2, std::string{"unknown escape '\\"} + (n ? std::string(1, n) : "")
                               + "': use \\n, \\t, \\\\, \\\" or \\'");
        }
        continue;
      }
      out += c;
    }
  }

  const std::string& s_;
  size_t first_line_ = 1;
  std::vector<size_t> line_starts_; ///< offset of each line's first character
  int blocks_ = 0;                  ///< open with/repeat blocks
  size_t i_ = 0;
  int depth_ = 0;   ///< open brackets: newlines inside them are blanks
  int nesting_ = 0; ///< expression recursion
};

} // namespace

parse_result parse(const std::string& text, size_t first_line) {
  parse_result r;
  try {
    parser p{text, std::max<size_t>(first_line, 1)};
    r.program = p.program(false);
  } catch (fail& f) {
    r.error = std::move(f.e);
    r.error->first_line = std::max<size_t>(first_line, 1);
  }
  return r;
}

int bracket_balance(const std::string& line) {
  int depth = 0;
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quote != 0) {
      if (c == '\\')
        ++i;
      else if (c == quote)
        quote = 0;
      continue;
    }
    if (c == '#')
      break;
    if (c == '"' || c == '\'')
      quote = c;
    else if (c == '(' || c == '[' || c == '{')
      ++depth;
    else if (c == ')' || c == ']' || c == '}')
      --depth;
  }
  return depth;
}

bool incomplete(const std::string& text) {
  auto r = parse(text);
  return r.error && r.error->incomplete;
}

std::string explain(const parse_error& e, const std::string& text) {
  std::string where = "column " + std::to_string(e.at.column);
  bool multiline = text.find('\n') != std::string::npos || e.first_line > 1;
  if (multiline)
    where = "line " + std::to_string(e.at.line) + ", " + where;
  // The offending line, and a caret under the column.
  size_t start = 0;
  for (size_t l = e.first_line; l < e.at.line; ++l) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos)
      break;
    start = nl + 1;
  }
  size_t end = text.find('\n', start);
  std::string line = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
  // At most 100 characters of the line around the column, each control byte
  // as '?' (the caret stays under the column; a terminal escape in the input
  // must not reach the terminal).
  size_t col = e.at.column > 0 ? e.at.column - 1 : 0;
  size_t from = col > 60 ? col - 60 : 0;
  std::string shown = line.substr(std::min(from, line.size()), 100);
  for (auto& c : shown)
    if (static_cast<unsigned char>(c) < 0x20 && c != '\t')
      c = '?';
  std::string caret(col - from, ' ');
  for (size_t k = 0; k < caret.size() && k < shown.size(); ++k)
    if (shown[k] == '\t')
      caret[k] = '\t';
  return "parse error at " + where + ": " + e.message + "\n  " + (from > 0 ? "..." : "") + shown
         + "\n  " + (from > 0 ? "   " : "") + caret + "^";
}

} // namespace af::repl
