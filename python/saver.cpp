// af.train.Saver (tf.train.Saver): save(sess, dir) and restore(sess, path)
// over the library's checkpoints (train/checkpoint.hpp: the files the REPL's
// `save DIR` / `restore DIR` and actorflow-train write). It goes through the
// session's own Session.run, as the REPL's save and restore go through
// af::session::run: the values are fetched, then assigned from feeds by
// placeholder and assign nodes the saver adds to the graph at its first
// restore (TF's Saver adds its restore ops to the graph too).
#include "python/bindings.hpp"

#include <pybind11/stl.h>

#include <sys/stat.h>

#include <limits>
#include <map>

#include "train/checkpoint.hpp"

namespace af::python {

namespace {

std::string shape_text(const shape_type& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? ", " : "") + std::to_string(s[i]) + (s.size() == 1 ? "," : "");
  return out + ")";
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

/// A path with a NUL byte names another file to the system than to
/// Python (save made the directory before the NUL): refused as open() does.
void no_nul(const char* what, const std::string& path) {
  if (path.find('\0') != std::string::npos)
    throw py::value_error(std::string{what} + ": embedded null byte in the path");
}

class py_saver {
public:
  /// var_list: None (every variable the default graph has now, as TF's
  /// global variables), a list of variables, or a dict of checkpoint name:
  /// variable.
  py_saver(const py::object& var_list, size_t max_to_keep) : keep_(max_to_keep) {
    if (var_list.is_none()) {
      graph_ = default_graph();
      for (auto v : graph_->g.variables())
        add_node(v, "");
    } else if (py::isinstance<py::dict>(var_list)) {
      for (auto item : py::reinterpret_borrow<py::dict>(var_list))
        add(item.second, item.first.cast<std::string>());
    } else {
      for (auto v : var_list)
        add(v, "");
    }
    if (vars_.empty())
      throw py::value_error("No variables to save (the graph has none: make them before the Saver)");
  }

  std::string save(const py::object& sess, const std::string& dir, const py::object& step) {
    check_graph(sess);
    no_nul("Saver.save", dir);
    py::list fetches;
    for (const auto& v : vars_)
      fetches.append(py_tensor{graph_, v.node});
    py::list values = sess.attr("run")(fetches);
    train::checkpoint ck;
    ck.global_step = step_of(sess, step);
    for (size_t i = 0; i < vars_.size(); ++i)
      ck.variables.push_back({vars_[i].name, from_python(values[i], vars_[i].type), {}});
    outcome<std::string> path{std::string{}};
    {
      py::gil_scoped_release unlocked;
      path = train::save(dir, ck, keep_);
    }
    if (!path)
      raise(af_error::invalid_argument, "Saver.save: " + path.error().what);
    return *path;
  }

  void restore(const py::object& sess, const std::string& save_path) {
    check_graph(sess);
    no_nul("Saver.restore", save_path);
    auto path = resolve(save_path);
    outcome<train::checkpoint> ck{train::checkpoint{}};
    {
      py::gil_scoped_release unlocked;
      ck = train::load(path);
    }
    if (!ck)
      raise(af_error::invalid_argument, "Saver.restore: " + ck.error().what);
    std::map<std::string, const tensor*> saved;
    for (const auto& sv : ck->variables)
      saved[sv.name] = &sv.value;
    py::list targets;
    py::dict feeds;
    for (auto& v : vars_) {
      auto it = saved.find(v.name);
      if (it == saved.end())
        raise(af_error::not_found, "Saver.restore: " + path + " has no variable '" + v.name
                                     + "' (it holds " + std::to_string(saved.size())
                                     + "); nothing was restored");
      const auto& value = *it->second;
      if (value.shape() != v.shape || value.type() != v.type)
        raise(af_error::invalid_argument,
              "Saver.restore: '" + v.name + "' is " + shape_text(v.shape) + " " + dtype_name(v.type)
                + " here and " + shape_text(value.shape()) + " " + dtype_name(value.type()) + " in "
                + path + "; nothing was restored");
    }
    for (auto& v : vars_) {
      if (!v.assign.valid()) {
        auto& g = graph_->g;
        v.value = g.placeholder("save/restore_" + v.name, v.type, v.shape);
        v.assign = g.assign(v.node, v.value, "save/assign_" + v.name);
      }
      targets.append(py_tensor{graph_, v.assign});
      feeds[py::cast(py_tensor{graph_, v.value})] = to_numpy(tensor{*saved[v.name]});
    }
    sess.attr("run")(targets, feeds);
  }

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& v : vars_)
      out.push_back(v.name);
    return out;
  }

private:
  struct saved_var {
    output node;
    std::string name; ///< in the checkpoint
    shape_type shape;
    dtype type;
    output value, assign; ///< restore's placeholder and assign, made at the first restore
  };

  void add(py::handle v, std::string name) {
    if (!py::isinstance<py_tensor>(v))
      throw py::type_error("Saver: var_list holds variables (af.Variable, af.get_variable); got "
                           + py::repr(v).cast<std::string>().substr(0, 80));
    const auto& t = v.cast<const py_tensor&>();
    if (!graph_)
      graph_ = t.owner;
    if (t.owner != graph_ || t.owner->g.variable_node(t.out) == nullptr)
      raise(af_error::invalid_argument, "Saver: '" + t.owner->g.at(t.out).name
                                          + "' is not a variable of the saver's graph");
    add_node(t.out, std::move(name));
  }

