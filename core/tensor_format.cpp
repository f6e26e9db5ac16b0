#include "core/tensor_format.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

// A port of numpy/_core/arrayprint.py (numpy 2.x, default options) for the
// four dtypes a tensor has. Names in comments (FloatingFormat, _formatArray,
// pad_left, ...) are numpy's, so a difference can be traced back to it.

namespace af {

namespace {

bool is_float(dtype t) {
  return t == dtype::float32 || t == dtype::float64;
}

/// A float's text in three parts, as Dragon4 makes it: "-12" "5" for -12.5 in
/// positional notation, "-1" "25" "+01" in scientific. The point goes between
/// `whole` and `fraction`; `exponent` is empty in positional notation.
struct float_parts {
  std::string whole;    ///< the digits before the point, '-' first if negative
  std::string fraction; ///< the digits after it, trailing zeros removed
  std::string exponent; ///< "+05", "-300": a sign and at least two digits
};

/// The shortest digits that read back as `magnitude` (finite, > 0) as a float
/// (`single`) or double: magnitude = d.ddd x 10^exp10. Numpy's Dragon4 and
/// to_chars both give the shortest round-trip text, the closest one on a tie.
void shortest_digits(double magnitude, bool single, std::string& digits, int& exp10) {
  char buf[64];
  auto res = single ? std::to_chars(buf, buf + sizeof buf, static_cast<float>(magnitude),
                                    std::chars_format::scientific)
                    : std::to_chars(buf, buf + sizeof buf, magnitude, std::chars_format::scientific);
  std::string text{buf, res.ptr};
  auto e = text.find('e');
  digits.clear();
  for (size_t i = 0; i < e; ++i)
    if (text[i] != '.')
      digits += text[i];
  exp10 = std::atoi(text.c_str() + e + 1);
}

/// printf's text, whose rounding of the exact binary value (half to even) is
/// the one Dragon4 makes when `precision` cuts the shortest digits short.
std::string printf_text(const char* format, int precision, double magnitude) {
  int n = std::snprintf(nullptr, 0, format, precision, magnitude);
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), format, precision, magnitude);
  out.resize(static_cast<size_t>(n));
  return out;
}

void strip_trailing_zeros(std::string& digits) {
  while (!digits.empty() && digits.back() == '0')
    digits.pop_back();
}

/// format_float_positional(v, precision, unique=True, trim='.') as parts;
/// precision < 0: no limit. `v` is finite.
float_parts positional(double v, bool single, int precision) {
  float_parts p;
  double magnitude = std::fabs(v);
  if (magnitude == 0) {
    p.whole = "0";
  } else {
    std::string digits;
    int exp10 = 0;
    shortest_digits(magnitude, single, digits, exp10);
    if (exp10 >= 0) {
      auto whole_digits = static_cast<size_t>(exp10) + 1;
      if (digits.size() < whole_digits)
        digits.append(whole_digits - digits.size(), '0');
      p.whole = digits.substr(0, whole_digits);
      p.fraction = digits.substr(whole_digits);
    } else {
      p.whole = "0";
      p.fraction = std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
    }
    if (precision >= 0 && p.fraction.size() > static_cast<size_t>(precision)) {
      auto text = printf_text("%.*f", precision, magnitude);
      auto point = text.find('.');
      p.whole = text.substr(0, point);
      p.fraction = point == std::string::npos ? "" : text.substr(point + 1);
      strip_trailing_zeros(p.fraction);
    }
  }
  if (std::signbit(v))
    p.whole.insert(0, "-");
  return p;
}

/// format_float_scientific(v, precision, unique=True, trim='.') as parts;
/// precision < 0: no limit. `v` is finite.
float_parts scientific(double v, bool single, int precision) {
  float_parts p;
  double magnitude = std::fabs(v);
  int exp10 = 0;
  if (magnitude == 0) {
    p.whole = "0";
  } else {
    std::string digits;
    shortest_digits(magnitude, single, digits, exp10);
    p.whole = digits.substr(0, 1);
    p.fraction = digits.substr(1);
    if (precision >= 0 && p.fraction.size() > static_cast<size_t>(precision)) {
      // "d.ddde+XX": rounding may carry into the exponent (9.99 -> 1.0e+01).
      auto text = printf_text("%.*e", precision, magnitude);
      auto e = text.find('e');
      auto point = text.find('.');
      p.whole = text.substr(0, 1);
      p.fraction = point < e ? text.substr(point + 1, e - point - 1) : "";
      strip_trailing_zeros(p.fraction);
      exp10 = std::atoi(text.c_str() + e + 1);
    }
  }
  if (std::signbit(v))
    p.whole.insert(0, "-");
  auto exp_digits = std::to_string(std::abs(exp10));
  if (exp_digits.size() < 2)
    exp_digits.insert(0, "0");
  p.exponent = (exp10 < 0 ? "-" : "+") + exp_digits;
  return p;
}

