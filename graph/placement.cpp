#include "graph/placement.hpp"

#include <algorithm>

namespace af {

namespace {

std::string task_path(const std::string& job, int32_t task) {
  return "/job:" + job + "/task:" + std::to_string(task);
}

std::string full_name(const std::string& job, int32_t task, const std::string& local) {
  return "/job:" + job + "/replica:0/task:" + std::to_string(task) + "/device:" + local;
}

/// The catalog's own code when it says something about the node (unreachable,
/// timed out); unknown_device when the task itself does not exist, as a
/// session reported a task missing from the cluster spec.
af_error catalog_code(af_error code) {
  switch (code) {
    case af_error::unreachable:
    case af_error::timeout:
    case af_error::peer_down:
    case af_error::internal:
    case af_error::aborted:
      return code;
    default:
      return af_error::unknown_device;
  }
}

} // namespace

std::string placed_device::task_name() const {
  return task_path(job, task);
}

outcome<placed_device> place(const device_name& requested, bool for_variable,
                             const placement_policy& policy, const device_catalog& catalog) {
  device_name base;
  base.job = policy.job;
  base.replica = 0;
  base.task = for_variable ? 0 : policy.task;
  base.type = "CPU";
  base.id = 0;
  device_name d = requested;
  if (d.job && !d.task)
    d.task = 0; // /job:ps means its task 0, as in TensorFlow
  d = d.merged_into(base);
  if (!d.id)
    d.id = 0;
  auto shown = requested.to_string().empty() ? std::string{"(no device)"} : requested.to_string();
  if (*d.replica != 0)
    return graph_error{af_error::unknown_device,
                       "device " + shown + ": replica " + std::to_string(*d.replica)
                         + " does not exist (actorflow runs replica 0 of each task)"};
  auto devices = catalog(*d.job, *d.task);
  if (!devices)
    return graph_error{catalog_code(devices.error().code),
                       "device " + shown + ": " + devices.error().what};
  placed_device p;
  p.job = *d.job;
  p.task = *d.task;
  p.local = d.local_device();
  if (std::find(devices->begin(), devices->end(), p.local) == devices->end()) {
    std::string list;
    for (const auto& x : *devices)
      list += (list.empty() ? "" : ", ") + x;
    auto msg = d.to_string() + " is not available on " + task_path(*d.job, *d.task) + " (it has "
               + list + ")";
    if (!policy.soft_placement)
      return graph_error{af_error::unknown_device,
                         msg + "; enable soft placement or pick one of those"};
    p.note = "soft placement: " + msg + "; placed on CPU:0";
    p.local = "CPU:0";
  }
  p.full = full_name(p.job, p.task, p.local);
  return p;
}

outcome<placed_device> placed_from_full(const std::string& full) {
  std::string why;
  auto d = device_name::parse(full, &why);
  if (!d)
    return graph_error{af_error::invalid_device, why};
  if (!d->job || !d->task || !d->type || !d->id)
    return graph_error{af_error::invalid_device,
                       "device '" + full
                         + "' is not a full device name (/job:J/replica:0/task:T/device:TYPE:N)"};
  if (d->replica.value_or(0) != 0)
    return graph_error{af_error::unknown_device,
                       "device '" + full + "': replica " + std::to_string(*d->replica)
                         + " does not exist (actorflow runs replica 0 of each task)"};
  placed_device p;
  p.job = *d->job;
  p.task = *d->task;
  p.local = d->local_device();
  p.full = full_name(p.job, p.task, p.local);
  return p;
}

} // namespace af
