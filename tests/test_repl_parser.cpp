// The REPL's parser (repl/parser.hpp): the grammar's cases, the columns of
// its errors, and 10,000 random and mutated lines that must each give a tree
// or one error inside the input, never a crash or a hang.

#include <random>

#include <catch2/catch.hpp>

#include "repl/parser.hpp"

using namespace af::repl;

namespace {

const stmt& only(const parse_result& r) {
  REQUIRE_FALSE(r.error);
  REQUIRE(r.program.size() == 1);
  return r.program[0];
}

} // namespace

TEST_CASE("statements parse into the tree the interpreter expects", "[repl][parser]") {
  SECTION("assignment, precedence and source text") {
    auto r = parse("y = -w + b * 2 @ x");
    const auto& st = only(r);
    CHECK(st.what == stmt::kind::assign);
    CHECK(st.targets == std::vector<std::string>{"y"});
    const auto& e = *st.value;
    REQUIRE(e.what == expr::kind::binary);
    CHECK(e.text == "+");
    CHECK(e.items[0]->what == expr::kind::negate);
    CHECK(e.items[1]->text == "@"); // (b * 2) @ x: left to right within a term
    CHECK(e.items[1]->items[0]->text == "*");
    CHECK(e.items[1]->source == "b * 2 @ x");
  }
  SECTION("a negative number stays a literal inside a list") {
    auto r = parse("[[-1, 2.5e1]]");
    const auto& st = only(r);
    const auto& row = *st.value->items[0];
    CHECK(row.items[0]->what == expr::kind::number);
    CHECK(row.items[0]->number == -1);
    CHECK(row.items[0]->integral);
    CHECK(row.items[1]->number == 25);
    CHECK_FALSE(row.items[1]->integral);
  }
  SECTION("an integer literal keeps its exact value beside the double (issue 22)") {
    auto r = parse("[9007199254740993, -9223372036854775808, --5, 18446744073709551615, "
                   "18446744073709551616, 2.0, -0]");
    const auto& items = only(r).value->items;
    REQUIRE(items.size() == 7);
    CHECK(items[0]->exact);
    CHECK(items[0]->magnitude == 9007199254740993u); // the double is 2^53
    CHECK_FALSE(items[0]->negative);
    CHECK(items[1]->exact);
    CHECK(items[1]->negative);
    CHECK(items[1]->magnitude == 9223372036854775808u);
    CHECK(items[2]->exact);
    CHECK_FALSE(items[2]->negative);
    CHECK(items[2]->magnitude == 5);
    CHECK(items[3]->exact);
    CHECK(items[3]->magnitude == UINT64_MAX);
    CHECK_FALSE(items[4]->exact); // past 2^64 - 1: only its double
    CHECK_FALSE(items[5]->exact);
    CHECK(items[6]->exact);
    CHECK_FALSE(items[6]->negative);
  }
  SECTION("calls with keywords, methods, unpacking") {
    auto r = parse("a, b = gradients(loss, [w, v]); c = w.assign_add(1.0); matmul(a, b, transpose_b=true)");
    REQUIRE_FALSE(r.error);
    REQUIRE(r.program.size() == 3);
    CHECK(r.program[0].targets == std::vector<std::string>{"a", "b"});
    CHECK(r.program[1].value->what == expr::kind::method);
    CHECK(r.program[1].value->text == "assign_add");
    CHECK(r.program[1].value->items[0]->text == "w");
    CHECK(r.program[2].value->args[2].keyword == "transpose_b");
  }
  SECTION("commands: expressions, feeds and words") {
    auto r = parse("run y, w + b feed x=[[1,2],[3,4]], z=1; vars /job:ps/task:0; save ckpt/ ; restore ckpt/");
    REQUIRE_FALSE(r.error);
    REQUIRE(r.program.size() == 4);
    CHECK(r.program[0].command == "run");
    CHECK(r.program[0].exprs.size() == 2);
    REQUIRE(r.program[0].feeds.size() == 2);
    CHECK(r.program[0].feeds[0].first.text == "x");
    CHECK(r.program[1].words[0].text == "/job:ps/task:0");
    CHECK(r.program[2].words[0].text == "ckpt/");
    CHECK(r.program[3].command == "restore");
  }
  SECTION("blocks nest and span lines") {
    auto r = parse("with /job:ps/task:0 {\n  w = variable(\"w\", [2])\n  repeat 3 { run w }\n}");
    const auto& st = only(r);
    CHECK(st.what == stmt::kind::with);
    CHECK(st.device.text == "/job:ps/task:0");
    REQUIRE(st.body.size() == 2);
    CHECK(st.body[1].what == stmt::kind::repeat);
    CHECK(st.body[1].count == 3);
  }
  SECTION("comments and blank statements") {
    auto r = parse("# nothing\n;;\nprint 1 # one\n");
    const auto& st = only(r);
    CHECK(st.command == "print");
  }
}

