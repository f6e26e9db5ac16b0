// af::session: initializing variables and waiting for them.
#include "actors/session_impl.hpp"
#include "actors/pending_reply.hpp"

namespace af {

caf::error session::initialize(const std::vector<output>& vars, const std::string& run_id,
                               std::chrono::milliseconds timeout) {
  auto& im = *impl_;
  auto list = im.variables_of(vars);
  if (!list)
    return std::move(list.error());
  auto wait = timeout.count() > 0 ? timeout : im.opts.timeout;
  // Every request out first, then every answer: each node runs its
  // initializers while the others run theirs.
  using binding_ref = decltype(im.binding_of(list->front()));
  std::vector<std::pair<output, binding_ref>> targets;
  for (auto v : *list) {
    auto b = im.binding_of(v);
    if (!b && is(b.error(), af_error::gone)) {
      if (auto err = im.create_variable(v.id))
        return err;
      b = im.binding_of(v);
    }
    if (!b)
      return std::move(b.error());
    targets.emplace_back(v, std::move(b));
  }
  if (targets.empty())
    return caf::none;
  // A helper actor sends every request and collects the answers, so that
  // the wait watches the session's cancel flag (Ctrl-C) in 20 ms slices.
  std::vector<std::pair<variable_actor, initializer>> asks;
  for (const auto& target : targets)
    asks.emplace_back((*target.second)->actor, im.g.at(target.first).init);
  using answers = std::vector<caf::error>; // per variable: none, or why not
  auto r = std::make_shared<pending_reply<answers>>();
  auto got = std::make_shared<answers>(asks.size());
  auto left = std::make_shared<size_t>(asks.size());
  auto helper = im.sys.spawn([r, got, left, asks, wait, run_id](caf::event_based_actor* a) {
    for (size_t i = 0; i < asks.size(); ++i) {
      auto one = [r, got, left, i](caf::error e) {
        (*got)[i] = std::move(e);
        if (--*left == 0)
          r->settle(*got);
      };
      a->request(asks[i].first, wait, init_atom::value, asks[i].second, false, run_id)
        .then([one](uint64_t) { one(caf::none); }, [one](caf::error& e) { one(std::move(e)); });
    }
  });
  auto all = r->wait(cancel_flag(im.opts), helper, "the initialization");
  if (!all)
    return std::move(all.error());
  caf::error first;
  for (size_t i = 0; i < all->size() && !first; ++i)
    if ((*all)[i])
      first = im.link.explain(std::move((*all)[i]),
                              "initialization of '" + im.g.at(targets[i].first).spec.name + "'",
                              nullptr);
  return first;
}

caf::expected<std::vector<std::string>> session::uninitialized(const std::vector<output>& vars) {
  auto& im = *impl_;
  auto list = im.variables_of(vars);
  if (!list)
    return std::move(list.error());
  std::vector<std::string> out;
  for (auto v : *list) {
    const auto& n = im.g.at(v);
    auto b = im.binding_of(v);
    if (!b && is(b.error(), af_error::gone)) {
      out.push_back(n.spec.name);
      continue;
    }
    if (!b)
      return std::move(b.error());
    // Cancellable (Ctrl-C) as the session's other waits on a node.
    auto info = ask_cancellable<variable_info>(
      im.sys, cancel_flag(im.opts), "the report of uninitialized variables", (*b)->actor,
      im.opts.timeout, [](variable_info& i) { return std::move(i); }, info_atom::value);
    if (!info && is(info.error(), af_error::cancelled))
      return std::move(info.error());
    if (!info)
      return im.link.explain(std::move(info.error()), "state of '" + n.spec.name + "'", nullptr);
    if (!info->initialized)
      out.push_back(n.spec.name);
  }
  return out;
}

caf::error session::wait_initialized(std::chrono::milliseconds timeout,
                                     const std::vector<output>& vars, const std::string& run_id) {
  auto& im = *impl_;
  auto list = im.variables_of(vars);
  if (!list)
    return std::move(list.error());
  // All requests are in flight at once and share one deadline; each variable
  // drops its waiter at the same deadline, so nothing is left parked. A
  // helper actor makes them and collects the answers, so that the wait can
  // watch the session's cancel flag (Ctrl-C) in 20 ms slices.
  std::vector<variable_actor> actors;
  for (auto v : *list) {
    auto b = im.binding_of(v);
    if (!b)
      return std::move(b.error());
    actors.push_back((*b)->actor);
  }
  using answers = std::vector<caf::error>; // per variable: none, or why not
  auto r = std::make_shared<pending_reply<answers>>();
  auto got = std::make_shared<answers>(actors.size());
  auto left = std::make_shared<size_t>(actors.size());
  auto helper = im.sys.spawn([r, got, left, actors, timeout, run_id](caf::event_based_actor* a) {
    if (actors.empty())
      return r->settle(*got);
    for (size_t i = 0; i < actors.size(); ++i) {
      auto one = [r, got, left, i](caf::error e) {
        (*got)[i] = std::move(e);
        if (--*left == 0)
          r->settle(*got);
      };
      a->request(actors[i], timeout + std::chrono::milliseconds{200}, wait_init_atom::value,
                 run_id, static_cast<uint32_t>(timeout.count()))
        .then([one](uint64_t) { one(caf::none); }, [one](caf::error& e) { one(std::move(e)); });
    }
  });
  auto all = r->wait(cancel_flag(im.opts), helper,
                     "the wait for initialization");
  if (!all)
    return std::move(all.error());
  std::vector<std::string> missing;
  caf::error other;
  for (size_t i = 0; i < list->size(); ++i) {
    auto& e = (*all)[i];
    if (!e)
      continue;
    const auto& n = im.g.at((*list)[i]);
    if (e == caf::sec::request_timeout || is(e, af_error::timeout))
      missing.push_back(n.spec.name + " (on " + n.spec.device + ")");
    else if (!other)
      other = im.link.explain(std::move(e), "initialization of '" + n.spec.name + "'", nullptr);
  }
  if (!missing.empty()) {
    std::string names;
    for (const auto& m : missing)
      names += (names.empty() ? "" : ", ") + m;
    return make_error(af_error::timeout,
                      "waited " + std::to_string(timeout.count()) + " ms for initialization of "
                        + std::to_string(missing.size()) + " variable(s)"
                        + (run_id.empty() ? "" : " by run '" + run_id + "'") + ": " + names
                        + "; is the chief running initialize()?");
  }
  return other;
}

} // namespace af
