#include "actors/variable_directory.hpp"

namespace af {

void variable_directory::put(const std::string& name, entry e) {
  std::lock_guard<std::mutex> guard{mtx_};
  vars_[name] = std::move(e);
}

variable_directory::entry variable_directory::get(const std::string& name) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto it = vars_.find(name);
  return it == vars_.end() ? entry{} : it->second;
}

void variable_directory::remove(const std::string& name, const caf::actor_addr& actor) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto it = vars_.find(name);
  if (it != vars_.end() && it->second.actor.address() == actor)
    vars_.erase(it);
}

void variable_directory::remove(const std::string& name) {
  std::lock_guard<std::mutex> guard{mtx_};
  vars_.erase(name);
}

void variable_directory::put_aggregator(const std::string& name, aggregator_entry e) {
  std::lock_guard<std::mutex> guard{mtx_};
  aggs_[name] = std::make_shared<const aggregator_entry>(std::move(e));
}

std::shared_ptr<const variable_directory::aggregator_entry>
variable_directory::get_aggregator(const std::string& name) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto it = aggs_.find(name);
  return it == aggs_.end() ? nullptr : it->second;
}

void variable_directory::remove_aggregator(const std::string& name) {
  std::lock_guard<std::mutex> guard{mtx_};
  aggs_.erase(name);
}

void variable_directory::set_aggregator_call(aggregator_call f) {
  std::lock_guard<std::mutex> guard{mtx_};
  call_ = std::move(f);
}

variable_directory::aggregator_call variable_directory::aggregator_caller() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return call_;
}

void variable_directory::set_sparse_aggregator_call(sparse_aggregator_call f) {
  std::lock_guard<std::mutex> guard{mtx_};
  sparse_call_ = std::move(f);
}

variable_directory::sparse_aggregator_call variable_directory::sparse_aggregator_caller() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return sparse_call_;
}

void variable_directory::put_executor(const std::string& device, executor_actor e) {
  std::lock_guard<std::mutex> guard{mtx_};
  execs_[device] = std::move(e);
}

executor_actor variable_directory::get_executor(const std::string& device) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto it = execs_.find(device);
  return it == execs_.end() ? executor_actor{} : it->second;
}

void variable_directory::remove_executor(const std::string& device) {
  std::lock_guard<std::mutex> guard{mtx_};
  execs_.erase(device);
}

std::vector<std::pair<std::string, executor_actor>> variable_directory::executors() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return {execs_.begin(), execs_.end()};
}

std::vector<std::pair<std::string, aggregator_actor>> variable_directory::aggregators() const {
  std::lock_guard<std::mutex> guard{mtx_};
  std::vector<std::pair<std::string, aggregator_actor>> out;
  out.reserve(aggs_.size());
  for (const auto& [name, e] : aggs_)
    out.emplace_back(name, e->actor);
  return out;
}

} // namespace af