TEST_CASE("parse errors name the line and column and say what was expected", "[repl][parser]") {
  auto col = [](const std::string& text) {
    auto r = parse(text);
    REQUIRE(r.error);
    return r.error->at.column;
  };
  CHECK(col("run w +* b") == 8);
  CHECK(col("x = [1, 2") == 10);
  CHECK(col("x = f(1,, 2)") == 9);
  CHECK(col("x = 3abc") == 6);
  CHECK(col("x = \"open") == 5);
  CHECK(col("run = 3") == 1);
  CHECK(col("repeat many { }") == 8);
  auto r = parse("print 1\nx = (2 + )");
  REQUIRE(r.error);
  CHECK(r.error->at.line == 2);
  CHECK(r.error->at.column == 10);
  auto text = explain(*r.error, "print 1\nx = (2 + )");
  CHECK(text.find("line 2, column 10") != std::string::npos);
  CHECK(text.find("\n  x = (2 + )\n           ^") != std::string::npos);
}

TEST_CASE("input that ends inside a block, list, call or string asks for more", "[repl][parser]") {
  CHECK(incomplete("with /cpu:0 {"));
  CHECK(incomplete("with /cpu:0 {\n w = variable(\"w\", [2,"));
  CHECK(incomplete("x = f(1,"));
  CHECK(incomplete("x = [1,\n 2"));
  CHECK_FALSE(incomplete("x = [1, 2]"));
  CHECK_FALSE(incomplete("x = ]"));       // an error, not a continuation
  CHECK_FALSE(incomplete("x = \"open"));  // a string does not span lines
  CHECK_FALSE(incomplete("}"));
}

