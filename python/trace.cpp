// af.RunOptions(trace=True) and af.RunMetadata: TF's FULL_TRACE and
// run_metadata.step_stats over the library's run_trace (actors/trace.hpp),
// which af::session::run fills: where each op, variable access and transfer
// of a step ran, and when. Session.run (python/session.cpp) hands the
// metadata's run_trace to the library's run when the options ask for one.
#include "python/bindings.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>

namespace af::python {

namespace {

/// TF's RunOptions.TraceLevel values (only FULL_TRACE and NO_TRACE differ here:
/// the library's trace is always the full one).
constexpr int no_trace = 0;
constexpr int full_trace = 3;

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f{path, std::ios::binary | std::ios::trunc};
  if (!f)
    raise(af_error::invalid_argument, "RunMetadata.save_chrome_trace: cannot write '" + path
                                        + "' (" + std::strerror(errno)
                                        + "): check the directory exists and is writable");
  f << text;
  f.close();
  if (!f)
    raise(af_error::internal, "RunMetadata.save_chrome_trace: writing '" + path + "' failed");
}

py::list entries_of(const run_trace& t) {
  py::list out;
  for (const auto& e : t.entries)
    out.append(py::cast(e));
  return out;
}

} // namespace

void register_trace(py::module_& m) {
  auto options = py::class_<py_run_options>(m, "RunOptions",
    "Options of one Session.run (tf.RunOptions): trace=True (or trace_level=FULL_TRACE) "
    "records where each op ran into the run_metadata given with it.")
    .def(py::init([](bool trace, int trace_level) {
           return py_run_options{trace || trace_level != no_trace};
         }),
         py::arg("trace") = false, py::arg("trace_level") = no_trace,
         "RunOptions(trace=False, trace_level=0): trace=True or trace_level=RunOptions.FULL_TRACE "
         "asks Session.run to fill its run_metadata's trace")
    .def_readwrite("trace", &py_run_options::trace, "whether the run records a trace")
    .def_property(
      "trace_level", [](const py_run_options& o) { return o.trace ? full_trace : no_trace; },
      [](py_run_options& o, int level) { o.trace = level != no_trace; },
      "TF's name: FULL_TRACE (3) when tracing, NO_TRACE (0) when not")
    .def("__repr__", [](const py_run_options& o) {
      return std::string("af.RunOptions(trace=") + (o.trace ? "True" : "False") + ")";
    });
  options.attr("NO_TRACE") = no_trace;
  options.attr("FULL_TRACE") = full_trace;

  py::class_<trace_entry>(m, "TraceEntry",
    "One op, variable access or transfer of a traced run (actors/trace.hpp): times are "
    "nanoseconds of the client's steady clock (another node's shifted by its measured offset).")
    .def_readonly("op", &trace_entry::op, "the graph name: \"w\", \"add\", \"var/assign_add\", "
                                          "\"relu -> layer2\" (a transfer)")
    .def_readonly("kind", &trace_entry::kind, "the op (add, matmul, ...), read, transfer, assign, ...")
    .def_readonly("requested", &trace_entry::requested, "the device as requested (scopes merged)")
    .def_readonly("device", &trace_entry::device, "the device it ran on, fully specified")
    .def_readonly("node", &trace_entry::node, "host:port of the node it ran on")
    .def_readonly("note", &trace_entry::note, "why soft placement moved it; a transfer's path")
    .def_readonly("start_ns", &trace_entry::start_ns)
    .def_readonly("end_ns", &trace_entry::end_ns)
    .def_readonly("bytes_in", &trace_entry::bytes_in, "ops: bytes of inputs; transfers: bytes moved")
    .def_readonly("bytes_out", &trace_entry::bytes_out, "ops: bytes of the result")
    .def_property_readonly("duration_ns", [](const trace_entry& e) { return e.end_ns - e.start_ns; })
    .def("__repr__", [](const trace_entry& e) {
      return "af.TraceEntry(op='" + e.op + "', kind='" + e.kind + "', device='" + e.device
             + "', node='" + e.node + "', start_ns=" + std::to_string(e.start_ns)
             + ", end_ns=" + std::to_string(e.end_ns) + ")";
    });

  py::class_<py_run_metadata, std::shared_ptr<py_run_metadata>>(m, "RunMetadata",
    "What a traced Session.run recorded (tf.RunMetadata): .trace, .chrome_json(), "
    ".save_chrome_trace(path). Each traced run replaces what the last one left.")
    .def(py::init<>())
    .def_property_readonly("trace", [](const py_run_metadata& md) { return entries_of(md.trace); },
                           "the entries of the last traced run (af.TraceEntry), in the order "
                           "the library recorded them")
    .def_property_readonly("step_stats", [](const py_run_metadata& md) { return entries_of(md.trace); },
                           "TF's name for .trace")
    .def("chrome_json", [](const py_run_metadata& md) { return md.trace.to_chrome_json(); },
         "Chrome trace-event JSON (open in https://ui.perfetto.dev or chrome://tracing): a "
         "process per node, a thread per device, a span per entry (TF's "
         "timeline.Timeline(step_stats).generate_chrome_trace_format())")
    .def("save_chrome_trace",
         [](const py_run_metadata& md, const std::string& path) {
           write_file(path, md.trace.to_chrome_json());
         },
         py::arg("path"), "writes chrome_json() to `path` (the REPL's `trace save PATH`)")
    .def("by_device", [](const py_run_metadata& md) { return md.trace.by_device(); },
         "TF's run_with_location_trace printout: each device, then its ops")
    .def("__len__", [](const py_run_metadata& md) { return md.trace.entries.size(); })
    .def("__str__", [](const py_run_metadata& md) { return md.trace.to_string(); });
}

} // namespace af::python
