#include "train/memory_data.hpp"

#include <map>
#include <mutex>

namespace af::train {

namespace {

struct registry {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<const dataset>> sets;
};

registry& sets() {
  static registry instance;
  return instance;
}

} // namespace

void put_memory_dataset(const std::string& name, std::shared_ptr<const dataset> data) {
  auto& r = sets();
  std::lock_guard<std::mutex> guard{r.mutex};
  r.sets[name] = std::move(data);
}

void drop_memory_dataset(const std::string& name) {
  auto& r = sets();
  std::lock_guard<std::mutex> guard{r.mutex};
  r.sets.erase(name);
}

std::shared_ptr<const dataset> find_memory_dataset(const std::string& name) {
  auto& r = sets();
  std::lock_guard<std::mutex> guard{r.mutex};
  auto it = r.sets.find(name);
  return it == r.sets.end() ? nullptr : it->second;
}

} // namespace af::train