TEST_CASE("10,000 random and mutated lines: a tree or one error inside the input each",
          "[repl][parser][fuzz]") {
  const std::vector<std::string> corpus{
    "with /job:ps/task:0 { w = variable(\"w\", [2,2], const(2)); b = variable(\"b\", [2,2], 5) }",
    "run w + b, w * b feed x=[[1,2],[3,4]]",
    "a, b = gradients(reduce_mean(square(x @ w - [[2],[3]])), [w, b])",
    "repeat 5 { session /job:worker/task:0; run inc }",
    "y = matmul(x, w, transpose_b=true).assign_add(-1.5e-3)",
    "print \"text with \\\"quotes\\\" and \\n\", [1, [2, 3]], (((1)))",
    "train start config/train.toml mode=async; train mode sync; wait 5s w b",
  };
  const std::string alphabet = "abwxyz_019.,;:=+-*/@()[]{}\"'\\# \n\tewithrepeatrunfeed";
  std::mt19937_64 rng{20261201};
  size_t trees = 0, errors = 0;
  for (int i = 0; i < 10000; ++i) {
    std::string line;
    if (i % 2 == 0) {
      // random characters from the grammar's alphabet
      size_t n = rng() % 80;
      for (size_t k = 0; k < n; ++k)
        line += alphabet[rng() % alphabet.size()];
    } else {
      // a corpus line with a few bytes changed, inserted or cut (any byte)
      line = corpus[rng() % corpus.size()];
      int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !line.empty(); ++e) {
        size_t at = rng() % line.size();
        switch (rng() % 3) {
          case 0: line[at] = static_cast<char>(rng() % 256); break;
          case 1: line.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
          default: line.erase(at, 1 + rng() % 5); break;
        }
      }
    }
    auto r = parse(line);
    if (r.error) {
      ++errors;
      // The error points inside the input (or just past its end).
      size_t lines = 1 + static_cast<size_t>(std::count(line.begin(), line.end(), '\n'));
      INFO(line);
      CHECK(r.error->at.line >= 1);
      CHECK(r.error->at.line <= lines);
      CHECK(r.error->at.column >= 1);
      CHECK(r.error->at.column <= line.size() + 1);
      CHECK_FALSE(r.error->message.empty());
      CHECK_FALSE(explain(*r.error, line).empty());
    } else {
      ++trees;
    }
  }
  // Both outcomes are exercised: a fuzzer that only ever fails early, or
  // never fails, tests less than it seems.
  CHECK(trees > 500);
  CHECK(errors > 500);
  // Deep nesting is refused, not a stack overflow.
  auto deep = parse("x = " + std::string(100000, '[') + "1" + std::string(100000, ']'));
  REQUIRE(deep.error);
  CHECK(deep.error->message.find("nests too deeply") != std::string::npos);
  auto deep_neg = parse("x = " + std::string(100000, '-') + "y");
  REQUIRE(deep_neg.error);
  std::string blocks;
  for (int i = 0; i < 100000; ++i)
    blocks += "repeat 1 { ";
  auto deep_blocks = parse(blocks + "print 1" + std::string(100000, '}'));
  REQUIRE(deep_blocks.error);
  CHECK(deep_blocks.error->message.find("nest too deeply") != std::string::npos);
}

TEST_CASE("long operator and method chains are refused, not a stack overflow", "[repl][parser]") {
  std::string sum = "print 1";
  for (int i = 0; i < 7000; ++i)
    sum += "+1";
  auto r = parse(sum);
  REQUIRE(r.error);
  CHECK(r.error->message.find("nests too deeply") != std::string::npos);
  std::string chain = "x = c";
  for (int i = 0; i < 10000; ++i)
    chain += ".relu()";
  REQUIRE(parse(chain).error);
  std::string fine = "print 1";
  for (int i = 0; i < 400; ++i)
    fine += " + 1";
  CHECK_FALSE(parse(fine).error);
}

TEST_CASE("bracket_balance counts what a line leaves open, outside strings and comments",
          "[repl][parser]") {
  CHECK(bracket_balance("with /cpu:0 {") == 1);
  CHECK(bracket_balance("x = f([1, 2") == 2);
  CHECK(bracket_balance("print \"{[(\" # ((") == 0);
  CHECK(bracket_balance("print '\\'{'") == 0);
  CHECK(bracket_balance("}]") == -2);
}

TEST_CASE("positions start at the script line given", "[repl][parser]") {
  auto r = parse("x = (1 +", 41);
  REQUIRE(r.error);
  CHECK(r.error->at.line == 41);
  CHECK(explain(*r.error, "x = (1 +").find("line 41, column 9") != std::string::npos);
}

TEST_CASE("a block of 5,000 lines parses, with the right line in its error", "[repl][parser]") {
  std::string text = "repeat 2 {\n";
  for (int i = 0; i < 5000; ++i)
    text += "  x" + std::to_string(i) + " = " + std::to_string(i) + "\n";
  auto ok = parse(text + "}");
  REQUIRE_FALSE(ok.error);
  CHECK(ok.program[0].body.size() == 5000);
  auto bad = parse(text + "  y = (1 +\n}");
  REQUIRE(bad.error);
  CHECK(bad.error->at.line == 5003);
}