  /// Variable `o` of graph_, saved as `name` ("": its own name).
  void add_node(output o, std::string name) {
    const auto* n = graph_->g.variable_node(o);
    vars_.push_back({o, name.empty() ? n->spec.name : name, n->spec.shape, n->spec.type, {}, {}});
  }

  /// The checkpoint's global step: None (0), a whole number >= 0, or a
  /// tensor (the global step variable, as TF's Saver takes) read through
  /// sess. pybind11's cast gave "Unable to cast Python instance" for -1.
  static uint64_t step_of(const py::object& sess, const py::object& step) {
    if (step.is_none())
      return 0;
    auto value = py::isinstance<py_tensor>(step) ? sess.attr("run")(step) : step;
    auto numbers = py::module_::import("numbers");
    if (py::isinstance(value, py::module_::import("numpy").attr("ndarray"))
        && value.attr("ndim").cast<int>() == 0)
      value = value.attr("item")();
    if (!py::isinstance(value, numbers.attr("Integral")))
      throw py::type_error("Saver.save: global_step is a whole number or a tensor of one; got "
                           + py::repr(value).cast<std::string>().substr(0, 80));
    auto n = py::int_(value);
    if (n < py::int_(0) || n > py::int_(std::numeric_limits<uint64_t>::max()))
      throw py::value_error("Saver.save: global_step = " + py::str(n).cast<std::string>()
                            + " is not a step (0 to 2**64 - 1)");
    return n.cast<uint64_t>();
  }

  void check_graph(const py::object& sess) const {
    // Anything else gave "AttributeError: 'int' object has no attribute 'graph'".
    auto session_type = py::module_::import("actorflow").attr("Session");
    if (!py::isinstance(sess, session_type))
      throw py::type_error("Saver: sess is an af.Session; got "
                           + py::repr(sess).cast<std::string>().substr(0, 80));
    if (sess.attr("graph").cast<graph_ptr>() != graph_)
      raise(af_error::invalid_argument, "Saver: the session runs another graph than the saver's "
                                        "variables are of");
  }

  /// A checkpoint file as save() returned it, or a directory's latest.
  static std::string resolve(const std::string& save_path) {
    if (!is_directory(save_path))
      return save_path;
    auto path = train::latest(save_path);
    if (!path)
      raise(af_error::invalid_argument, "Saver.restore: " + path.error().what);
    if (path->empty())
      raise(af_error::not_found, "Saver.restore: '" + save_path
                                   + "' holds no checkpoint (Saver.save(sess, DIR) writes one)");
    return *path;
  }

  graph_ptr graph_;
  std::vector<saved_var> vars_;
  size_t keep_;
};

} // namespace

void register_saver(py::module_& m) {
  auto train = py::reinterpret_borrow<py::module_>(m.attr("train"));
  py::class_<py_saver>(train, "Saver",
    "Saves and restores variables (tf.train.Saver) as the library's checkpoints "
    "(train/checkpoint.hpp): DIR/ckpt-<step>.afck and DIR/latest, what actorflow-train and the "
    "REPL's save/restore write and read.")
    .def(py::init([](const py::object& var_list, const py::object& keep) {
           // None keeps every file, as in TF; -1 was pybind11's "incompatible constructor
           // arguments", which did not say what max_to_keep takes.
           auto k = keep.is_none() ? 0 : int_arg(keep, "Saver: max_to_keep", 0, INT32_MAX);
           return new py_saver(var_list, static_cast<size_t>(k));
         }), py::arg("var_list") = py::none(), py::arg("max_to_keep") = 5,
         "var_list: None (every variable of the default graph now), a list of variables, or a "
         "dict of name: variable; max_to_keep: checkpoint files kept in the directory (0 or "
         "None: all)")
    .def("save", &py_saver::save, py::arg("sess"), py::arg("save_path"),
         py::arg("global_step") = py::none(),
         "writes the variables' values, read through sess, as save_path/ckpt-<global_step>.afck "
         "(save_path is a directory, made if needed; TF's is a file prefix) and points "
         "save_path/latest at it; returns the file's path")
    .def("restore", &py_saver::restore, py::arg("sess"), py::arg("save_path"),
         "assigns the variables the values of the checkpoint file save_path (as save() returned "
         "it, or latest_checkpoint(dir)) or of directory save_path's latest; a variable the file "
         "lacks is a NotFoundError and one of another shape or dtype an InvalidArgumentError, "
         "before anything is assigned")
    .def_property_readonly("names", &py_saver::names, "the variables' names in the checkpoint");
  train.def(
    "latest_checkpoint",
    [](const std::string& dir) -> py::object {
      no_nul("latest_checkpoint", dir);
      auto path = train::latest(dir);
      if (!path)
        raise(af_error::invalid_argument, "latest_checkpoint: " + path.error().what);
      if (path->empty())
        return py::none();
      return py::str(*path);
    },
    py::arg("checkpoint_dir"),
    "the checkpoint file directory `checkpoint_dir`'s latest names, or None (tf.train.latest_checkpoint)");
}

} // namespace af::python