/// str() of a numpy float scalar, which is what str() of a 0-d array is: the
/// shortest digits, never cut by `precision`; positional between 1e-4 and
/// 1e16 (1e6 for float32) with at least one digit after the point ("10.0"),
/// else scientific without a bare point ("1e+16", "1.5e-05").
std::string float_scalar(double v, bool single) {
  if (std::isnan(v))
    return "nan";
  if (std::isinf(v))
    return v < 0 ? "-inf" : "inf";
  // numpy compares in long double, so float32(1e-4), just below 1e-4, is scientific.
  auto magnitude = std::fabs(static_cast<long double>(v));
  long double upper = single ? 1e6L : 1e16L;
  if (magnitude == 0 || (magnitude >= 1e-4L && magnitude < upper)) {
    auto p = positional(v, single, -1);
    return p.whole + "." + (p.fraction.empty() ? "0" : p.fraction);
  }
  auto p = scientific(v, single, -1);
  return p.whole + (p.fraction.empty() ? "" : "." + p.fraction) + "e" + p.exponent;
}

/// numpy's FloatingFormat for floatmode "maxprec": one pass over the values
/// that will be shown decides the notation and the column's layout; then each
/// value is printed into it.
class float_column {
public:
  float_column(const std::vector<double>& shown, bool single, int precision)
    : single_(single), precision_(precision) {
    std::vector<double> finite;
    bool has_neg_inf = false;
    for (double v : shown) {
      if (std::isfinite(v))
        finite.push_back(v);
      else if (std::isinf(v) && v < 0)
        has_neg_inf = true;
    }
    exp_format_ = wants_scientific(finite);
    if (exp_format_) {
      // Every mantissa gets as many digits as the longest one needs, and
      // every exponent as many as the widest.
      size_t exp_width = 0;
      for (double v : finite) {
        auto p = scientific(v, single_, precision_);
        pad_left_ = std::max(pad_left_, p.whole.size());
        mantissa_digits_ = std::max(mantissa_digits_, p.fraction.size());
        exp_width = std::max(exp_width, p.exponent.size());
      }
      exp_digits_ = exp_width - 1;
      pad_right_ = exp_digits_ + 2 + mantissa_digits_;
    } else {
      // Each value keeps its own digits; spaces align the points.
      for (double v : finite) {
        auto p = positional(v, single_, precision_);
        pad_left_ = std::max(pad_left_, p.whole.size());
        pad_right_ = std::max(pad_right_, p.fraction.size());
      }
    }
    if (finite.size() != shown.size()) {
      // "nan", "inf" or "-inf" must fit in the column too.
      size_t offset = pad_right_ + 1;
      size_t needed = 3 + (has_neg_inf ? 1 : 0);
      if (needed > offset)
        pad_left_ = std::max(pad_left_, needed - offset);
    }
  }

