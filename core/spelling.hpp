#pragma once
/// "Did you mean ...?" for names a user typed (config keys, REPL names).
/// No CAF.

#include <cstddef>
#include <string>
#include <vector>

namespace af {

/// Levenshtein distance: insertions, deletions and substitutions.
size_t edit_distance(const std::string& a, const std::string& b);

/// The candidate with the fewest edits from `name` (the first of equals),
/// or "" if none is within `max_edits`. Candidates whose length alone is
/// further off are skipped without computing a distance, so a very long
/// typed name costs little.
std::string closest(const std::string& name, const std::vector<std::string>& candidates,
                    size_t max_edits);

} // namespace af
