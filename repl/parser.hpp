#pragma once
/// The REPL's language (docs/repl.md): statements close to the tutorial's
/// Python, parsed by hand into a small tree. No CAF and no cluster: the fuzz
/// test feeds it random lines, and every input gives a tree or one
/// parse_error naming the line and column.
///
///   program   := stmt { (';' | NEWLINE) stmt }
///   stmt      := 'with' DEVICE '{' program '}'
///              | 'repeat' INT '{' program '}'
///              | NAME { ',' NAME } '=' expr          binds names (a list unpacks)
///              | COMMAND args                       see docs/repl.md
///              | expr                               shows what the value is
///   expr      := term { ('+' | '-') term }
///   term      := unary { ('*' | '/' | '@') unary }
///   unary     := '-' unary | postfix
///   postfix   := primary { '.' NAME '(' args ')' }  x.assign_add(1) is assign_add(x, 1)
///   primary   := NUMBER | STRING | 'true' | 'false' | NAME | NAME '(' args ')'
///              | '[' [ expr { ',' expr } ] ']' | '(' expr ')'
///   args      := [ arg { ',' arg } ]    arg := [ NAME '=' ] expr
///
/// A command's arguments are expressions (run, print), `NAME=expr` feeds after
/// run's `feed`, or plain words (devices, paths, names, durations) up to the
/// end of the statement.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace af::repl {

/// Where in the input something is: 1-based line and column.
struct position {
  size_t line = 1;
  size_t column = 1;
};

struct parse_error {
  position at;
  std::string message;
  /// True when the input ended inside a block, list or call: more
  /// lines would complete it (the REPL keeps reading).
  bool incomplete = false;
  size_t first_line = 1; ///< the line number the parsed text started at
};

struct expr;
using expr_ptr = std::shared_ptr<const expr>;

struct call_arg {
  std::string keyword; ///< "" for a positional argument
  expr_ptr value;
};

struct expr {
  enum class kind { number, string, boolean, name, list, call, method, negate, binary };
  kind what = kind::number;
  position at;
  std::string source;  ///< the expression's own text, as typed ("w + b")
  double number = 0;
  bool integral = false;      ///< a NUMBER written without '.', 'e' (an int literal)
  /// An int literal's exact value, read from its digits (`number` is only
  /// the nearest double: 2^53 + 1 is not one): `magnitude`, negated when
  /// `negative` (the minuses before it, so -9223372036854775808 is INT64_MIN).
  /// False when the digits pass 2^64 - 1 or the literal is not integral.
  bool exact = false;
  bool negative = false;
  uint64_t magnitude = 0;
  std::string text;           ///< name, string, called function, method, or binary op ("+")
  std::vector<expr_ptr> items; ///< list items; binary: lhs, rhs; negate: operand; method: receiver
  std::vector<call_arg> args;  ///< call, method
  int depth = 1;               ///< levels of the tree below and including this one
};

/// A plain word argument of a command (a device, a path, a name, "5s").
struct word {
  std::string text;
  position at;
};

struct stmt {
  enum class kind { assign, with, repeat, command, expr };
  kind what = kind::expr;
  position at;
  std::string source;               ///< the statement's text
  std::vector<std::string> targets; ///< assign: the names bound
  expr_ptr value;                   ///< assign, expr
  word device;                      ///< with
  int64_t count = 0;                ///< repeat
  std::vector<stmt> body;           ///< with, repeat
  std::string command;              ///< command: its name
  position command_at;
  std::vector<expr_ptr> exprs;      ///< run, print
  std::vector<std::pair<word, expr_ptr>> feeds; ///< run ... feed x=[...]
  std::vector<word> words;          ///< the other commands' arguments
};

/// A command and how its arguments parse.
struct command_info {
  const char* name;
  bool takes_exprs; ///< run, print: expressions; else words
  const char* usage;
  const char* help;
};

/// Every command, in the order `help` lists them.
const std::vector<command_info>& commands();
const command_info* find_command(const std::string& name);

/// Parses `text` (one or more lines). Never throws.
struct parse_result {
  std::vector<stmt> program;
  std::optional<parse_error> error;
};
/// `first_line`: the line of a script `text` starts at, for the positions.
parse_result parse(const std::string& text, size_t first_line = 1);

/// How many more brackets ('(', '[', '{') `line` opens than it closes,
/// outside strings and comments: a reader keeps a running sum and asks
/// incomplete() only when it is not positive, so that a long block is not
/// parsed again at each of its lines.
int bracket_balance(const std::string& line);

/// True if `text` ends inside a block or brackets: the REPL reads
/// another line before running it.
bool incomplete(const std::string& text);

/// "line 2, column 5: message" (just "column 5: ..." for one-line input
/// that starts at line 1),
/// followed by the offending line and a caret under the column.
std::string explain(const parse_error& e, const std::string& text);

} // namespace af::repl
