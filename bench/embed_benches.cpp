// The sparse lines' registration and helpers (embed_benches.hpp).
#include "bench/embed_benches.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "bench/bench_train.hpp"
#include "bench/embed_raw.hpp"

namespace af::bench {

const std::vector<std::string>& embed_metrics() {
  static const std::vector<std::string> names{"embed_lookup_512_3ps_tcp", "train_embed_10m_2w"};
  return names;
}

int run_embed_benches(const wanted_fn& wanted) {
  if (wanted("embed_lookup_512_3ps_tcp"))
    if (int rc = embed_detail::lookup_bench())
      return rc;
  if (wanted("train_embed_10m_2w"))
    if (int rc = embed_detail::train_bench())
      return rc;
  return 0;
}

int run_embed_helper(int argc, char** argv) {
  if (argc < 3 || std::strcmp(argv[1], helper_flag) != 0)
    return -1;
  std::string role = argv[2];
  if (role != "embed-shard" && role != "embed-worker")
    return -1;
  auto a = helper_args::parse(argc, argv, 3);
  return role == "embed-shard" ? embed_shard_main(a) : embed_worker_main(a);
}

} // namespace af::bench