  std::string operator()(double v) const {
    if (!std::isfinite(v)) {
      std::string word = std::isnan(v) ? "nan" : v < 0 ? "-inf" : "inf";
      return pad(word, pad_left_ + pad_right_ + 1);
    }
    if (exp_format_) {
      // Dragon4 with min_digits: a mantissa shorter than the column's goes on
      // with the value's exact digits, not zeros (float32 0.1 is
      // 1.00000001e-01), which is printf's correctly rounded text.
      auto text = printf_text("%.*e", static_cast<int>(mantissa_digits_), std::fabs(v));
      auto e = text.find('e');
      auto whole = (std::signbit(v) ? "-" : "") + text.substr(0, 1);
      auto fraction = mantissa_digits_ > 0 ? text.substr(2, e - 2) : "";
      auto exp_digits = text.substr(e + 2);
      exp_digits.insert(0, exp_digits_ - std::min(exp_digits_, exp_digits.size()), '0');
      return pad(whole, pad_left_) + "." + fraction + "e" + text[e + 1] + exp_digits;
    }
    auto p = positional(v, single_, precision_);
    p.fraction.append(pad_right_ - p.fraction.size(), ' ');
    return pad(p.whole, pad_left_) + "." + p.fraction;
  }

private:
  /// Scientific if the largest magnitude is large (1e8, 1e6 for float32, whose
  /// digits past the sixth are noise), the smallest nonzero one is below 1e-4,
  /// or they are more than 1e3 apart. Computed in the dtype's own precision,
  /// as numpy does.
  bool wants_scientific(const std::vector<double>& finite) const {
    bool any = false;
    double max_val = 0;
    double min_val = 0;
    for (double v : finite) {
      double m = std::fabs(v);
      if (m == 0)
        continue;
      max_val = any ? std::max(max_val, m) : m;
      min_val = any ? std::min(min_val, m) : m;
      any = true;
    }
    if (!any)
      return false;
    if (single_) {
      auto max_f = static_cast<float>(max_val);
      auto min_f = static_cast<float>(min_val);
      return max_f >= 1e6f || min_f < 1e-4f || max_f / min_f > 1000.0f;
    }
    return max_val >= 1e8 || min_val < 1e-4 || max_val / min_val > 1000.0;
  }

  static std::string pad(const std::string& s, size_t width) {
    return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
  }

  bool single_;
  int precision_;
  bool exp_format_ = false;
  size_t pad_left_ = 0;
  size_t pad_right_ = 0;
  size_t mantissa_digits_ = 0;
  size_t exp_digits_ = 0;
};

/// Row-major strides of `shape`, in elements.
std::vector<size_t> strides_of(const shape_type& shape) {
  std::vector<size_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;)
    strides[d - 1] = strides[d] * static_cast<size_t>(shape[d]);
  return strides;
}

/// True if the middle of an axis of `len` items is shown as "...".
bool elided(int64_t len, const print_options& o, bool summarize) {
  return summarize && 2 * o.edge_items < static_cast<size_t>(len);
}

void collect_shown(const shape_type& shape, const std::vector<size_t>& strides,
                   const print_options& o, bool summarize, size_t axis, size_t offset,
                   std::vector<size_t>& out) {
  if (axis == shape.size()) {
    out.push_back(offset);
    return;
  }
  auto len = static_cast<size_t>(shape[axis]);
  // With edge_items 0 numpy keeps a[:0] and a[-0:], which is all of the axis.
  bool skip = elided(shape[axis], o, summarize) && o.edge_items > 0;
  for (size_t i = 0; i < len; ++i) {
    if (skip && i == o.edge_items)
      i = len - o.edge_items;
    collect_shown(shape, strides, o, summarize, axis + 1, offset + i * strides[axis], out);
  }
}

/// The flat offsets of the elements that will be shown, in order: all of
/// them, or the leading and trailing `edge_items` of every axis longer than
/// twice that (numpy's _leading_trailing). Only these decide the layout.
std::vector<size_t> shown_offsets(const shape_type& shape, const print_options& o,
                                  bool summarize) {
  std::vector<size_t> out;
  collect_shown(shape, strides_of(shape), o, summarize, 0, 0, out);
  return out;
}

/// numpy's _formatArray: brackets, rows, wrapping and "..." around elements
/// that `element` prints from their flat offset.
class array_layout {
public:
  array_layout(const shape_type& shape, const print_options& o, bool summarize,
               std::function<std::string(size_t)> element)
    : shape_(shape), opts_(o), summarize_(summarize), element_(std::move(element)),
      strides_(strides_of(shape)) {
    // nop
  }

  std::string render() const {
    return recurse(0, 0, " ", static_cast<long>(opts_.line_width));
  }

private:
  /// _extendLine: starts a new line when `word` would pass `width`, unless
  /// the line holds nothing yet but its indent.
  static void extend_line(std::string& s, std::string& line, const std::string& word, long width,
                          const std::string& indent) {
    bool wrap = static_cast<long>(line.size() + word.size()) > width
                && line.size() > indent.size();
    if (wrap) {
      auto end = line.find_last_not_of(' ');
      s += line.substr(0, end == std::string::npos ? 0 : end + 1) + "\n";
      line = indent;
    }
    line += word;
  }

  /// The text of the sub-array at `offset` spanning axes `axis`...; its first
  /// line goes after `indent` (which is cut off again), its later lines start
  /// with it; `width` is what is left of the line width at this depth.
  std::string recurse(size_t axis, size_t offset, const std::string& indent, long width) const {
    if (axis == shape_.size())
      return element_(offset);
    auto next_indent = indent + " ";
    long next_width = width - 1; // the closing ']'
    auto len = static_cast<size_t>(shape_[axis]);
    bool elide = elided(shape_[axis], opts_, summarize_);
    size_t leading = elide ? opts_.edge_items : 0;
    size_t trailing = elide ? opts_.edge_items : len;
    auto item = [&](size_t i) {
      return recurse(axis + 1, offset + i * strides_[axis], next_indent, next_width);
    };
    std::string s;
    if (axis + 1 == shape_.size()) {
      // A row: elements separated by spaces, wrapped to the width.
      long elem_width = width - 1;
      std::string line = indent;
      for (size_t i = 0; i < leading; ++i) {
        extend_line(s, line, item(i), elem_width, indent);
        line += ' ';
      }
      if (elide) {
        extend_line(s, line, "...", elem_width, indent);
        line += ' ';
      }
      for (size_t i = trailing; i > 1; --i) {
        extend_line(s, line, item(len - i), elem_width, indent);
        line += ' ';
      }
      extend_line(s, line, item(len - 1), elem_width, indent);
      s += line;
    } else {
      // Sub-arrays one per line, with a blank line more per axis below.
      std::string line_sep(shape_.size() - axis - 1, '\n');
      for (size_t i = 0; i < leading; ++i)
        s += indent + item(i) + line_sep;
      if (elide)
        s += indent + "..." + line_sep;
      for (size_t i = trailing; i > 1; --i)
        s += indent + item(len - i) + line_sep;
      s += indent + item(len - 1);
    }
    return "[" + s.substr(indent.size()) + "]";
  }

  const shape_type& shape_;
  print_options opts_;
  bool summarize_;
  std::function<std::string(size_t)> element_;
  std::vector<size_t> strides_;
};

/// Element `i` of an integer tensor, without the trip through double that
/// would round int64 values above 2^53.
int64_t int_at(const tensor& t, size_t i) {
  return t.type() == dtype::int32 ? t.data<int32_t>()[i] : t.data<int64_t>()[i];
}

} // namespace

std::string format_numpy(const tensor& t, const print_options& o) {
  if (t.empty())
    return "<no value>";
  bool floats = is_float(t.type());
  bool single = t.type() == dtype::float32;
  if (t.shape().empty())
    return floats ? float_scalar(t.at(0), single) : std::to_string(int_at(t, 0));
  if (t.num_elements() == 0)
    return "[]";

  bool summarize = t.num_elements() > o.threshold;
  auto shown = shown_offsets(t.shape(), o, summarize);
  std::function<std::string(size_t)> element;
  if (floats) {
    std::vector<double> values;
    values.reserve(shown.size());
    for (auto i : shown)
      values.push_back(t.at(i));
    float_column column{values, single, o.precision};
    element = [&t, column](size_t i) { return column(t.at(i)); };
  } else {
    // IntegerFormat: right-aligned to the longer of the largest and smallest.
    int64_t lo = int_at(t, shown.front());
    int64_t hi = lo;
    for (auto i : shown) {
      lo = std::min(lo, int_at(t, i));
      hi = std::max(hi, int_at(t, i));
    }
    size_t width = std::max(std::to_string(lo).size(), std::to_string(hi).size());
    element = [&t, width](size_t i) {
      auto s = std::to_string(int_at(t, i));
      return std::string(width - std::min(width, s.size()), ' ') + s;
    };
  }
  return array_layout{t.shape(), o, summarize, std::move(element)}.render();
}

std::string describe_shape(const tensor& t) {
  if (t.empty())
    return "<no value>";
  std::string out = "(";
  const auto& shape = t.shape();
  for (size_t d = 0; d < shape.size(); ++d)
    out += (d > 0 ? ", " : "") + std::to_string(shape[d]);
  if (shape.size() == 1)
    out += ',';
  return out + ") " + dtype_name(t.type());
}

} // namespace af
